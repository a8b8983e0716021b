"""numpy's own arithmetic, element by element, as kernels: ``ndarray.sum`` of floats
(:func:`np_sum`: pairwise summation, bit for bit), ``np.interp`` at one point (:func:`interp_at`),
and a pack curve with its linear tail (:func:`curve_at`, :func:`tail_at`). The step-time kernels
(:mod:`servesim.perf.kernels`) are built on them; see its module doc for why bit for bit.
"""

import numpy as np

from servesim.jit import bisect_right, kernel


@kernel
def pairwise_block(a, lo, n):
    """numpy's pairwise_sum for ``n <= 128`` elements ``a[lo:lo + n]``: in order under 8, else
    8 running partial sums combined as a tree, then the remainder in order."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    end = n - n % 8
    while i < end:
        r0 += a[lo + i]
        r1 += a[lo + i + 1]
        r2 += a[lo + i + 2]
        r3 += a[lo + i + 3]
        r4 += a[lo + i + 4]
        r5 += a[lo + i + 5]
        r6 += a[lo + i + 6]
        r7 += a[lo + i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


@kernel
def np_sum(a, n):
    """``a[:n].sum()`` for float64, bit for bit: numpy adds its pairwise sum (halves split at a
    multiple of 8 above 128 elements) to the reduction's identity 0.0. The recursion runs on an
    explicit stack (numba does not compile this self-recursion)."""
    if n <= 128:
        return 0.0 + pairwise_block(a, 0, n)
    los = np.empty(128, np.int64)  # pending nodes: start, length, halves already summed?
    lens = np.empty(128, np.int64)
    done = np.empty(128, np.bool_)
    vals = np.empty(128)  # sums of finished nodes, left below right
    top = 0
    nv = 0
    los[0], lens[0], done[0] = 0, n, False
    while top >= 0:
        lo, m, d = los[top], lens[top], done[top]
        top -= 1
        if m <= 128:
            vals[nv] = pairwise_block(a, lo, m)
            nv += 1
        elif d:
            vals[nv - 2] = vals[nv - 2] + vals[nv - 1]
            nv -= 1
        else:
            m2 = m // 2
            m2 -= m2 % 8
            los[top + 1], lens[top + 1], done[top + 1] = lo, m, True
            los[top + 2], lens[top + 2], done[top + 2] = lo + m2, m - m2, False
            los[top + 3], lens[top + 3], done[top + 3] = lo, m2, False
            top += 3
    return 0.0 + vals[0]


@kernel
def interp_at(q, x, y):
    """``np.interp(q, x, y)`` at one point (``x`` increasing, finite values), bit for bit."""
    n = x.shape[0]
    if np.isnan(q):
        return q
    if n == 1 or q <= x[0]:  # below the grid: the first value (np.interp's default ``left``)
        return y[0]
    if q >= x[n - 1]:
        return y[n - 1]
    j = bisect_right(x, q) - 1
    if x[j] == q:
        return y[j]
    slope = (y[j + 1] - y[j]) / (x[j + 1] - x[j])
    r = slope * (q - x[j]) + y[j]
    if np.isnan(r):
        r = slope * (q - x[j + 1]) + y[j + 1]
        if np.isnan(r) and y[j] == y[j + 1]:
            r = y[j]
    return r


@kernel
def curve_at(q, xy, slope):
    """A (linear) :class:`~servesim.perf.packtables.Curve` at ``q``: its linear tail above the
    last grid point, ``np.interp`` through the grid (``xy`` rows: x, y) below."""
    n = xy.shape[1]
    if q > xy[0, n - 1]:
        return xy[1, n - 1] + slope * (q - xy[0, n - 1])
    return interp_at(q, xy[0], xy[1])


@kernel
def tail_at(tails, row, q):
    """A curve's linear tail (row of ``pk_tails``: x_last, y_last, slope) at ``q`` beyond x_last."""
    return tails[row, 1] + tails[row, 2] * (q - tails[row, 0])
