"""Many recorders' step buffers folded in one compiled pass, bit for bit as :meth:`Recorder._fold`.

A fleet ends with every engine's last buffer folded into its recorder (engine/fleet_finish.py).
A fleet engine's buffer is sized to its share of the run, so that last fold holds most of its
steps: at 1,024 replicas and 200,000 requests, 1.8M steps in 1,024 folds of ~50 numpy calls each,
0.36-0.44 CPU s of a ~5 s run (benchmarks/RESULTS.md). :func:`fold_recorders` folds them all in
one call of :func:`_fold_all` (0.2-0.3 s with the Python around it; the steps' arrays are cold by
then), which does, engine by engine, the float operations numpy does in
``Recorder._fold`` (metrics/collect.py) in the same order, so every recorder ends with the same
bits: the step durations' sum is numpy's pairwise sum (``_pairwise``, numpy 2.x
``loops_utils.h.src`` ``pairwise_sum``), cumulative sums run left to right (``np.cumsum``), and
each bin edge is read as ``np.interp`` reads it (``_interp_at``: numpy ``compiled_base.c``
``arr_interp``: the last knot at or below ``x``, its value when ``x`` is a knot, else slope times
offset plus value). ``tests/test_fold_batch.py`` holds the two equal on drawn buffers.

The kernel calls no servesim kernel, so numba's own cache key (this file's path and stamp)
covers it: it is not one of ``servesim.jit.KERNEL_MODULES``, and an edit here does not recompile
the engine.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

from servesim import jit  # (sets numba's cache folder before the decorator below)

N_SIGNALS = 8  # BinnedSeries.SIGNALS
_WAITING = 2  # the signal arrivals during a step add to (BinnedSeries.add_arrival_waits)


@intrinsic
def _f8(typingctx, addr):
    """The float64 array data at address ``addr`` (a pointer for ``numba.carray``)."""
    ptr = types.CPointer(types.float64)

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(ptr))
    return ptr(types.int64), codegen


@intrinsic
def _i8(typingctx, addr):
    """The int64 array data at address ``addr``."""
    ptr = types.CPointer(types.int64)

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(ptr))
    return ptr(types.int64), codegen


@numba.njit(cache=True)
def _block(a, lo, n):
    """numpy's pairwise sum of ``a[lo:lo + n]`` for ``n <= 128``: 8 accumulators (under 8 items,
    one), their sum as a tree, then the rest in order. The same as
    servesim/perf/arith_kernels.py ``pairwise_block`` on purpose: calling that kernel would tie this
    file's numba cache to a kernel module's edits (module doc); both are held to numpy's sum by
    their tests (tests/test_fold_batch.py, tests/test_perf_kernels.py)."""
    if n < 8:
        res = 0.0
        for i in range(n):
            res += a[lo + i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    top = n - n % 8
    while i < top:
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


@numba.njit(cache=True)
def _pairwise(a, lo, n):
    """numpy's pairwise sum of ``a[lo:lo + n]``: blocks of at most 128 (``_block``), halves
    (cut at a multiple of 8) added left + right. Written with a stack, not recursion: a
    recursive function loaded from numba's cache crashed the process (numba 0.68)."""
    if n <= 128:
        return _block(a, lo, n)
    f_lo = np.empty(64, dtype=np.int64)  # frames: range, and how far (0: none, 1: left done)
    f_n = np.empty(64, dtype=np.int64)
    f_st = np.zeros(64, dtype=np.int64)
    val = np.empty(64)
    sp, vp = 1, 0
    f_lo[0], f_n[0], f_st[0] = lo, n, 0
    while sp:
        t = sp - 1
        m = f_n[t]
        if m <= 128:
            val[vp] = _block(a, f_lo[t], m)
            vp += 1
            sp -= 1
            continue
        n2 = m // 2
        n2 -= n2 % 8
        if f_st[t] == 0:
            f_st[t] = 1
            f_lo[sp], f_n[sp], f_st[sp] = f_lo[t], n2, 0
            sp += 1
        elif f_st[t] == 1:
            f_st[t] = 2
            f_lo[sp], f_n[sp], f_st[sp] = f_lo[t] + n2, m - n2, 0
            sp += 1
        else:
            vp -= 1
            val[vp - 1] = val[vp - 1] + val[vp]
            sp -= 1
    return val[0]


@numba.njit(cache=True)
def _search(key, arr, n, guess):
    """numpy's ``binary_search_with_guess`` (numpy 2.4 ``_core/src/multiarray/compiled_base.c``):
    ``i`` with ``arr[i] <= key < arr[i + 1]`` (-1 below, ``n`` above), looking first near
    ``guess``. The same probes as numpy's, so the same answer even where ``arr`` is not quite
    sorted (a step's end one ulp past the next step's start)."""
    imin = 0
    imax = n
    if key > arr[n - 1]:
        return n
    if key < arr[0]:
        return -1
    if n <= 4:
        i = 1
        while i < n and key >= arr[i]:
            i += 1
        return i - 1
    guess = min(guess, n - 3)
    guess = max(guess, 1)
    if key < arr[guess]:
        if key < arr[guess - 1]:
            imax = guess - 1
            if guess > 8 and key >= arr[guess - 8]:
                imin = guess - 8
        else:
            return guess - 1
    elif key < arr[guess + 1]:
        return guess
    elif key < arr[guess + 2]:
        return guess + 1
    else:
        imin = guess + 2
        if guess < n - 8 - 1 and key < arr[guess + 8]:
            imax = guess + 8
    while imin < imax:
        imid = imin + ((imax - imin) >> 1)
        if key >= arr[imid]:
            imin = imid + 1
        else:
            imax = imid
    return imin - 1


@numba.njit(cache=True)
def _interp_at(x, xp, fp, m, j):
    """``np.interp(x, xp[:m], fp[:m])`` for ``m >= 2`` knots, ``j`` the previous point's search
    result (numpy's guess; 0 for the first). Returns (value, this point's search result)."""
    j = _search(x, xp, m, j)
    if j == -1:
        return fp[0], j
    if j == m:
        return fp[m - 1], j
    if j == m - 1 or xp[j] == x:
        return fp[j], j
    slope = (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j])
    r = slope * (x - xp[j]) + fp[j]
    if math.isnan(r):
        r = slope * (x - xp[j + 1]) + fp[j + 1]
        if math.isnan(r) and fp[j] == fp[j + 1]:
            r = fp[j]
    return r, j


@numba.njit(cache=True)
def _bin(x, b):
    """``int(x // b)`` as numpy computes it (the floor of the exact quotient: fmod, then
    corrections), from the rounded quotient where no integer lies within its rounding error
    (the floor is then the same) -- fmod is ~6 ns, a third of a fold."""
    r = x / b
    q = math.floor(r)
    tol = abs(r) * 4.5e-16 + 5e-324
    if r - q > tol and q + 1.0 - r > tol:
        return int(q)
    return int(x // b)


@numba.njit(cache=True)
def _peak(peak, s, lo, hi, v):
    """The bins ``lo..hi`` of signal ``s`` see the value ``v`` (peaks: the max)."""
    for k in range(lo, hi + 1):
        peak[s, k] = max(peak[s, k], v)


@numba.njit(cache=True)
def _interp_cum(x, xp, cum, m, j):
    """``np.interp(x, xp[:m], f)`` (``_interp_at``) where ``f`` is 0 then each value of ``cum``
    twice (``f[i] = cum[(i - 1) // 2]``: the integral at a step's start and end), ``j`` this
    point's search result, found once for every signal."""
    if j == -1:
        return 0.0
    if j == m:
        return cum[(m - 2) // 2]
    f0 = cum[(j - 1) // 2] if j else 0.0
    if j == m - 1 or xp[j] == x:
        return f0
    f1 = cum[j // 2]
    slope = (f1 - f0) / (xp[j + 1] - xp[j])
    r = slope * (x - xp[j]) + f0
    if math.isnan(r):
        r = slope * (x - xp[j + 1]) + f1
        if math.isnan(r) and f0 == f1:
            r = f0
    return r


@numba.njit(cache=True)
def _fold_one(st, en, vals, n, b, integral, peak, dur):
    """``BinnedSeries.add(st[:n], en[:n], vals[:, :n])`` (``dur``: the steps' durations)."""
    first_bin = _bin(st[0], b)
    last_bin = _bin(en[n - 1], b)
    nb = last_bin - first_bin + 1
    m = 2 * n
    times = np.empty(m)
    for j in range(n):
        times[2 * j] = st[j]
        times[2 * j + 1] = en[j]
    # the bin edges (the first and last at the steps' ends), each one's knot: the same for every
    # signal (np.interp starts each call's search at 0 and goes on from each point's answer)
    xs = np.empty(nb + 1)
    js = np.empty(nb + 1, dtype=np.int64)
    kn = 0
    for k in range(nb + 1):
        x = (first_bin + k) * b
        if k == 0:
            x = st[0]
        if k == nb:
            x = en[n - 1]
        kn = _search(x, times, m, kn)
        xs[k] = x
        js[k] = kn
    sb = np.empty(n, dtype=np.int64)
    eb = np.empty(n, dtype=np.int64)
    for j in range(n):
        sb[j] = _bin(st[j], b)
        eb[j] = min(_bin(en[j], b), last_bin)
    cum = np.empty(n)
    for s in range(vals.shape[0]):
        # the integral at each step's end (np.cumsum: left to right), and the peaks: each bin's
        # max over the steps that touch it (max: exact in any order), a run of one-bin steps in
        # the same bin gathered first
        c = 0.0
        cb = -1
        cm = 0.0
        for j in range(n):
            x = vals[s, j]
            c = c + x * dur[j] if j else x * dur[0]
            cum[j] = c
            if sb[j] == eb[j] and sb[j] == cb:
                cm = max(cm, x)
                continue
            if cb >= 0 and cm > peak[s, cb]:
                peak[s, cb] = cm
            if sb[j] == eb[j]:
                cb = sb[j]
                cm = x
            else:
                cb = -1
                _peak(peak, s, sb[j], eb[j], x)
        if cb >= 0 and cm > peak[s, cb]:
            peak[s, cb] = cm
        prev = _interp_cum(xs[0], times, cum, m, js[0])
        for k in range(nb):
            cur = _interp_cum(xs[k + 1], times, cum, m, js[k + 1])
            integral[s, first_bin + k] += cur - prev
            prev = cur


@numba.njit(cache=True)
def _arrival_waits(st, en, waiting, n, arr, b, integral, peak):
    """``BinnedSeries.add_arrival_waits(st[:n], en[:n], waiting[:n], arr)``."""
    k = len(arr)
    a_kept = np.empty(k)
    j_kept = np.empty(k, dtype=np.int64)
    q = 0
    j = -1  # the last step that started before the arrival (arrivals sorted: it only moves up)
    for i in range(k):
        a = arr[i]
        while j + 1 < n and st[j + 1] < a:
            j += 1
        if j >= 0 and a < en[j]:
            a_kept[q] = a
            j_kept[q] = j
            q += 1
    if q == 0:
        return
    # the arrivals and their steps' ends in time order, an arrival before an end at the same
    # instant: numpy's argsort(kind="stable") of the two concatenated (any stable sort gives
    # the same order; a merge would not where steps' ends are out of order by an ulp)
    m = 2 * q
    both = np.empty(m)
    for i in range(q):
        both[i] = a_kept[i]
        both[q + i] = en[j_kept[i]]
    order = np.argsort(both, kind="mergesort")
    t = np.empty(m)
    cnt = np.empty(m)
    c = 0.0
    for i in range(m):
        t[i] = both[order[i]]
        d = 1.0 if order[i] < q else -1.0
        c = c + d if i else d
        cnt[i] = c
    area = np.empty(m)
    area[0] = 0.0
    acc = 0.0
    for i in range(m - 1):
        x = cnt[i] * (t[i + 1] - t[i])
        acc = acc + x if i else x
        area[i + 1] = acc
    first_bin = int(t[0] // b)
    last_bin = int(t[m - 1] // b)
    nb = last_bin - first_bin + 1
    kn = 0
    prev, kn = _interp_at(first_bin * b, t, area, m, kn)
    for kk in range(1, nb + 1):
        cur, kn = _interp_at((first_bin + kk) * b, t, area, m, kn)
        integral[_WAITING, first_bin + kk - 1] += cur - prev
        prev = cur
    first = 0
    for i in range(q):
        if i and j_kept[i] != j_kept[i - 1]:
            first = i
        top = waiting[j_kept[i]] + (i - first + 1)
        ab = int(a_kept[i] // b)
        eb = min(int(en[j_kept[i]] // b), last_bin)
        _peak(peak, _WAITING, ab, eb, top)


# the columns of ``_fold_all``'s table: one row an engine
A_START, A_END, A_VALS, A_ITLW, A_INTEG, A_PEAK, A_ARR = range(7)  # addresses of its arrays
N_ROWS, N_CAP, N_BINS, N_ARR, N_WAITS = range(5)  # steps, their buffers' width, bins, arrivals, counted?


@numba.njit(cache=True)
def _fold_all(addr, size, itl_from, bin_s, sums, itl_v, itl_w, itl_n, skipped):
    """Engine ``e``'s first ``size[e, N_ROWS]`` steps folded into its series, and its arrivals
    where ``size[e, N_WAITS]``; its arrays are at ``addr[e]`` (the buffers a fleet engine owns,
    the recorder's series: borrowed for this call, so no typed list of arrays, whose methods
    numba compiles anew in every process, ~0.3 s a type). ``sums[e]``: the durations', running
    and batch tokens' sums; the kept inter-token gaps at ``itl_v[o:o + itl_n[e]]`` (``o``: the
    steps before ``e``). An engine whose step ends go back in time (never, from the engine; the
    series' width could then depend on numpy's order of growth) is left alone: ``skipped[e]``."""
    o = 0
    for e in range(addr.shape[0]):
        n = size[e, N_ROWS]
        cap = size[e, N_CAP]
        itl_n[e] = 0
        st = numba.carray(_f8(addr[e, A_START]), cap)
        en = numba.carray(_f8(addr[e, A_END]), cap)
        v = numba.carray(_f8(addr[e, A_VALS]), (N_SIGNALS, cap))
        w = numba.carray(_i8(addr[e, A_ITLW]), cap)
        integral = numba.carray(_f8(addr[e, A_INTEG]), (N_SIGNALS, size[e, N_BINS]))
        peak = numba.carray(_f8(addr[e, A_PEAK]), (N_SIGNALS, size[e, N_BINS]))
        for j in range(1, n):
            if en[j] < en[j - 1]:
                skipped[e] = 1
        if n == 0 or skipped[e]:
            o += n
            continue
        dur = np.empty(n)
        for j in range(n):
            dur[j] = en[j] - st[j]
        sums[e, 0] = _pairwise(dur, 0, n)
        sums[e, 1] = _pairwise(v[1], 0, n)
        sums[e, 2] = _pairwise(v[3], 0, n)
        q = 0
        for j in range(n):
            if w[j] > 0 and en[j] >= itl_from[e]:
                itl_v[o + q] = dur[j]
                itl_w[o + q] = w[j]
                q += 1
        itl_n[e] = q
        o += n
        _fold_one(st, en, v[:, :n], n, bin_s[e], integral, peak, dur)
        if size[e, N_WAITS]:
            arr = numba.carray(_f8(addr[e, A_ARR]), size[e, N_ARR])
            _arrival_waits(st, en, v[_WAITING], n, arr, bin_s[e], integral, peak)


def fold_ready() -> bool:
    """Whether :func:`_fold_all` is compiled in this process or in numba's cache folder (it
    compiles in ~5 s, once a kernel version: a small fleet saves less than that)."""
    if _fold_all.signatures:
        return True
    from pathlib import Path

    return bool(jit.CACHE_DIR) and any(Path(jit.CACHE_DIR).rglob("fold._fold_all-*.nbi"))


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def fold_recorders(recs, bufs) -> None:
    """``rec._fold(start[:n], end[:n], vals[:, :n], itlw[:n])`` for each ``rec`` and its buffers
    ``(start, end, vals, itlw, n)`` in ``bufs`` (full-size buffers and a count: no slices),
    every recorder's ``itl_from`` set first; one compiled call for all."""
    todo = []
    for rec, buf in zip(recs, bufs):
        start, end, vals, itlw, n = buf
        if not n:
            continue
        s = rec.series
        last = int(end[n - 1] // s.bin_s) + 2
        if last > s.max_bins or not _plain(buf) or numba.config.DISABLE_JIT:
            rec._fold(start[:n], end[:n], vals[:, :n], itlw[:n])  # (the series coarsens: rare)
            continue
        s._grow(last)
        todo.append((rec, buf))
    if not todo:
        return
    k = len(todo)
    addr = np.zeros((k, 7), dtype=np.int64)
    size = np.zeros((k, 5), dtype=np.int64)
    arrivals = [None] * k  # (held: the kernel reads them by address)
    for i, (rec, (start, end, vals, itlw, n)) in enumerate(todo):
        s = rec.series
        integ, peak = s.integral, s.peak
        assert integ.flags.c_contiguous and peak.flags.c_contiguous and integ.shape == peak.shape
        addr[i, :6] = (_address(start), _address(end), _address(vals), _address(itlw), _address(integ), _address(peak))
        size[i, :3] = (n, len(start), integ.shape[1])
        if rec.arrivals_between is not None:
            a = np.ascontiguousarray(rec.arrivals_between(float(start[0]), float(end[n - 1])), dtype=np.float64)
            arrivals[i] = a
            addr[i, A_ARR] = _address(a)
            size[i, N_ARR], size[i, N_WAITS] = len(a), 1
    total = int(size[:, N_ROWS].sum())
    sums = np.zeros((k, 3))
    itl_v, itl_w = np.empty(total), np.empty(total, dtype=np.int64)
    itl_n = np.zeros(k, dtype=np.int64)
    skipped = np.zeros(k, dtype=np.uint8)
    _fold_all(addr, size, np.array([r.itl_from for r, _ in todo], dtype=np.float64),
              np.array([r.series.bin_s for r, _ in todo], dtype=np.float64), sums, itl_v, itl_w, itl_n, skipped)
    o = 0
    for i, (rec, (start, end, vals, itlw, n)) in enumerate(todo):
        if skipped[i]:  # (its arrivals were read: numpy's fold reads them from here)
            own = rec.arrivals_between
            if own is not None:
                rec.arrivals_between = lambda t0, t1, a=arrivals[i]: a
            rec._fold(start[:n], end[:n], vals[:, :n], itlw[:n])
            rec.arrivals_between = own
            o += n
            continue
        rec.iterations += n
        rec.busy_s += float(sums[i, 0])
        rec.batch_seqs_sum += int(sums[i, 1])
        rec.batch_tokens_sum += int(sums[i, 2])
        q = int(itl_n[i])
        if q:
            rec.itl.add(itl_v[o: o + q], itl_w[o: o + q])
        o += n
        rec.series.t_end = max(rec.series.t_end, float(end[n - 1]))


def _plain(buf) -> bool:
    """Buffers the kernel can read by address: C-contiguous, of the dtypes it reads, ``vals``
    of the signals' rows, every buffer as wide as ``start``."""
    start, end, vals, itlw, _ = buf
    m = len(start)
    return (all(a.flags.c_contiguous for a in (start, end, vals, itlw))
            and start.dtype == end.dtype == vals.dtype == np.float64 and itlw.dtype == np.int64
            and len(end) == len(itlw) == m and vals.shape == (N_SIGNALS, m))
