"""A weighted sample that may outgrow memory: exact percentiles in bounded memory.

Inter-token gaps arrive as ``(gap, count)`` pairs, a few per simulated request: 40 M pairs for a
10 M-request run. Pairs are kept in memory up to ``mem_pairs``; beyond that they are written to
``.npy`` files in a temporary folder and read back memory-mapped. Percentiles stay *exact*
(numpy's linear definition on the sample with each value repeated ``count`` times):

1. one pass for the total weight, the weighted sum (mean), min and max;
2. one pass building a weighted histogram over 2^16 log-spaced bins between min and max, which
   locates the bin holding each needed rank;
3. one pass collecting the (few) pairs that fall in those bins, sorted to read the exact values.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np

from servesim.metrics.stats import PCT_KEYS, PERCENTILES, describe_weighted, weighted_sum

BINS = 1 << 16


class WeightedSample:
    def __init__(self, mem_pairs: int = 4_000_000):
        self.mem_pairs = mem_pairs
        self._vals: list[np.ndarray] = []
        self._wts: list[np.ndarray] = []
        self._in_mem = 0
        self._files: list[tuple[Path, Path]] = []
        self._dir: Path | None = None

    # -- filling ----------------------------------------------------------------------------
    def add(self, values: np.ndarray, weights: np.ndarray) -> None:
        if len(values) == 0:
            return
        self._vals.append(np.asarray(values, dtype=np.float64))
        self._wts.append(np.asarray(weights, dtype=np.int64))
        self._in_mem += len(values)
        if self._in_mem >= self.mem_pairs:
            self._spill()

    def _spill(self) -> None:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="servesim-itl-"))
        i = len(self._files)
        fv, fw = self._dir / f"v{i}.npy", self._dir / f"w{i}.npy"
        np.save(fv, np.concatenate(self._vals))
        np.save(fw, np.concatenate(self._wts))
        self._files.append((fv, fw))
        self._vals, self._wts, self._in_mem = [], [], 0

    @property
    def spilled(self) -> bool:
        return bool(self._files)

    def parts(self):
        for fv, fw in self._files:
            yield np.load(fv, mmap_mode="r"), np.load(fw, mmap_mode="r")
        for v, w in zip(self._vals, self._wts):
            yield v, w

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Everything in memory at once (small samples only)."""
        ps = list(self.parts())
        if not ps:
            return np.empty(0), np.empty(0, dtype=np.int64)
        return np.concatenate([np.asarray(v) for v, _ in ps]), np.concatenate([np.asarray(w) for _, w in ps])

    def close(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
            self._files = []

    def __del__(self):  # temporary files never outlive the sample
        self.close()

    # -- statistics -------------------------------------------------------------------------
    def describe(self) -> dict:
        if not self.spilled:
            v, w = self.arrays()
            return describe_weighted(v, w)
        return self._describe_streaming()

    def _describe_streaming(self) -> dict:
        total, wsum, lo, hi = 0, 0.0, np.inf, -np.inf
        for v, w in self.parts():
            keep = w > 0
            if not keep.any():
                continue
            v, w = np.asarray(v)[keep], np.asarray(w)[keep]
            total += int(w.sum())
            wsum += weighted_sum(v, w)
            lo, hi = min(lo, float(v.min())), max(hi, float(v.max()))
        if total == 0:
            return describe_weighted(np.empty(0), np.empty(0, dtype=np.int64))
        pos = np.asarray(PERCENTILES) / 100.0 * (total - 1)
        ranks = np.unique(np.concatenate([np.floor(pos), np.minimum(np.floor(pos) + 1, total - 1)]).astype(np.int64))
        edges = self._edges(lo, hi)
        hist = np.zeros(len(edges) - 1, dtype=np.int64)
        for v, w in self.parts():
            hist += np.bincount(self._bin(np.asarray(v), edges), weights=np.asarray(w), minlength=len(hist)).astype(np.int64)[: len(hist)]
        cum = np.cumsum(hist)
        need_bins = np.unique(np.searchsorted(cum, ranks, side="right"))
        below = {int(b): int(cum[b - 1]) if b > 0 else 0 for b in need_bins}
        got: dict[int, list] = {int(b): [] for b in need_bins}
        for v, w in self.parts():
            v, w = np.asarray(v), np.asarray(w)
            b = self._bin(v, edges)
            sel = np.isin(b, need_bins) & (w > 0)
            for bb in np.unique(b[sel]):
                m = sel & (b == bb)
                got[int(bb)].append((v[m], w[m]))
        value_at: dict[int, float] = {}
        for b in need_bins:
            b = int(b)
            vs = np.concatenate([x for x, _ in got[b]])
            ws = np.concatenate([y for _, y in got[b]])
            order = np.argsort(vs, kind="stable")
            vs, cw = vs[order], below[b] + np.cumsum(ws[order])
            for r in ranks:
                if (b == 0 or r >= below[b]) and r < cw[-1] and r not in value_at:
                    value_at[int(r)] = float(vs[np.searchsorted(cw, r, side="right")])
        lo_r = np.floor(pos).astype(np.int64)
        hi_r = np.minimum(lo_r + 1, total - 1)
        frac = pos - lo_r
        pcts = [value_at[int(a)] + f * (value_at[int(b)] - value_at[int(a)]) for a, b, f in zip(lo_r, hi_r, frac)]
        return {"mean": wsum / total, **{k: float(p) for k, p in zip(PCT_KEYS, pcts)}, "max": hi, "count": total}

    @staticmethod
    def _edges(lo: float, hi: float) -> np.ndarray:
        if hi <= lo:
            return np.array([lo, np.nextafter(lo, np.inf)])
        if lo > 0:
            return np.geomspace(lo, hi, BINS + 1)
        return np.linspace(lo, hi, BINS + 1)

    @staticmethod
    def _bin(v: np.ndarray, edges: np.ndarray) -> np.ndarray:
        return np.clip(np.searchsorted(edges, v, side="right") - 1, 0, len(edges) - 2)
