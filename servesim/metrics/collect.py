"""Recording during a run: compact arrays, never a Python object per token.

Every executed iteration ("step") is appended to a preallocated step buffer: start, end, KV blocks
in use, running, waiting, batch tokens, and how many requests got a token that was their
*regular* next token (they also got one at the step's start). The buffer is folded into the
aggregates in bulk when full and at the end, so the hot loop only copies a few slices.

* Inter-token latencies: all requests decoding in a step get their token at the same instant, so
  the step's duration is *the* gap for every regular request. We keep ``(gap, count)`` pairs, plus
  individual gaps for irregular cases (a request resumed after a preemption). Percentiles are
  computed on that weighted sample. Gaps of steps ending before ``itl_from`` (warm-up) are not kept.
* Time series: each signal is constant during a step, so its integral is piecewise linear in time;
  each time bin's share is read off by linear interpolation at the bin edges (exact). Per-bin maxima
  are kept for peaks: over every step that touches the bin, including a step longer than a bin
  (every bin it covers). Memory is bounded by the number of bins, not the number of iterations.
"""

from __future__ import annotations

import numpy as np

from servesim.metrics.sample import WeightedSample


def _peak_into(peak: np.ndarray, bins: np.ndarray, values: np.ndarray) -> None:
    """``np.maximum.at(peak[s], bins, values[s])`` for every signal ``s``, with ``bins`` sorted:
    the max over each run of equal bins (``reduceat``), then one max into the peaks -- the same
    values (max is exact and order-free) in two numpy calls instead of two a signal."""
    first = np.flatnonzero(np.r_[True, bins[1:] != bins[:-1]])
    ub = bins[first]
    peak[:, ub] = np.maximum(peak[:, ub], np.maximum.reduceat(values, first, axis=1))


class BinnedSeries:
    """Exact time-weighted integrals and maxima of step-constant signals, per time bin.

    At most ``max_bins`` bins are kept: when a run outgrows them, neighbouring bins merge in pairs
    (integrals add, peaks take the max) and the bin width doubles. ``bin_s`` is therefore the
    finest width; long runs get coarser series in bounded memory, still exact per bin."""

    SIGNALS = ("kv_blocks", "running", "waiting", "batch_tokens", "kv_internal_slots", "kv_reserved_slots",
               "kv_external_slots", "prefill_tokens")

    def __init__(self, bin_s: float, max_bins: int = 1 << 16, cap: int = 1024):
        self.bin_s = float(bin_s)
        self.max_bins = max_bins
        self._cap = int(cap)  # bins held at first (they grow on demand: a fleet engine's start small)
        self.integral = np.zeros((len(self.SIGNALS), self._cap))
        self.peak = np.zeros((len(self.SIGNALS), self._cap))
        self.t_end = 0.0

    def _grow(self, nbins: int) -> None:
        if nbins <= self._cap:
            return
        cap = min(max(nbins, 2 * self._cap), self.max_bins)
        for name in ("integral", "peak"):
            old = getattr(self, name)
            new = np.zeros((old.shape[0], cap))
            new[:, : old.shape[1]] = old
            setattr(self, name, new)
        self._cap = cap

    def _coarsen(self) -> None:
        cap = self._cap + (self._cap % 2)
        for name, merge in (("integral", np.add), ("peak", np.maximum)):
            old = getattr(self, name)
            if old.shape[1] < cap:
                old = np.concatenate([old, np.zeros((old.shape[0], cap - old.shape[1]))], axis=1)
            new = np.zeros_like(old)
            new[:, : cap // 2] = merge(old[:, 0::2], old[:, 1::2])
            setattr(self, name, new)
        self._cap = cap
        self.bin_s *= 2

    def add(self, starts: np.ndarray, ends: np.ndarray, values: np.ndarray) -> None:
        """Steps ``[starts[j], ends[j]]`` (sorted, non-overlapping, gaps allowed = signal 0) with
        ``values[:, j]`` during step j."""
        if len(ends) == 0:
            return
        while int(ends[-1] // self.bin_s) + 2 > self.max_bins:
            self._coarsen()
        b = self.bin_s
        first_bin = int(starts[0] // b)
        last_bin = int(ends[-1] // b)
        self._grow(last_bin + 2)
        # cumulative integral at every step end; idle gaps between steps add nothing
        contrib = values * (ends - starts)
        cum = np.cumsum(contrib, axis=1)
        # integral as a function of time: at starts[j] it is cum[j-1], at ends[j] it is cum[j]
        times = np.empty(2 * len(ends))
        times[0::2] = starts
        times[1::2] = ends
        edges = np.arange(first_bin, last_bin + 2) * b
        edges[0], edges[-1] = starts[0], ends[-1]
        start_bins = (starts // b).astype(np.int64)
        end_bins = np.minimum((ends // b).astype(np.int64), last_bin)
        # every signal at once where numpy can (a fleet engine folds a few hundred steps at a
        # time, so the per-call overhead of 8 signals x 5 numpy calls was most of a fold);
        # np.interp is 1-D: one call a signal. The same float operations as signal by signal.
        n_sig = values.shape[0]
        f = np.empty((n_sig, 2 * len(ends)))
        f[:, 1::2] = cum
        f[:, 0] = 0.0
        f[:, 2::2] = cum[:, :-1]
        at = np.empty((n_sig, len(edges)))
        for s in range(n_sig):
            at[s] = np.interp(edges, times, f[s])
        self.integral[:, first_bin : last_bin + 1] += np.diff(at, axis=1)
        for bins in (start_bins, end_bins):  # (sorted: each bin's max over its steps, then the peaks)
            _peak_into(self.peak, bins, values)
        self._inner_peaks(start_bins, end_bins, values)
        self.t_end = max(self.t_end, float(ends[-1]))

    def _inner_peaks(self, start_bins: np.ndarray, end_bins: np.ndarray, values: np.ndarray) -> None:
        """Peaks of the bins strictly inside a step (a step longer than a bin)::

            bins   |  k  | k+1 | k+2 | k+3 |
            step      [=====================]      start bin k, end bin k+3: k+1, k+2 inside

        Steps do not overlap, so a bin strictly inside a step lies in that step alone: its peak
        is the step's value, set once (no accumulation, no ``maximum.at``). The work is
        O(steps + bins inside steps)."""
        inner = end_bins - start_bins - 1
        long = np.flatnonzero(inner > 0)
        if len(long) == 0:
            return
        counts = inner[long]
        step = np.repeat(long, counts)  # the step covering each inner bin
        first = np.cumsum(counts) - counts  # where each long step's inner bins begin in ``step``
        bins = start_bins[step] + 1 + (np.arange(len(step)) - np.repeat(first, counts))
        self.peak[:, bins] = np.maximum(self.peak[:, bins], values[:, step])

    def add_arrival_waits(self, starts: np.ndarray, ends: np.ndarray, waiting: np.ndarray, arrivals: np.ndarray,
                          signal: int = 2) -> None:
        """Requests that arrive while a step runs wait from their arrival to the step's end
        (the engine takes them in at the next boundary), and the step's recorded ``waiting``
        (its queue, constant during the step) does not hold them: a 5 s step with two requests
        arriving 2 ms into it read 0 waiting throughout, and the quickstart's waiting integral
        was 3.2 request-seconds against 169.3 of queueing. ``arrivals``: sorted arrival times
        at this engine within ``(starts[0], ends[-1]]``. Each adds 1 on ``[arrival, step end)``
        -- exactly per bin, as for the step signals -- and raises the peak of the bins it covers
        to the step's value plus the arrivals so far in the step."""
        j = np.searchsorted(starts, arrivals, side="left") - 1  # the step that started before it
        ok = j >= 0
        a, j = arrivals[ok], j[ok]
        ok = a < ends[j]  # (one arriving in an idle gap starts a step at once: no wait)
        a, j = a[ok], j[ok]
        if len(a) == 0:
            return
        e = ends[j]
        b = self.bin_s
        t = np.concatenate([a, e])
        order = np.argsort(t, kind="stable")
        t = t[order]
        count = np.cumsum(np.concatenate([np.ones(len(a)), -np.ones(len(e))])[order])
        area = np.concatenate([[0.0], np.cumsum(count[:-1] * np.diff(t))])  # integral at each event
        first_bin, last_bin = int(t[0] // b), int(t[-1] // b)
        self._grow(last_bin + 2)
        edges = np.arange(first_bin, last_bin + 2) * b
        self.integral[signal, first_bin : last_bin + 1] += np.diff(np.interp(edges, t, area))
        rank = np.arange(len(j)) - np.searchsorted(j, j, side="left") + 1  # arrivals so far in the step
        top = waiting[j] + rank
        a_bins = (a // b).astype(np.int64)
        e_bins = np.minimum((e // b).astype(np.int64), last_bin)
        np.maximum.at(self.peak[signal], a_bins, top)
        np.maximum.at(self.peak[signal], e_bins, top)
        inner = e_bins - a_bins - 1
        long = np.flatnonzero(inner > 0)
        if len(long):
            counts = inner[long]
            which = np.repeat(long, counts)
            first = np.cumsum(counts) - counts
            bins = a_bins[which] + 1 + (np.arange(len(which)) - np.repeat(first, counts))
            np.maximum.at(self.peak[signal], bins, top[which])

    def nbins(self) -> int:
        """Bins covering [0, t_end): a run ending on a bin edge has no empty last bin."""
        return int(np.ceil(self.t_end / self.bin_s)) if self.t_end > 0 else 0


class Recorder:
    BUFFER = 1 << 15

    def __init__(self, timeseries_bin_s: float = 1.0, buffer: int | None = None):
        self.itl = WeightedSample()  # (gap, count) pairs; spills to disk beyond a memory limit
        n = int(buffer or Recorder.BUFFER)  # steps held before a flush
        # a recorder of fewer rows (a fleet engine's share of the run: engine/fleet_build.py) starts
        # with fewer bins too; a lone replica's 1,024 (same values either way: bins grow on demand)
        self.series = BinnedSeries(timeseries_bin_s, cap=min(1024, max(16, n // 32)))
        self.iterations = 0
        self.busy_s = 0.0
        self.batch_seqs_sum = 0  # sum over iterations of running requests
        self.batch_tokens_sum = 0
        self.itl_from = 0.0  # gaps of steps ending before this time (warm-up) are not kept
        self.cpu_s = 0.0  # engine CPU overhead inside busy time
        self.extra_s = 0.0  # non-compute time added by policies (e.g. swaps) inside busy time
        self.swap_outs = 0  # preemptions by swap (engine.preemption: swap, while host space is left)
        self.BUFFER = n
        # the step buffer of :meth:`steps`, made at its first call: the engines fold their own
        # kernel buffers (engine/driver.py ``_drain`` -> :meth:`_fold`), so an engine's recorder
        # never holds steps (11 float64 rows of ``n`` an engine, 2.8 MB at a lone replica's size)
        self._start = self._end = self._vals = self._itl_w = None
        self._fill = 0
        # sorted arrival times at this engine within (t0, t1]: requests arriving during a step
        # wait until its end (BinnedSeries.add_arrival_waits); None: not counted
        self.arrivals_between = None
        self._noted: list[np.ndarray] = []  # a fleet engine's arrivals, as they are routed to it

    def note_arrivals(self, times) -> None:
        """Requests routed to this engine arrive at ``times`` (a fleet: the router tells each
        engine; a lone replica reads its table instead: :func:`table_arrivals`)."""
        self._noted.append(np.asarray(times, dtype=np.float64).reshape(-1))
        if self.arrivals_between is None:
            self.arrivals_between = self._noted_between

    def _noted_between(self, t0: float, t1: float) -> np.ndarray:
        """The noted arrivals up to ``t1`` (consumed: a flush covers every step up to t1)."""
        if not self._noted:
            return np.empty(0)
        a = self._noted[0] if len(self._noted) == 1 else np.sort(np.concatenate(self._noted))
        k = int(np.searchsorted(a, t1, side="right"))
        self._noted = [a[k:]] if k < len(a) else []
        return a[:k]

    # -- hot path -------------------------------------------------------------------------
    def steps(self, t0: float, ends: np.ndarray, kv_used, running: int, waiting: int, batch_tokens: int,
              itl_first: int, itl_rest: int, frag=None, prefill=0) -> None:
        """Record ``len(ends)`` consecutive steps starting at ``t0``. ``itl_first`` requests got a
        regular token at the end of the first step, ``itl_rest`` at the end of each later one.
        ``frag``: (internal, reserved, external) KV slots per step (see servesim/kv/frag.py);
        ``prefill``: the prefill tokens among ``batch_tokens`` (per step, or one value for all)."""
        k = len(ends)
        if self._start is None:
            m = self.BUFFER
            self._start, self._end = np.empty(m), np.empty(m)
            self._vals = np.zeros((len(BinnedSeries.SIGNALS), m))
            self._itl_w = np.empty(m, dtype=np.int64)
        i = self._fill
        if i + k > self.BUFFER:
            self.flush()
            i = 0
        j = i + k
        self._start[i] = t0
        if k > 1:
            self._start[i + 1 : j] = ends[:-1]
        self._end[i:j] = ends
        v = self._vals
        v[0, i:j] = kv_used
        v[1, i:j] = running
        v[2, i:j] = waiting
        v[3, i:j] = batch_tokens
        if frag is not None:
            v[4, i:j], v[5, i:j], v[6, i:j] = frag
        else:
            v[4:7, i:j] = 0.0
        v[7, i:j] = prefill
        self._itl_w[i] = itl_first
        if k > 1:
            self._itl_w[i + 1 : j] = itl_rest
        self._fill = j

    def itl_pairs(self, gaps: np.ndarray, counts: np.ndarray) -> None:
        keep = counts > 0
        self.itl.add(gaps[keep], counts[keep])

    def itl_values(self, gaps: np.ndarray) -> None:
        self.itl.add(gaps, np.ones(len(gaps), dtype=np.int64))

    def itl_describe(self) -> dict:
        self.flush()
        return self.itl.describe()

    # -- bulk -----------------------------------------------------------------------------
    def flush(self) -> None:
        n = self._fill
        if n:
            self._fold(self._start[:n], self._end[:n], self._vals[:, :n], self._itl_w[:n])
        self._fill = 0

    @staticmethod
    def fold_ready() -> bool:
        """Whether :meth:`fold_many`'s kernel is built (metrics/fold.py ``fold_ready``)."""
        from servesim.metrics.fold import fold_ready

        return fold_ready()

    @staticmethod
    def fold_many(recs: list[Recorder], bufs: list) -> None:
        """``rec._fold`` of each recorder's ``(start, end, vals, itlw, rows)`` buffers, in one
        compiled pass with the same results (metrics/fold.py; a fleet's end, engine/fleet_finish.py)."""
        from servesim.metrics.fold import fold_recorders

        fold_recorders(recs, bufs)

    def _fold(self, starts, ends, vals, itl_w) -> None:
        dur = ends - starts
        self.iterations += len(ends)
        self.busy_s += float(dur.sum())
        self.batch_seqs_sum += int(vals[1].sum())
        self.batch_tokens_sum += int(vals[3].sum())
        keep = (itl_w > 0) & (ends >= self.itl_from)
        if keep.any():
            self.itl.add(dur[keep], itl_w[keep])
        self.series.add(starts, ends, vals)
        if self.arrivals_between is not None and len(ends):
            self.series.add_arrival_waits(starts, ends, vals[2], self.arrivals_between(float(starts[0]), float(ends[-1])))


def table_arrivals(table, closed_rows: int):
    """A lone replica's ``Recorder.arrivals_between``: arrival times in ``(t0, t1]`` read from the
    request table as they stand (a closed loop's are decided during the run, a rate change may
    move them): the open-loop rows (after the first ``closed_rows``) are sorted by time."""
    def between(t0: float, t1: float) -> np.ndarray:
        arr = table.arrival
        rest = arr[closed_rows:]
        out = rest[np.searchsorted(rest, t0, side="right"): np.searchsorted(rest, t1, side="right")]
        if closed_rows:
            c = arr[:closed_rows]
            out = np.sort(np.concatenate([out, c[(c > t0) & (c <= t1)]]))
        return out

    return between
