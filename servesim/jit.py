"""One source, two engines: kernels compiled with numba, or run as plain Python.

Every rule of a replica's per-step work (KV allocation, scheduling policies, iteration progress,
step times) is written once, as a plain function over arrays and small records, and decorated
with :func:`kernel`. Called normally, a kernel runs compiled (``numba.njit(cache=True)``). The
*reference* engine is the same source uncompiled: :func:`pure` returns the original Python
function with every kernel it calls replaced, recursively, by its own pure version -- so the two
engines agree by construction, and there is no second copy of any rule to keep in step.

``pure(f, overrides)`` can also bind some callees to other Python callables: that is how
object-level extensions (a prefix-cache KV manager, a user's step-time model or policy part, an
iteration hook) plug into the same source on the uncompiled path.

Caching: numba's on-disk cache checks only the source file (path and modification stamp) of the
function it compiled, not the files of the kernels that function inlined. So that an edit to any
kernel module invalidates every cached kernel, the cache lives in a folder named by a hash of all
kernel modules (:data:`KERNEL_MODULES`: their bytes, paths and stamps, as numba's own index keys
them; a kernel defined elsewhere is an error at import). :func:`compiled_ready` tells whether the
replica loop is in that folder, so a first run on a machine can choose to compile now or run the
reference engine (servesim/simulate.py ``python_reasons``).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import time
import types
from pathlib import Path
from typing import Any, Callable

import numba
from numba.experimental import structref

from servesim.diskmemo import cache_bases

# modules that define kernels, relative to the package folder; their sources key the cache
KERNEL_MODULES = (
    "jit.py",
    "kv/pool.py",
    "kv/extents.py",
    "kv/kernels.py",
    "kv/runs.py",
    "kv/dlist.py",
    "kv/ptiers.py",
    "kv/pqueue.py",
    "kv/pcache.py",
    "kv/resident.py",
    "kv/radix.py",
    "kv/pcheck.py",
    "perf/arith_kernels.py",
    "perf/lattice_kernels.py",
    "perf/kernels.py",
    "perf/roofline_kernels.py",
    "sched/state.py",
    "sched/queues.py",
    "sched/parts.py",
    "sched/reserve.py",
    "sched/policies.py",
    "engine/iheap.py",
    "engine/inbox.py",
    "engine/delivery.py",
    "engine/kernel_checks.py",
    "engine/kernel.py",
    "engine/load_kernels.py",
    "engine/slots.py",
    "engine/fleet_loop.py",
)
_PKG = Path(__file__).resolve().parent
UNUSED_DAYS = 14  # a cache folder no process has used this long is removed (each is ~200 MB)


def _source_hash() -> str:
    """The kernel modules' bytes, paths and modification stamps (numba's index keys each file
    by path and stamp: a copy elsewhere, a new venv, or a touched file recompiles, so it gets a
    folder of its own and :func:`compiled_ready` never speaks for code numba would recompile)."""
    h = hashlib.sha256()
    for rel in KERNEL_MODULES:
        p = _PKG / rel
        if p.is_file():
            h.update(f"{rel}\0{p}:{p.stat().st_mtime_ns}\0".encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _cache_dir() -> str:
    """A writable folder for this version's compiled kernels (``""``: none; numba picks its own).
    Marks it used now and removes siblings unused for :data:`UNUSED_DAYS` (old versions)."""
    for root in (base / "servesim-numba" for base in cache_bases()):
        d = root / _source_hash()
        try:
            d.mkdir(parents=True, exist_ok=True)
            os.utime(d)  # (raises when the folder is not ours to write)
        except OSError:
            continue
        cutoff = time.time() - UNUSED_DAYS * 86400
        for sib in root.iterdir():
            try:
                if sib != d and sib.is_dir() and sib.stat().st_mtime < cutoff:
                    shutil.rmtree(sib, ignore_errors=True)
            except OSError:
                pass
        return str(d)
    return ""


# numba fixes a function's cache location when it is decorated: set it before any kernel is
CACHE_DIR = "" if os.environ.get("NUMBA_CACHE_DIR") else _cache_dir()
if CACHE_DIR:
    numba.config.CACHE_DIR = CACHE_DIR
Dispatcher = numba.core.registry.CPUDispatcher


def compiled_ready() -> bool:
    """Whether the replica loop (``engine.kernel.advance``, which compiles every kernel it calls)
    is in this version's cache folder: a run loads it in about a second instead of compiling for
    one to two minutes. Read from numba's index file names (``<module>.<function>-<line>...nbi``;
    tests/test_jit.py checks the convention against the numba installed). True with no folder
    of our own (numba's cache is then wherever ``NUMBA_CACHE_DIR`` says: nothing to tell)."""
    if not CACHE_DIR or numba.config.DISABLE_JIT:
        return True
    return any(Path(CACHE_DIR).rglob("kernel.advance-*.nbi"))


def kernel(fn: Callable | None = None, *, inline: bool = False):
    """Declare ``fn`` a kernel (see the module docstring): a numba dispatcher compiled on first
    call and cached on disk. Its module must be listed in :data:`KERNEL_MODULES`.

    ``@kernel(inline=True)`` for small helpers: numba inlines them into their callers' IR instead
    of compiling each as a module of its own (every compiled function costs ~0.3 s of numba's
    per-function work, which dominates a cold start of the whole engine)."""
    if fn is None:
        return lambda f: kernel(f, inline=inline)
    rel = _package_path(fn.__code__.co_filename)
    if rel not in KERNEL_MODULES:
        raise RuntimeError(f"kernel {fn.__qualname__} is defined in {rel}, which is not listed in "
                           f"servesim.jit.KERNEL_MODULES (the cache key would miss its edits)")
    if inline:
        return numba.njit(cache=True, inline="always")(fn)
    return numba.njit(cache=True)(fn)


@functools.lru_cache(maxsize=None)
def _package_path(filename: str) -> str:
    """``filename`` relative to the package folder (itself if outside), once per file: resolving
    a path costs ~0.1 ms, and ~200 kernels are declared on every start-up."""
    try:
        return str(Path(filename).resolve().relative_to(_PKG))
    except ValueError:
        return filename


@kernel(inline=True)
def bisect_right(a, q):
    """How many of sorted ``a`` are <= ``q``: ``np.searchsorted(a, q, side="right")`` for a scalar
    ``q`` that is not NaN (every caller's is finite or checked). Written out because numba's searchsorted lives in a module whose import (0.2 s, on
    every process that loads the cached engine) would cost more than the search ever does."""
    lo = 0
    hi = a.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        if q < a[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


@kernel(inline=True)
def bisect_left(a, q):
    """How many of sorted ``a`` are < ``q``: ``np.searchsorted(a, q, side="left")``, scalar ``q``
    not NaN (see :func:`bisect_right`)."""
    lo = 0
    hi = a.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < q:
            lo = mid + 1
        else:
            hi = mid
    return lo


class FieldStruct(numba.core.types.StructRef):
    """Base of servesim's StructRef types (one pointer per kernel call instead of a NamedTuple's
    every field): fields typed as given, literals widened (a field first set from a constant
    must still take any value of its type)."""

    def preprocess_fields(self, fields):
        return tuple((name, numba.core.types.unliteral(typ)) for name, typ in fields)


def struct_constructor(proxy: type, fields: list[str], name: str, module: str, filename: str):
    """A kernel ``name(*fields) -> proxy(*fields)``: numba builds a StructRef only inside compiled
    code, so every StructRef of the engine (the replica state, the KV pool) gets its constructor
    from here. Compiled from source naming each field (the StructRef constructor takes them
    positionally), attributed to the caller's module so that module keys its cache."""
    args = ", ".join(fields)
    ns: dict = {"_Proxy": proxy, "__name__": module}
    exec(compile(f"def {name}({args}):\n    return _Proxy({args})\n", filename, "exec"), ns)
    return kernel(ns[name])


def struct_ref(type_name: str, proxy_name: str, fields: list[str], constructor: str, module: str,
               filename: str) -> tuple:
    """``(type, proxy, constructor kernel)`` of one StructRef of the compiled engine: the replica
    state, the KV pool and a fleet's engine handle are each passed to kernels as one pointer
    rather than a NamedTuple numba would unbox field by field at every call. The caller's module
    binds them to globals of these names (numba pickles a type by its module and name)."""
    typ = structref.register(type(type_name, (FieldStruct,), {"__module__": module, "__qualname__": type_name}))
    proxy = type(proxy_name, (structref.StructRefProxy,), {"__module__": module, "__qualname__": proxy_name})
    structref.define_proxy(proxy, typ, fields)
    return typ, proxy, struct_constructor(proxy, fields, constructor, module, filename)


def pure(k: Callable, overrides: dict[Any, Callable] | None = None,
         _memo: dict | None = None) -> Callable:
    """The uncompiled version of kernel ``k``: its Python source with every kernel it calls
    replaced (recursively) by the pure version, and each kernel in ``overrides`` by the given
    callable. Functions are rebuilt from the same code objects: no source is copied."""
    overrides = overrides or {}
    memo = {} if _memo is None else _memo
    if k in overrides:
        return overrides[k]
    f = _source(k)
    if f is None:
        return k
    if k in memo:
        return memo[k]
    g: dict = {}
    new = types.FunctionType(f.__code__, g, f.__name__, f.__defaults__, f.__closure__)
    new.__qualname__ = f.__qualname__
    new.__doc__ = f.__doc__
    memo[k] = new
    for name, v in f.__globals__.items():
        g[name] = pure(v, overrides, memo) if _source(v) is not None else v
    return new


def _source(k) -> Callable | None:
    """The Python function behind kernel ``k`` (None: ``k`` is not a kernel)."""
    return k.py_func if isinstance(k, Dispatcher) else None
