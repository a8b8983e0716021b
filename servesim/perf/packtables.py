"""Interpolation tables of the pack model: 1-D curves through measured points, made monotone,
and the 2-D attention lattices (decode by batch and context, prefill by chunk and context), with
their documented extrapolation rules. :mod:`servesim.perf.packmodel` composes them into an
iteration time; the equations and rules are in its docstring and in docs/calibration.md.

The tables are built here in numpy; the lookups run as kernels (:mod:`servesim.perf.kernels`,
imported on first lookup so that loading a pack does not load numba). The numpy ``reference``
lookups stay for construction-time uses and as the tests' check of the kernels."""

from __future__ import annotations

import numpy as np

from servesim.perf.pack import OpRows

FAR = float(2**40)  # a point far beyond any query; tables end there so linear tails are interpolation


# --- one-dimensional building blocks ----------------------------------------------------------

def pool_median(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sort by x and replace repeated x by the median of their y."""
    order = np.argsort(x, kind="stable")
    x, y = np.asarray(x, np.float64)[order], np.asarray(y, np.float64)[order]
    ux, start = np.unique(x, return_index=True)
    if len(ux) == len(x):
        return ux, y
    ends = np.append(start[1:], len(x))
    return ux, np.array([np.median(y[s:e]) for s, e in zip(start, ends)])


def isotonic(y: np.ndarray) -> np.ndarray:
    """Least-squares non-decreasing fit (pool adjacent violators, equal weights)."""
    vals: list[float] = []
    wts: list[int] = []
    for v in np.asarray(y, np.float64):
        vals.append(float(v))
        wts.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:
            w = wts[-2] + wts[-1]
            merged = (vals[-2] * wts[-2] + vals[-1] * wts[-1]) / w
            vals.pop()
            wts.pop()
            vals[-1], wts[-1] = merged, w
    return np.repeat(np.array(vals), wts)


def tail_slope(x: np.ndarray, y: np.ndarray) -> float:
    """Slope of the linear tail above the grid: LSQ over the top quarter, clipped to [0, y/x]."""
    if len(x) < 2:
        return float(y[-1] / x[-1]) if x[-1] > 0 else 0.0
    n = max(2, len(x) // 4)
    xs, ys = x[-n:], y[-n:]
    dx = xs - xs.mean()
    slope = float((dx * (ys - ys.mean())).sum() / (dx * dx).sum())
    cap = float(y[-1] / x[-1]) if x[-1] > 0 else np.inf
    return float(min(max(slope, 0.0), cap))


class Curve:
    """Piecewise-linear y(x) through a measured grid: flat below, linear tail above.

    With ``monotone`` (the default) the grid values are first made non-decreasing by PAV; token
    ops are kept raw and the monotone fix is applied to their per-iteration sum instead.

    ``loglog`` interpolates between grid points in log-log space instead (same values at grid
    points); it is an option because a sparse grid (powers of two) of a GEMM is better bridged in
    log-log, while a dense grid makes no difference (measured: docs/calibration.md).
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, loglog: bool = False, monotone: bool = True):
        self.x, y = pool_median(x, y)
        self.y = isotonic(y) if monotone else y
        self.slope = tail_slope(self.x, self.y)
        self.loglog = loglog and self.x[0] > 0 and len(self.x) > 1

    def __call__(self, q: np.ndarray | float) -> np.ndarray:
        q = np.asarray(q, np.float64)
        if self.loglog:
            lq = np.log(np.clip(q, self.x[0], self.x[-1]))
            inner = np.exp(np.interp(lq, np.log(self.x), np.log(self.y)))
        else:
            inner = np.interp(q, self.x, self.y)
        return np.where(q > self.x[-1], self.y[-1] + self.slope * (q - self.x[-1]), inner)


def monotone_lattice(table: np.ndarray) -> np.ndarray:
    """Non-decreasing along both axes: PAV down each column, then running maxima (guarantee)."""
    out = np.column_stack([isotonic(col) for col in table.T]) if table.shape[0] > 1 else table.copy()
    return np.maximum.accumulate(np.maximum.accumulate(out, axis=0), axis=1)


class DecodeAttention:
    """Per-layer decode attention time in ms of ``b`` sequences reading ``S`` cached tokens in all.

    The pack measures ``b`` sequences of equal context ``c``; the model looks up ``c = S / b``
    (the contract: decode cost depends on batch and total KV only), linear in ``c`` within a batch
    row and linear in ``b`` between measured batches. It is made monotone in ``b`` at fixed ``c``
    (more sequences of the same length never take less time) and in ``c``; it is *not* forced to
    be monotone in ``b`` at fixed total KV: measurements show that the same KV bytes spread over
    more, shorter sequences often run faster (more parallel work units), see docs/calibration.md.
    """

    def __init__(self, rows: OpRows):
        batches = np.unique(rows.batch).astype(np.float64)
        per_row = []
        for b in batches:
            sel = rows.batch == b
            c, y = pool_median(rows.context[sel], rows.time_ms[sel])
            y = isotonic(y)
            per_row.append((c, y, tail_slope(c, y) if len(c) > 1 else 0.0))
        grid = np.unique(np.concatenate([[0.0, FAR]] + [c for c, _, _ in per_row]))
        table = np.empty((len(batches), len(grid)))
        for i, (c, y, slope) in enumerate(per_row):
            row = np.interp(grid, c, y)
            above = grid > c[-1]
            row[above] = y[-1] + slope * (grid[above] - c[-1])
            table[i] = row
        self.batches, self.grid = batches, grid
        self.table = monotone_lattice(table)
        self.beta = self._per_sequence_slope()
        self._inv_dx = 1.0 / np.diff(grid)
        self._rows = [np.ascontiguousarray(r) for r in self.table]  # 1-D rows: .take is fastest
        self._table2d = np.ascontiguousarray(self.table, dtype=np.float64)
        self._batches_f = np.asarray(self.batches, dtype=np.float64)

    def _per_sequence_slope(self) -> np.ndarray:
        """d time / d batch at fixed context, from b_max and the batch nearest b_max / 2.

        Used beyond the largest measured batch: linear in batch at fixed context is linear in
        KV tokens. Non-negative and non-decreasing in context, so the extension stays monotone.
        """
        if len(self.batches) < 2:
            return np.zeros(len(self.grid))
        hi = self.batches[-1]
        j = int(np.argmin(np.abs(self.batches[:-1] - hi / 2)))
        slope = (self.table[-1] - self.table[j]) / (hi - self.batches[j])
        return np.maximum.accumulate(np.maximum(slope, 0.0))

    def __call__(self, batch: int, kv_tokens: np.ndarray) -> np.ndarray:
        """Per-layer ms for ``batch`` sequences reading ``kv_tokens`` (float array) in all.

        Linear in per-sequence context within a measured batch row, linear in batch between rows
        (kernel ``decode_lattice_into``, which the step-time kernels call; :meth:`reference` is the
        same in numpy).
        """
        from servesim.perf.kernels import decode_lattice

        return decode_lattice(int(batch), np.ascontiguousarray(kv_tokens, dtype=np.float64), self.grid,
                              self._table2d, self._batches_f, self.beta, FAR)

    def reference(self, batch: int, kv_tokens: np.ndarray) -> np.ndarray:
        """The numpy formulation of :meth:`__call__` (tests hold the two equal)."""
        grid, bs = self.grid, self.batches
        c = np.minimum(kv_tokens / batch, FAR)
        j = np.searchsorted(grid, c, side="right") - 1
        np.minimum(j, len(grid) - 2, out=j)
        f = (c - grid.take(j)) * self._inv_dx.take(j)
        if batch >= bs[-1]:
            lo = self._rows[-1]
            v0 = lo.take(j)
            out = v0 + f * (lo.take(j + 1) - v0)
            if batch > bs[-1]:
                b0 = self.beta.take(j)
                out = out + (batch - bs[-1]) * (b0 + f * (self.beta.take(j + 1) - b0))
            return out
        i = max(int(np.searchsorted(bs, batch, side="right")) - 1, 0)
        lo = self._rows[i]
        v0 = lo.take(j)
        out = v0 + f * (lo.take(j + 1) - v0)
        if bs[i] == batch or batch < bs[0]:
            return out
        hi = self._rows[i + 1]
        w = (batch - bs[i]) / (bs[i + 1] - bs[i])
        h0 = hi.take(j)
        return out + w * ((h0 + f * (hi.take(j + 1) - h0)) - out)


# --- prefill attention: (chunk, context) lattice ----------------------------------------------

class PrefillAttention:
    """Per-layer prefill attention time in ms of one sequence's chunk of ``t`` tokens over ``c``.

    Chunks longer than the grid follow one of two rules, chosen per pack by which predicts the
    pack's own upper chunk rows better from the rows at most half as long (``long_chunks="auto"``):

    * ``"split"``: grid-sized pieces over a growing context -- exactly the FLOPs of the long chunk
      (causal attention of ``t`` queries = the first ``t_max`` + the rest over the longer prefix);
      right when a causal pair costs what a context pair costs (measured: H200 FlashAttention-2).
    * ``"flops"``: FLOP-ratio scaling of the largest measured chunk at the same context; right when
      the causal part costs more per pair (measured: Vidur's A100 profile).
    """

    MIN_SLOPE_POINTS = 4  # a row needs this many contexts to measure its own per-key slope

    def __init__(self, rows: OpRows, long_chunks: str = "auto"):
        if long_chunks == "auto":
            long_chunks = self.choose_long_chunk_rule(rows)
        self.long_chunks = long_chunks
        chunks = np.unique(rows.tokens).astype(np.float64)
        per_row = []
        for t in chunks:
            sel = rows.tokens == t
            c, y = pool_median(rows.context[sel], rows.time_ms[sel])
            per_row.append((t, c, isotonic(y)))
        sigma = self._per_pair_costs(per_row)
        grid = np.unique(np.concatenate([[0.0, FAR]] + [c for _, c, _ in per_row]))
        table = np.empty((len(chunks), len(grid)))
        for i, (t, c, y) in enumerate(per_row):
            row = np.interp(grid, c, y)
            above = grid > c[-1]
            row[above] = y[-1] + t * sigma[i] * (grid[above] - c[-1])
            table[i] = row
        self.measured_max_chunk = float(chunks[-1])
        if long_chunks == "flops":
            ext = self._longer_chunks(chunks[-1])
            if len(ext):
                edge = table[-1]
                w_edge = chunks[-1] * (grid + (chunks[-1] + 1) / 2)
                flops = ext[:, None] * (grid[None, :] + (ext[:, None] + 1) / 2)
                table = np.vstack([table, edge[None, :] * flops / w_edge[None, :]])
                chunks = np.concatenate([chunks, ext])
        elif long_chunks != "split":
            raise ValueError(f"long_chunks must be 'auto', 'split' or 'flops', got {long_chunks!r}")
        self.chunks, self.grid, self.sigma = chunks, grid, sigma
        self.table = monotone_lattice(table)
        self._flat = self.table.ravel()
        self._inv_dc = 1.0 / np.diff(grid)
        self._inv_dt = 1.0 / np.diff(chunks) if len(chunks) > 1 else np.ones(1)
        self._chunks_f = np.ascontiguousarray(chunks, dtype=np.float64)
        self._flat = np.ascontiguousarray(self._flat, dtype=np.float64)

    @classmethod
    def choose_long_chunk_rule(cls, rows: OpRows) -> str:
        """Held-out choice on the pack's own grid: fit chunks <= t_max/2, score the longer rows."""
        chunks = np.unique(rows.tokens)
        cut = chunks[chunks <= chunks[-1] / 2]
        if len(cut) < 2:
            return "split"
        train, test = rows.where(rows.tokens <= cut[-1]), rows.where(rows.tokens > cut[-1])
        errs = {}
        for rule in ("split", "flops"):
            pred = cls(train, long_chunks=rule).call_reference(test.tokens, test.context)  # setup: numpy
            errs[rule] = float(np.median(np.abs(pred / test.time_ms - 1)))
        return min(errs, key=errs.get)

    GROWTH = 1.1  # spacing of the FLOP-scaled rows beyond the measured chunks
    CHUNK_CAP = float(2**20)  # beyond this (never in practice) chunks are split

    def _longer_chunks(self, t_max: float) -> np.ndarray:
        """Chunk sizes beyond the grid, tabulated by FLOP-ratio scaling of the largest measured row.

        ``t(t, c) = t(t_max, c) * w(t, c) / w(t_max, c)`` with ``w = t * (c + (t+1)/2)`` (causal
        attention pairs): the per-pair cost of the largest measured chunk carries over. Rows grow
        by 10% (the chord of the quadratic overestimates by < 0.3% between rows) up to 2**20.
        """
        n = int(np.floor(np.log(self.CHUNK_CAP / t_max) / np.log(self.GROWTH)))
        return np.round(t_max * self.GROWTH ** np.arange(1, n + 1))

    def _per_pair_costs(self, per_row: list) -> np.ndarray:
        """Marginal ms per (query, key) pair of each row: LSQ slope along context / chunk tokens.

        Rows with too few contexts (the far end of a triangular grid) borrow the value of the
        nearest row (in chunk tokens) that has enough; with no such row, the average cost per
        pair of the row itself (an upper bound for the marginal cost).
        """
        own = np.full(len(per_row), np.nan)
        for i, (t, c, y) in enumerate(per_row):
            if len(c) >= self.MIN_SLOPE_POINTS:
                top = c >= c[len(c) // 2]
                cs, ys = c[top], y[top]
                if len(cs) >= 2:
                    dc = cs - cs.mean()
                    own[i] = max(float((dc * (ys - ys.mean())).sum() / (dc * dc).sum()), 0.0) / t
        ok = np.flatnonzero(~np.isnan(own))
        sigma = own.copy()
        for i, (t, c, y) in enumerate(per_row):
            if np.isnan(own[i]):
                if ok.size:
                    ts = np.array([per_row[k][0] for k in ok])
                    sigma[i] = own[ok[np.argmin(np.abs(ts - t))]]
                else:
                    sigma[i] = y[-1] / (t * (c[-1] + (t + 1) / 2))
        return sigma

    def _lattice(self, t: np.ndarray, c: np.ndarray) -> np.ndarray:
        """Bilinear lookup for t within the chunk rows (clamped below), any c >= 0 (kernel
        ``prefill_lattice_ms``; :meth:`_lattice_reference` is the same in numpy)."""
        from servesim.perf.kernels import prefill_lattice

        return prefill_lattice(np.ascontiguousarray(t, dtype=np.float64), np.ascontiguousarray(c, dtype=np.float64),
                               self._chunks_f, self.grid, self._flat, FAR)

    def _lattice_reference(self, t: np.ndarray, c: np.ndarray) -> np.ndarray:
        chunks, grid, flat = self.chunks, self.grid, self._flat
        ng = len(grid)
        c = np.minimum(c, FAR)
        j = np.searchsorted(grid, c, side="right") - 1
        np.minimum(j, ng - 2, out=j)
        fc = (c - grid.take(j)) * self._inv_dc.take(j)
        if len(chunks) == 1:
            v0 = flat.take(j)
            return v0 + fc * (flat.take(j + 1) - v0)
        t = np.clip(t, chunks[0], chunks[-1])
        i = np.searchsorted(chunks, t, side="right") - 1
        np.minimum(i, len(chunks) - 2, out=i)
        ft = (t - chunks.take(i)) * self._inv_dt.take(i)
        k = i * ng + j
        v00, v01 = flat.take(k), flat.take(k + 1)
        v10, v11 = flat.take(k + ng), flat.take(k + ng + 1)
        v0 = v00 + fc * (v01 - v00)
        return v0 + ft * ((v10 + fc * (v11 - v10)) - v0)

    def __call__(self, t: np.ndarray, c: np.ndarray) -> np.ndarray:
        """Per-layer ms for each (t, c) row; chunks beyond the last row are split (same FLOPs)
        when any row of the call is (kernel ``prefill_attention``)."""
        from servesim.perf.kernels import prefill_attention

        t = np.ascontiguousarray(t, dtype=np.float64)
        c = np.ascontiguousarray(c, dtype=np.float64)
        if t.shape != c.shape or t.ndim != 1:
            raise ValueError(f"t and c must be vectors of equal length, got shapes {t.shape} and {c.shape}")
        return prefill_attention(t, c, self._chunks_f, self.grid, self._flat, FAR)

    def call_reference(self, t: np.ndarray, c: np.ndarray) -> np.ndarray:
        """:meth:`__call__` in numpy (construction-time uses: no numba start-up; the tests' check)."""
        return self._evaluate(t, c, self._lattice_reference)

    def _evaluate(self, t, c, lattice) -> np.ndarray:
        """Long chunks in row-sized pieces over a growing context, in numpy (the reference)."""
        t = np.asarray(t, np.float64)
        c = np.asarray(c, np.float64)
        t_max = self.chunks[-1]
        if t.size == 0 or t.max() <= t_max:
            return lattice(t, c)
        pieces = np.ceil(t / t_max)
        out = np.zeros_like(t)
        for k in range(int(pieces.max())):
            alive = pieces > k
            last = pieces == k + 1
            size = np.where(last, t - k * t_max, t_max)
            out[alive] += lattice(size[alive], (c + k * t_max)[alive])
        return out


# --- the model --------------------------------------------------------------------------------

