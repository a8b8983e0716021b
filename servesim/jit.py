"""One source, two engines: kernels compiled with numba, or run as plain Python.

Every rule of a replica's per-step work (KV allocation, scheduling policies, iteration progress,
step times) is written once, as a plain function over arrays and small records, and decorated
with :func:`kernel`. Called normally, a kernel runs compiled (numba, cached on disk). The
*reference* engine is the same source uncompiled: :func:`pure` returns the original Python
function with every kernel it calls replaced, recursively, by its own pure version -- so the two
engines agree by construction, and there is no second copy of any rule to keep in step.

``pure(f, overrides)`` can also bind some callees to other Python callables: that is how
object-level extensions (a prefix-cache KV manager, a user's step-time model or policy part, an
iteration hook) plug into the same source on the uncompiled path.

Caching: numba's on-disk cache checks only the source file of the function it compiled, not the
files of the kernels that function inlined. So that an edit to any kernel module invalidates
every cached kernel, the cache lives in a folder named by a hash of all kernel modules' sources
(:data:`KERNEL_MODULES`, servesim/kernel_cache.py; a kernel defined elsewhere is an error at import).

Plain mode: a process that will run the ahead-of-time engine (servesim/aot.py) asks, before this
module is imported, not to load numba at all. Each kernel is then left its Python function
(listed in ``_PLAIN_KERNELS`` so :func:`pure` still rebuilds and rebinds it), and no StructRef
type exists (:func:`struct_ref` returns Nones): only the uncompiled path and the extension run.
"""

from __future__ import annotations

import functools
import types
from pathlib import Path
from typing import Any, Callable

from servesim import aot
from servesim.kernel_cache import KERNEL_MODULES, _PKG, cache_dir

PLAIN = aot.plain_requested()  # (see the module docstring)
_PLAIN_KERNELS: set = set()


def _configure_numba():
    """Point numba's on-disk cache at the folder keyed by the kernels' sources (before any kernel
    is declared: numba fixes a function's cache location when it is decorated)."""
    import numba

    if cache_dir():
        numba.config.CACHE_DIR = cache_dir()
    if not numba.config.DISABLE_JIT:
        _load_cached_code_without_registries()
    return numba


def _load_cached_code_without_registries() -> None:
    """Let numba load a cached kernel without first installing every implementation it has.

    Before it reads a function from its on-disk cache, numba refreshes its target context: it
    imports and registers the lowering of all of Python and NumPy it supports (~60 modules, and
    ``scipy.linalg`` for a BLAS probe) -- 0.2-0.4 s, a third of a small run's whole process, spent
    on code that is already compiled. Loading cached code needs only numba's runtime (NRT: the
    allocator symbols the code links against), so that is what is initialised here. Compiling
    still refreshes the context first (numba's compiler does so itself), and a lowering looked
    up later refreshes it on demand (``BaseContext.get_function``), so nothing that compiles can
    miss a registry. numba's own loading code runs as it is, with the refresh made a no-op for
    that call (numba holds its compiler lock meanwhile, so no other thread compiles)."""
    try:
        from numba.core.caching import Cache
        from numba.core.runtime import rtsys
    except ImportError:  # pragma: no cover - another numba layout
        return
    load = Cache.load_overload

    def load_overload(self, sig, target_context):
        rtsys.initialize(target_context)
        outer = "refresh" in vars(target_context)  # a load within a load: the outer one restores
        if not outer:
            target_context.refresh = _no_refresh  # shadows the method for this call only
        try:
            return load(self, sig, target_context)
        finally:
            if not outer:
                del target_context.refresh

    Cache.load_overload = load_overload


def _no_refresh() -> None:
    pass


_numba = None if PLAIN else _configure_numba()
# (plain mode: a class nothing is an instance of, so ``isinstance(k, Dispatcher)`` stays a valid test)
Dispatcher = _numba.core.registry.CPUDispatcher if _numba is not None else type("NoDispatcher", (), {})


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
    if _numba is None:
        _PLAIN_KERNELS.add(fn)
        return fn
    if inline:
        return _numba.njit(cache=True, inline="always")(fn)
    return _numba.njit(cache=True)(fn)


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


if _numba is not None:
    class FieldStruct(_numba.core.types.StructRef):
        """Base of servesim's StructRef types (one pointer per kernel call instead of a NamedTuple's
        every field): fields typed as given, literals widened (a field first set from a constant
        must still take any value of its type)."""

        def preprocess_fields(self, fields):
            return tuple((name, _numba.core.types.unliteral(typ)) for name, typ in fields)


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
    binds them to globals of these names (numba pickles a type by its module and name). In plain
    mode there is no compiled engine to build them for: ``(None, None, None)``."""
    if _numba is None:
        return None, None, None
    from numba.experimental import structref

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
    if isinstance(k, Dispatcher):
        return k.py_func
    if isinstance(k, types.FunctionType) and k in _PLAIN_KERNELS:
        return k
    return None
