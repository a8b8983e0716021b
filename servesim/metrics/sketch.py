"""A mergeable quantile sketch (log-bucket histogram) for sweeps.

Exact percentiles need every value; a sweep of thousands of runs, or replications to merge, needs
something small that adds up. Values ``x > 0`` fall in bucket ``i = ceil(log_gamma(x))`` with
``gamma = (1 + a) / (1 - a)``; reporting ``2 gamma^i / (gamma + 1)`` for a bucket is within a
relative error ``a`` of every value in it (the DDSketch construction). Zeros are counted apart.
Two sketches with the same ``a`` merge by adding counts, so a sweep can combine runs exactly as if
their samples had been pooled, up to that relative error.
"""

from __future__ import annotations

import math

import numpy as np


class LogSketch:
    def __init__(self, rel_err: float = 0.01):
        if not 0 < rel_err < 1:
            raise ValueError(f"rel_err must be in (0, 1), got {rel_err}")
        self.rel_err = rel_err
        self.gamma = (1 + rel_err) / (1 - rel_err)
        self._lg = math.log(self.gamma)
        self.offset = 0
        self.counts = np.zeros(0, dtype=np.int64)
        self.zeros = 0

    def add(self, values, weights=None) -> "LogSketch":
        v = np.asarray(values, dtype=np.float64)
        w = np.ones(len(v), dtype=np.int64) if weights is None else np.asarray(weights, dtype=np.int64)
        keep = ~np.isnan(v)
        v, w = v[keep], w[keep]
        pos = v > 0
        self.zeros += int(w[~pos].sum())
        if pos.any():
            idx = np.ceil(np.log(v[pos]) / self._lg).astype(np.int64)
            self._accumulate(int(idx.min()), np.bincount(idx - idx.min(), weights=w[pos]).astype(np.int64))
        return self

    def _accumulate(self, offset: int, counts: np.ndarray) -> None:
        if len(self.counts) == 0:
            self.offset, self.counts = offset, counts.copy()
            return
        lo = min(self.offset, offset)
        hi = max(self.offset + len(self.counts), offset + len(counts))
        merged = np.zeros(hi - lo, dtype=np.int64)
        merged[self.offset - lo : self.offset - lo + len(self.counts)] += self.counts
        merged[offset - lo : offset - lo + len(counts)] += counts
        self.offset, self.counts = lo, merged

    def merge(self, other: "LogSketch") -> "LogSketch":
        if other.rel_err != self.rel_err:
            raise ValueError("can only merge sketches with the same rel_err")
        self.zeros += other.zeros
        if len(other.counts):
            self._accumulate(other.offset, other.counts)
        return self

    @property
    def count(self) -> int:
        return int(self.counts.sum()) + self.zeros

    def quantile(self, q: float) -> float | None:
        """Value at quantile ``q`` in [0, 1] (rank q * (count - 1), lower), within rel_err."""
        n = self.count
        if n == 0:
            return None
        rank = q * (n - 1)
        if rank < self.zeros:
            return 0.0
        cum = np.cumsum(self.counts)
        i = int(np.searchsorted(cum, rank - self.zeros, side="right"))
        return 2 * self.gamma ** (self.offset + i) / (self.gamma + 1)

    def to_dict(self) -> dict:
        return {"rel_err": self.rel_err, "offset": self.offset, "zeros": self.zeros,
                "counts": self.counts.tolist()}

    @classmethod
    def from_dict(cls, d: dict) -> "LogSketch":
        s = cls(d["rel_err"])
        s.offset, s.zeros = int(d["offset"]), int(d["zeros"])
        s.counts = np.asarray(d["counts"], dtype=np.int64)
        return s
