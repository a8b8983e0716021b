"""Contiguous extents of a linear pool: the memory model of pre-paging engines.

Before PagedAttention, an engine (FasterTransformer, Orca, the first HF TGI) gave each admitted
sequence one contiguous KV buffer. Buffers of different sizes come and go, so the free space
becomes a set of holes between live buffers: enough free memory in total may exist while no hole
is large enough for the next buffer (external fragmentation)::

    pool:  [AAAA....BBBBBB..CCC.....]     free = 4 + 2 + 5 = 11 units
                ^^^^      ^^   ^^^^^      a 6-unit buffer does not fit anywhere

The free holes are two sorted arrays (starts, lengths); a freed extent coalesces with its
neighbours. Placement is **first fit** (lowest address whose hole is large enough; Knuth's
classic, what a bump/free-list allocator does) or **best fit** (the smallest hole that is large
enough, ties to the lowest address; less splitting of large holes). Both are O(holes) per call,
with one hole per live buffer at most plus one. The rules are kernels (``extent_*`` in
:mod:`servesim.kv.kernels`, used by the static allocator); :class:`ExtentAllocator` is their
Python face, standalone or as a view of a static pool's holes.
"""

from __future__ import annotations

import numpy as np

from servesim.kv.kernels import BEST, FIRST, FITS, RELEASE_OVERLAP, KVState, check_message, holes, scalars
from servesim.kv.kernelset import kernel_set


class ExtentAllocator:
    def __init__(self, size: int, fit: str = "first", pure: bool = False):
        if fit not in FITS:
            raise ValueError(f"fit {fit!r} is not 'first' or 'best'")
        self.size = int(size)
        self.fit = fit
        cap = self.size // 2 + 1  # holes are separated by at least one used unit
        self.hole_start = np.zeros(cap, dtype=np.int64)
        self.hole_len = np.zeros(cap, dtype=np.int64)
        self.s = scalars(self.size)
        if self.size > 0:
            self.hole_len[0] = self.size
            self.s[0].nholes = 1
        self._k = kernel_set(pure)

    @classmethod
    def view(cls, kv: KVState, pure: bool = False) -> "ExtentAllocator":
        """The holes of a static pool (shared, not copied)."""
        ex = cls.__new__(cls)
        ex.size, ex.fit = kv.num_blocks, "first" if kv.fit == FIRST else "best"
        ex.hole_start, ex.hole_len, ex.s = kv.hole_start, kv.hole_len, kv.s
        ex._k = kernel_set(pure)
        return ex

    @property
    def free(self) -> int:
        return int(self.s[0].free)

    def alloc(self, n: int) -> int:
        """Start of a new extent of ``n`` units, or -1 when no hole is large enough."""
        if n <= 0:
            raise ValueError(f"extent length {n} must be >= 1")
        fit = FIRST if self.fit == "first" else BEST
        return int(self._k.extent_alloc(self.hole_start, self.hole_len, self.s, fit, n))

    def release(self, start: int, n: int) -> None:
        """Return ``[start, start + n)`` and merge it with adjacent holes."""
        code = self._k.extent_release(self.hole_start, self.hole_len, self.s, start, n)
        if code == RELEASE_OVERLAP:
            raise AssertionError(f"extent [{start}, {start + n}) overlaps a free hole")
        if code:
            raise AssertionError(f"no room for another free hole releasing [{start}, {start + n})")

    @property
    def largest(self) -> int:
        return int(self._k.extent_largest(self.hole_len, self.s))

    def unusable(self, n: int) -> int:
        """Free units in holes smaller than ``n``: free memory that cannot hold an ``n``-unit extent."""
        return int(self._k.extent_unusable(self.hole_len, self.s, n))

    def holes(self) -> list[tuple[int, int]]:
        return holes(self)

    def check(self) -> None:
        code = self._k.extents_check(self.hole_start, self.hole_len, self.s, self.size)
        if code:
            raise AssertionError(check_message(self, int(code)))
