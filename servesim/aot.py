"""The replica loop compiled ahead of time: an extension module a run loads without numba.

A warm ``servesim run`` of 10k requests spent most of its time before the first simulated
iteration: importing numba (~0.3 s), declaring the kernels' ~200 dispatchers (~0.1 s) and loading
the compiled engine from numba's disk cache (~0.25 s) -- all to call one function. So the build
of the compiled engine (``servesim warm``, or the background build a cold machine starts) also
compiles that function ahead of time, with numba's ``pycc``, into an extension module kept beside
numba's cache (the same folder, keyed by the kernels' sources: an edit or a new install builds a
new one). A CLI run of one replica imports it (~1 ms) instead of numba: the kernels are then their
plain Python functions (:mod:`servesim.jit`'s plain mode), which run only where a run takes the
Python engine anyway (a prefix cache, a user's policy).

Same source, same compiler: the module is numba's code for ``engine.kernel.advance_tuples``
(which builds the state's and pool's StructRefs and calls ``advance``), so it agrees with the
JIT-compiled engine bit for bit (tests/test_aot.py). An extension cannot check the types of what
it is given, so the build records the exact structure of the arguments it was compiled for
(:func:`layout`: every NamedTuple field, every array's dtype, rank and memory layout) and a replica
calls the module only when its own arguments have that structure; otherwise it runs the same
source as Python and says why in the header.

Building needs a C compiler (the module links numba's runtime, compiled from the C sources numba
ships). Without one, or should ``pycc`` go, runs keep the JIT-compiled engine: nothing is lost but
the start-up time.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

from servesim import kernel_cache

MODULE = "servesim_engine_aot"
FORMAT = 1  # of the module servesim.warmup builds (what it exports, how): one of another is rebuilt
_plain = False
_loaded: dict = {}


# ----------------------------------------------------------------------------- plain mode
def request_plain() -> bool:
    """Ask that this process run without numba (kernels as plain Python, the replica loop from
    the ahead-of-time module). Only before :mod:`servesim.jit` is imported; True if granted."""
    global _plain
    if "servesim.jit" in sys.modules:
        return plain_requested()
    _plain = True
    return True


def plain_requested() -> bool:
    return _plain


# ----------------------------------------------------------------------------- the module
def paths() -> tuple[Path, Path] | None:
    """(the module's file, its record aot.json) in this version's cache folder; None: no folder."""
    d = kernel_cache.cache_dir()
    if not d:
        return None
    return Path(d) / (MODULE + importlib.machinery.EXTENSION_SUFFIXES[0]), Path(d) / "aot.json"


def available() -> bool:
    """An ahead-of-time engine of this file's :data:`FORMAT` is built for these sources (its
    arguments are checked against a run's only when the run starts)."""
    p = paths()
    if p is None or not p[0].is_file():
        return False
    try:
        return json.loads(p[1].read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def state() -> str:
    """``built``, ``failed`` (to build: AOT_FAILED says why), ``missing`` (not built yet) or
    ``none`` (no writable cache folder)."""
    p = paths()
    if p is None:
        return "none"
    if available():
        return "built"
    return "failed" if p[1].with_name("AOT_FAILED").is_file() else "missing"


def status() -> str:
    """:func:`state` as a line for people."""
    st = state()
    if st == "built":
        return f"ahead-of-time engine built ({paths()[0]})"
    if st == "failed":
        return "the ahead-of-time engine could not be built: " + paths()[1].with_name("AOT_FAILED").read_text().strip()
    if st == "none":
        return "no cache folder is writable: no ahead-of-time engine"
    return "the ahead-of-time engine is not built"


def layout(x) -> str:
    """The structure numba would type ``x`` by, as a string: NamedTuples field by field, arrays
    by dtype, rank, memory layout, writability and alignment, scalars by type. Two arguments
    with the same layout are the same numba type, so compiled code built for one reads the
    other correctly."""
    if isinstance(x, tuple):
        name = f"{type(x).__module__}.{type(x).__qualname__}" if hasattr(x, "_fields") else ""
        return name + "(" + ",".join(layout(v) for v in x) + ")"
    if isinstance(x, np.ndarray):
        order = "C" if x.flags.c_contiguous else "F" if x.flags.f_contiguous else "A"
        flags = ("" if x.flags.writeable else "r") + ("" if x.flags.aligned else "u")
        return f"a[{_dtype(x.dtype)},{x.ndim},{order}{flags}]"
    if isinstance(x, np.void):
        return f"rec[{_dtype(x.dtype)}]"
    if isinstance(x, np.generic):
        return x.dtype.str
    if isinstance(x, (bool, int, float)):
        return type(x).__name__
    raise TypeError(f"no ahead-of-time layout for {type(x).__name__}")


def _dtype(dt: np.dtype) -> str:
    return f"{dt.descr}{'+a' if dt.isalignedstruct else ''}" if dt.names else dt.str


def _load():
    """(module, the layout it was built for), or (None, why); once per process."""
    if "m" not in _loaded:
        _loaded["m"] = _import()
    return _loaded["m"]


def _import():
    p = paths()
    if p is None or not available():
        return None, "the ahead-of-time engine is not built"
    so, meta = p
    try:
        layout_built = json.loads(meta.read_text())["layout"]  # (the record first: no module loads without it)
        spec = importlib.util.spec_from_file_location(MODULE, so)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    except (OSError, ValueError, ImportError, KeyError, TypeError) as exc:  # (a damaged record or module)
        return None, f"the ahead-of-time engine did not load ({type(exc).__name__}: {exc})"
    return mod, layout_built


def entry(cfg, st, kv, tab):
    """``(advance(cfg, st, kv, tab, until), "")`` from the ahead-of-time module when these
    arguments have the layout it was built for, else ``(None, why)``."""
    mod, built = _load()
    if mod is None:
        return None, built
    mine = layout((cfg, st, kv, tab))
    if mine != built:
        return None, "this run's arrays differ from those the ahead-of-time engine was built for"
    return mod.advance, ""
