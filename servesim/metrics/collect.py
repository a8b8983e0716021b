"""Recording during a run: compact arrays, never a Python object per token.

* Inter-token latencies come in bulk: in one iteration every decoding request gets its token at the
  same instant, so the iteration's duration is *the* gap for all requests that also got a token in
  the previous iteration. We store ``(gap, count)`` pairs, plus individual gaps for the irregular
  cases (a request resumed after preemption). Percentiles are computed on the weighted sample.
* Time series (KV blocks in use, running, waiting, batch tokens) are integrated exactly into fixed
  time bins: within a step each signal is constant, so its integral is piecewise linear in time and
  each bin's share is read off by linear interpolation at the bin edges. Per-bin maxima are kept for
  peaks. Memory is bounded by the number of bins, not the number of iterations.
"""

from __future__ import annotations

import numpy as np


class _Chunks:
    """Append-only float/int columns stored as growing numpy chunks."""

    def __init__(self, dtype):
        self.parts: list[np.ndarray] = []
        self.dtype = dtype

    def add(self, a: np.ndarray) -> None:
        if len(a):
            self.parts.append(np.asarray(a, dtype=self.dtype))

    def array(self) -> np.ndarray:
        if not self.parts:
            return np.empty(0, dtype=self.dtype)
        if len(self.parts) > 1:
            self.parts = [np.concatenate(self.parts)]
        return self.parts[0]


class BinnedSeries:
    """Exact time-weighted integrals and maxima of step-constant signals, per time bin."""

    SIGNALS = ("kv_blocks", "running", "waiting", "batch_tokens")

    def __init__(self, bin_s: float):
        self.bin_s = float(bin_s)
        self._cap = 1024
        self.integral = np.zeros((len(self.SIGNALS), self._cap))
        self.peak = np.zeros((len(self.SIGNALS), self._cap))
        self.t_end = 0.0

    def _grow(self, nbins: int) -> None:
        if nbins <= self._cap:
            return
        cap = max(nbins, 2 * self._cap)
        for name in ("integral", "peak"):
            old = getattr(self, name)
            new = np.zeros((old.shape[0], cap))
            new[:, : old.shape[1]] = old
            setattr(self, name, new)
        self._cap = cap

    def add(self, t0: float, ends: np.ndarray, values: np.ndarray) -> None:
        """Steps ``[t0, ends[0]], [ends[0], ends[1]], ...`` with ``values[:, j]`` during step j."""
        b = self.bin_s
        last_bin = int(ends[-1] // b)
        self._grow(last_bin + 2)
        times = np.empty(len(ends) + 1)
        times[0] = t0
        times[1:] = ends
        first_bin = int(t0 // b)
        edges = np.arange(first_bin + 1, last_bin + 1) * b
        pts = np.concatenate(([t0], edges, [ends[-1]]))
        for s in range(values.shape[0]):
            cum = np.concatenate(([0.0], np.cumsum(values[s] * np.diff(times))))
            at = np.interp(pts, times, cum)
            self.integral[s, first_bin : last_bin + 1] += np.diff(at)
            start_bins = (times[:-1] // b).astype(np.int64)
            end_bins = np.minimum((times[1:] // b).astype(np.int64), last_bin)
            np.maximum.at(self.peak[s], start_bins, values[s])
            np.maximum.at(self.peak[s], end_bins, values[s])
        self.t_end = max(self.t_end, float(ends[-1]))

    def nbins(self) -> int:
        return int(self.t_end // self.bin_s) + 1 if self.t_end > 0 else 0


class Recorder:
    def __init__(self, timeseries_bin_s: float = 1.0):
        self.itl_gap = _Chunks(np.float64)
        self.itl_count = _Chunks(np.int64)
        self.series = BinnedSeries(timeseries_bin_s)
        self.iterations = 0
        self.busy_s = 0.0
        self.batch_seqs_sum = 0  # sum over iterations of sequences in the batch
        self.batch_tokens_sum = 0
        self.itl_from = 0.0  # gaps of iterations ending before this time (warm-up) are not kept

    def itl_weighted(self, gaps: np.ndarray, count: int) -> None:
        if count > 0 and len(gaps):
            self.itl_gap.add(gaps)
            self.itl_count.add(np.full(len(gaps), count, dtype=np.int64))

    def itl_values(self, gaps: np.ndarray) -> None:
        self.itl_gap.add(gaps)
        self.itl_count.add(np.ones(len(gaps), dtype=np.int64))

    def steps(self, t0: float, ends: np.ndarray, kv_used: np.ndarray, running: int, waiting: int,
              batch_tokens: int) -> None:
        k = len(ends)
        self.iterations += k
        self.busy_s += float(ends[-1] - t0)
        self.batch_seqs_sum += running * k
        self.batch_tokens_sum += batch_tokens * k
        values = np.empty((4, k))
        values[0] = kv_used
        values[1] = running
        values[2] = waiting
        values[3] = batch_tokens
        self.series.add(t0, ends, values)
