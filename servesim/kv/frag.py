"""Fragmentation metrics: where the KV pool's token slots go, step by step.

Every step (iteration) the KV manager reports a :class:`StepUsage`: per step of an iteration or a
decode run, the pool's token slots split as::

    total = used + internal + reservation + external + usable free
            └────── allocated ───────────┘   └──────── free ────────┘

    allocated    slots in blocks held by (or reserved for) requests
    used         slots holding KV of a token (written, or being written this step)
    internal     unwritten slots inside blocks that hold written slots: the partly filled last
                 block of a paged request (at most block_size - 1 per request)
    reservation  reserved blocks with no written slot yet: the unused tail of a static
                 max_seq_len reservation or of an elastic base/growth chunk ("reserved but not
                 used"; at the end of a request it is what was never used)
    external     free slots that cannot hold the next allocation: free extents smaller than the
                 next reservation (static allocator; always 0 for paged and elastic, whose
                 allocations need no contiguity)

The reported metrics are shares of the whole pool (``total``), so they add up with the free share:

    utilization             = allocated / total
    internal_fragmentation  = internal / total  = (allocated - used - reservation) / total
    reservation_waste       = reservation / total
    external_fragmentation  = external / total

Each metric is a step-constant signal; :class:`FragRecorder` integrates it exactly over time
(idle time between steps counts as 0, like the KV-usage series of the engine's recorder) and keeps
its peak, and bins it for the run's time series. ``mean`` is the time average over the run
``[0, sim_time]``; ``peak`` the largest step value. Values at each step depend only on the
allocator's state, so the engine's fast path (many decode steps at once) and single stepping give
the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servesim.kv.base import KVUsage

SIGNALS = ("utilization", "internal_fragmentation", "reservation_waste", "external_fragmentation")


@dataclass(frozen=True)
class StepUsage:
    """Token-slot accounting during each of ``k`` consecutive steps (arrays of length ``k``)."""

    total_slots: int
    allocated: np.ndarray
    used: np.ndarray
    reserved_unused: np.ndarray
    external: np.ndarray

    @property
    def internal(self) -> np.ndarray:
        return self.allocated - self.used - self.reserved_unused

    def shares(self) -> np.ndarray:
        """The four metrics of the module docstring, shape ``(4, k)``."""
        t = float(self.total_slots)
        return np.vstack([self.allocated / t, self.internal / t, self.reserved_unused / t, self.external / t])


@dataclass(frozen=True)
class ExtentUsage(KVUsage):
    """A snapshot of an allocator with real extents: adds the free slots that cannot hold the
    next allocation (proposed for :class:`KVUsage` itself; 0 for paged allocators)."""

    external_slots: int = 0


def usage_shares(u: KVUsage) -> dict[str, float]:
    """The four metrics for one :class:`servesim.kv.base.KVUsage` snapshot."""
    t = float(u.total_slots)
    internal = u.allocated_slots - u.used_slots - u.reserved_unused_slots
    external = getattr(u, "external_slots", 0)
    return {
        "utilization": u.allocated_slots / t,
        "internal_fragmentation": internal / t,
        "reservation_waste": u.reserved_unused_slots / t,
        "external_fragmentation": external / t,
    }


class FragRecorder:
    """Exact time-weighted means, peaks and per-bin series of the fragmentation metrics.

    ``add`` is called once per engine segment (an iteration or a decode run) and only copies into
    a buffer; buffers are folded in bulk."""

    BUFFER = 1 << 14

    def __init__(self, bin_s: float = 1.0):
        self.bin_s = float(bin_s)
        self.integral = np.zeros(len(SIGNALS))
        self.peak = np.zeros(len(SIGNALS))
        self._bin_int = np.zeros((len(SIGNALS), 256))
        self._bin_peak = np.zeros((len(SIGNALS), 256))
        self.t_end = 0.0
        self._start = np.empty(self.BUFFER)
        self._end = np.empty(self.BUFFER)
        self._vals = np.empty((len(SIGNALS), self.BUFFER))
        self._fill = 0

    def add(self, t0: float, ends: np.ndarray, usage: StepUsage) -> None:
        ends = np.asarray(ends, dtype=np.float64)
        k = len(ends)
        if k == 0:
            return
        vals = usage.shares()
        if self._fill + k > self.BUFFER:
            self.flush()
            if k > self.BUFFER:
                self._fold(np.concatenate(([t0], ends[:-1])), ends, vals)
                return
        i, j = self._fill, self._fill + k
        self._start[i] = t0
        self._start[i + 1 : j] = ends[:-1]
        self._end[i:j] = ends
        self._vals[:, i:j] = vals
        self._fill = j

    def flush(self) -> None:
        if self._fill:
            n = self._fill
            self._fold(self._start[:n], self._end[:n], self._vals[:, :n])
            self._fill = 0

    def _fold(self, starts: np.ndarray, ends: np.ndarray, vals: np.ndarray) -> None:
        dur = ends - starts
        self.integral += vals @ dur
        self.peak = np.maximum(self.peak, vals.max(axis=1))
        b = self.bin_s
        first, last = int(starts[0] // b), int(ends[-1] // b)
        if last + 2 > self._bin_int.shape[1]:
            cap = max(last + 2, 2 * self._bin_int.shape[1])
            for name in ("_bin_int", "_bin_peak"):
                old = getattr(self, name)
                new = np.zeros((old.shape[0], cap))
                new[:, : old.shape[1]] = old
                setattr(self, name, new)
        times = np.empty(2 * len(ends))
        times[0::2], times[1::2] = starts, ends
        edges = np.arange(first, last + 2) * b
        edges[0], edges[-1] = starts[0], ends[-1]
        cum = np.cumsum(vals * dur, axis=1)
        sb = (starts // b).astype(np.int64)
        eb = np.minimum((ends // b).astype(np.int64), last)
        for s in range(len(SIGNALS)):
            f = np.empty(2 * len(ends))
            f[0] = 0.0
            f[1::2] = cum[s]
            f[2::2] = cum[s, :-1]
            self._bin_int[s, first : last + 1] += np.diff(np.interp(edges, times, f))
            np.maximum.at(self._bin_peak[s], sb, vals[s])
            np.maximum.at(self._bin_peak[s], eb, vals[s])
        self.t_end = max(self.t_end, float(ends[-1]))

    # -- outputs ----------------------------------------------------------------------------
    def summary(self, sim_time: float) -> dict[str, dict[str, float]]:
        """``{metric: {"mean", "peak"}}`` over ``[0, sim_time]``."""
        self.flush()
        t = max(float(sim_time), 1e-300)
        return {name: {"mean": float(self.integral[i] / t), "peak": float(self.peak[i])}
                for i, name in enumerate(SIGNALS)}

    def nbins(self) -> int:
        return int(self.t_end // self.bin_s) + 1 if self.t_end > 0 else 0

    def columns(self, nbins: int | None = None) -> dict[str, np.ndarray]:
        """Time-series columns ``kv_<metric>_mean`` / ``kv_<metric>_peak`` per bin of ``bin_s``
        seconds starting at 0 (the engine recorder's bins when ``bin_s`` matches)."""
        self.flush()
        nb = self.nbins() if nbins is None else nbins
        cap = self._bin_int.shape[1]
        pad = max(0, nb - cap)
        t = np.arange(nb) * self.bin_s
        width = np.minimum(self.bin_s, np.maximum(self.t_end - t, 0.0))
        width = np.where(width > 0, width, np.nan)
        out = {}
        for i, name in enumerate(SIGNALS):
            integ = np.concatenate([self._bin_int[i, :nb], np.zeros(pad)])
            peak = np.concatenate([self._bin_peak[i, :nb], np.zeros(pad)])
            out[f"kv_{name}_mean"] = integ / width
            out[f"kv_{name}_peak"] = peak
        return out
