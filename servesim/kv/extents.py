"""The static allocator's free holes as kernels: place a reservation (first or best fit), release
one (merging neighbours), and the measures and checks of the hole list (``kv.hole_start`` /
``kv.hole_len[:nholes]``, :mod:`servesim.kv.pool`)."""

from __future__ import annotations

from servesim.jit import bisect_left, kernel
from servesim.kv.pool import BAD_EXTENTS, EXTENTS_SUM, FIRST, OK, RELEASE_FULL, RELEASE_OVERLAP


@kernel
def extent_alloc(hole_start, hole_len, sc, fit, n):
    """Start of a new extent of ``n >= 1`` blocks taken from the free holes, or -1 when no hole
    is large enough. First fit: the lowest hole that is large enough; best fit: the smallest,
    ties to the lowest address. Holes stay sorted by start."""
    s = sc[0]
    nh = s.nholes
    i = -1
    if fit == FIRST:
        for j in range(nh):
            if hole_len[j] >= n:
                i = j
                break
    else:
        best = -1
        for j in range(nh):
            if hole_len[j] >= n and (best < 0 or hole_len[j] < best):
                best = hole_len[j]
                i = j
    if i < 0:
        return -1
    start = hole_start[i]
    if hole_len[i] == n:
        _drop_hole(hole_start, hole_len, sc, i)
    else:
        hole_start[i] += n
        hole_len[i] -= n
    s.free -= n
    return start


@kernel(inline=True)
def _drop_hole(hole_start, hole_len, sc, i):
    """Remove hole ``i`` from the sorted hole list (``sc[0].nholes`` holes)."""
    nh = sc[0].nholes
    for j in range(i, nh - 1):
        hole_start[j] = hole_start[j + 1]
        hole_len[j] = hole_len[j + 1]
    sc[0].nholes = nh - 1


@kernel
def extent_release(hole_start, hole_len, sc, start, n):
    """Return ``[start, start + n)`` to the free holes, merged with adjacent ones. 0, or
    RELEASE_OVERLAP (it overlaps a free hole) / RELEASE_FULL, and then nothing changes."""
    s = sc[0]
    nh = s.nholes
    i = bisect_left(hole_start[:nh], start)
    if i > 0 and hole_start[i - 1] + hole_len[i - 1] > start:
        return RELEASE_OVERLAP
    if i < nh and start + n > hole_start[i]:
        return RELEASE_OVERLAP
    merge_left = i > 0 and hole_start[i - 1] + hole_len[i - 1] == start
    merge_right = i < nh and hole_start[i] == start + n
    if merge_left and merge_right:
        hole_len[i - 1] += n + hole_len[i]
        _drop_hole(hole_start, hole_len, sc, i)
    elif merge_left:
        hole_len[i - 1] += n
    elif merge_right:
        hole_start[i] = start
        hole_len[i] += n
    else:
        if nh == len(hole_start):
            return RELEASE_FULL
        for j in range(nh, i, -1):
            hole_start[j] = hole_start[j - 1]
            hole_len[j] = hole_len[j - 1]
        hole_start[i] = start
        hole_len[i] = n
        s.nholes = nh + 1
    s.free += n
    return 0


@kernel
def extent_unusable(hole_len, sc, n):
    """Free blocks in holes smaller than ``n``: free memory that cannot hold an ``n``-block extent."""
    s = sc[0]
    total = 0
    for j in range(s.nholes):
        if hole_len[j] < n:
            total += hole_len[j]
    return total


@kernel
def extent_largest(hole_len, sc):
    s = sc[0]
    best = 0
    for j in range(s.nholes):
        if hole_len[j] > best:
            best = hole_len[j]
    return best


@kernel
def extents_check(hole_start, hole_len, sc, size):
    """OK, or BAD_EXTENTS / EXTENTS_SUM (see the codes)."""
    s = sc[0]
    nh = s.nholes
    if nh < 0 or nh > len(hole_start):
        return BAD_EXTENTS
    prev_end = -1
    total = 0
    for j in range(nh):
        if hole_len[j] <= 0 or hole_start[j] <= prev_end or hole_start[j] + hole_len[j] > size:
            return BAD_EXTENTS
        prev_end = hole_start[j] + hole_len[j]
        total += hole_len[j]
    if total != s.free:
        return EXTENTS_SUM
    return OK
