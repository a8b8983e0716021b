"""The KV kernels as Python callers get them: compiled, bound to one pool, or uncompiled.

:class:`KernelSet` holds the entry kernels of :mod:`servesim.kv.kernels`, compiled or rebuilt
as plain Python (``servesim.jit.pure``, the reference engine's path). Python objects calling a
small kernel many times (the allocator classes) :meth:`~KernelSet.bind` it to their pool: numba's
dispatcher would otherwise type the KVState argument on its slow path at every call.
"""

from __future__ import annotations

import numpy as np

from servesim import jit
from servesim.kv import kernels

ENTRY_POINTS = ("kv_allocate", "kv_allocate_decodes", "kv_free", "kv_decode_run", "kv_run_used",
                "kv_commit_decodes", "kv_step_usage", "kv_usage", "kv_check", "kv_max_slots",
                "kv_blocks_needed", "kv_free_blocks", "kv_used_blocks", "extent_alloc", "extent_release",
                "extent_unusable", "extent_largest", "extents_check")


# argument kinds of the entry kernels the Python classes call, for KernelSet.bind:
# k the state, c the request column, i an integer, a an int64 array, o a float64 (rows, k) array
_ARGS = {
    "kv_allocate": "kcii", "kv_allocate_decodes": "kcai", "kv_free": "ki", "kv_decode_run": "kcaiia",
    "kv_run_used": "kcaiia", "kv_commit_decodes": "kcai", "kv_step_usage": "kcaiaaiiao", "kv_usage": "kcaia",
    "kv_check": "kcai", "kv_max_slots": "k", "kv_blocks_needed": "ki",
}


class KernelSet:
    """The entry kernels, compiled or as plain Python (``servesim.jit.pure``): what the Python
    allocator objects call. Shared by every object (copies of an object share it too)."""

    def __init__(self, pure: bool):
        from servesim.jit import pure as make_pure

        self.pure = pure
        for name in ENTRY_POINTS:
            k = getattr(kernels, name)
            setattr(self, name, make_pure(k) if pure else k)

    def bind(self, state: kernels.KVState, computed: np.ndarray):
        """The ``kv_*`` kernels of :data:`_ARGS` for one pool and request column. Compiled, each
        is the machine-code entry point for exactly these argument types, resolved once: numba's
        dispatcher types a NamedTuple argument on its slow path (~3 us a call, several times the
        work of a small kernel). The entry point does not check argument types, so callers must
        pass exactly ``state``, ``computed``, Python or numpy integers, contiguous int64 arrays
        and C-ordered float64 2-d arrays where :data:`_ARGS` says so."""
        if self.pure or jit.PLAIN:  # (plain mode: the kernels are Python functions already)
            return self
        from types import SimpleNamespace

        from numba import typeof, types

        kinds = {"k": typeof(state), "c": typeof(computed), "i": types.int64, "a": types.int64[::1],
                 "o": types.float64[:, ::1]}
        if kinds["c"] != types.Array(typeof(computed).dtype, 1, "C"):
            raise ValueError(f"the computed column must be a contiguous 1-d array, got {kinds['c']}")
        bound = SimpleNamespace()
        for name, spec in _ARGS.items():
            disp = getattr(self, name)
            sig = tuple(kinds[ch] for ch in spec)
            disp.compile(sig)
            setattr(bound, name, disp.overloads[sig].entry_point)
        return bound

    def __deepcopy__(self, memo):
        return self

    def __copy__(self):
        return self

    def __reduce__(self):
        return kernel_set, (self.pure,)


_SETS: dict[bool, KernelSet] = {}


def kernel_set(pure: bool = False) -> KernelSet:
    if pure not in _SETS:
        _SETS[pure] = KernelSet(pure)
    return _SETS[pure]
