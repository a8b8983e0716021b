"""Contiguous extents of a linear pool: the memory model of pre-paging engines.

Before PagedAttention, an engine (FasterTransformer, Orca, the first HF TGI) gave each admitted
sequence one contiguous KV buffer. Buffers of different sizes come and go, so the free space
becomes a set of holes between live buffers: enough free memory in total may exist while no hole
is large enough for the next buffer (external fragmentation)::

    pool:  [AAAA....BBBBBB..CCC.....]     free = 4 + 2 + 5 = 11 units
                ^^^^      ^^   ^^^^^      a 6-unit buffer does not fit anywhere

:class:`ExtentAllocator` keeps the free holes as two sorted arrays (starts, lengths), coalescing a
freed extent with its neighbours. Placement is **first fit** (lowest address whose hole is large
enough; Knuth's classic, what a bump/free-list allocator does) or **best fit** (the smallest hole
that is large enough, ties to the lowest address; less splitting of large holes). Both are O(holes)
per call, with one hole per live buffer at most plus one.
"""

from __future__ import annotations

import bisect


class ExtentAllocator:
    def __init__(self, size: int, fit: str = "first"):
        if fit not in ("first", "best"):
            raise ValueError(f"fit {fit!r} is not 'first' or 'best'")
        self.size = int(size)
        self.fit = fit
        self.starts: list[int] = [0] if size > 0 else []
        self.lengths: list[int] = [size] if size > 0 else []
        self.free = int(size)

    def alloc(self, n: int) -> int:
        """Start of a new extent of ``n`` units, or -1 when no hole is large enough."""
        if n <= 0:
            raise ValueError(f"extent length {n} must be >= 1")
        i = -1
        if self.fit == "first":
            for j, length in enumerate(self.lengths):
                if length >= n:
                    i = j
                    break
        else:
            best = None
            for j, length in enumerate(self.lengths):
                if length >= n and (best is None or length < best):
                    best, i = length, j
        if i < 0:
            return -1
        start = self.starts[i]
        if self.lengths[i] == n:
            del self.starts[i]
            del self.lengths[i]
        else:
            self.starts[i] += n
            self.lengths[i] -= n
        self.free -= n
        return start

    def release(self, start: int, n: int) -> None:
        """Return ``[start, start + n)`` and merge it with adjacent holes."""
        i = bisect.bisect_left(self.starts, start)
        if i > 0 and self.starts[i - 1] + self.lengths[i - 1] > start:
            raise AssertionError(f"extent [{start}, {start + n}) overlaps a free hole")
        if i < len(self.starts) and start + n > self.starts[i]:
            raise AssertionError(f"extent [{start}, {start + n}) overlaps a free hole")
        merge_left = i > 0 and self.starts[i - 1] + self.lengths[i - 1] == start
        merge_right = i < len(self.starts) and self.starts[i] == start + n
        if merge_left and merge_right:
            self.lengths[i - 1] += n + self.lengths[i]
            del self.starts[i]
            del self.lengths[i]
        elif merge_left:
            self.lengths[i - 1] += n
        elif merge_right:
            self.starts[i] = start
            self.lengths[i] += n
        else:
            self.starts.insert(i, start)
            self.lengths.insert(i, n)
        self.free += n

    @property
    def largest(self) -> int:
        return max(self.lengths, default=0)

    def unusable(self, n: int) -> int:
        """Free units in holes smaller than ``n``: free memory that cannot hold an ``n``-unit extent."""
        return sum(length for length in self.lengths if length < n)

    def holes(self) -> list[tuple[int, int]]:
        return list(zip(self.starts, self.lengths))

    def check(self) -> None:
        prev_end = -1
        for s, length in zip(self.starts, self.lengths):
            if length <= 0 or s <= prev_end or s + length > self.size:
                raise AssertionError(f"bad free extent list {self.holes()}")
            prev_end = s + length
        if sum(self.lengths) != self.free:
            raise AssertionError("free extents do not add up to the free count")
