"""Step-time model fitted to a calibration pack: measured op timings -> seconds per iteration.

One iteration of a batch with ``T`` new tokens over ``n`` sequences (``n_d`` of them decodes with
cached contexts summing to ``S``, the others prefill chunks ``(t_i, c_i)``) costs, in ms::

    lin(T)       = L * (sum of per-layer token ops(T) + residual_add(T))      (residual_add twice)
                   + embed(T) + [tp>1] 2 L all_reduce(T*hidden*2 bytes) + (pp-1) send_recv(same)
    head(n)      = lm_head(n) + final_norm(n)                                  (one row per sequence)
    gaps(n)      = overhead_cuda_graph(n)          GPU idle between a forward's kernels (0 if absent)
    attention    = L * attn_decode(n_d, S / n_d)  +  L * sum_i attn_prefill(t_i, c_i)
    K            = lin(T) + head(n) + gaps(n) + attention

    time = K                    in a CUDA graph
    time = max(K, C(n))         eager: C(n) = the CPU's launch time of one forward, from the
                                overhead_eager calibration rows (C(b) = kernels(b) + overhead_eager(b))

``L`` counts all layers: with pipeline parallelism one iteration passes every stage in turn, so the
model returns that latency (the roofline model does the same); send_recv adds one activation hop per
stage boundary.

Interpolation (all tables are built once here, the hot path only indexes and blends):

* Token-keyed ops: piecewise linear between grid points (duplicates pooled by their median), so
  each op passes through its measurements. Their per-iteration sum ``lin`` is made non-decreasing
  by isotonic regression (PAV: more work never takes less time, and PAV moves noisy or
  alignment-favoured points less than a running maximum would) and tabulated at every integer token
  count up to the grid's end, so ``lin(T)`` is a lookup.
* Overheads, LM head, final norm, all-reduce, send/recv: piecewise linear, each curve made
  non-decreasing by PAV.
* Decode attention: the pack keys it by (batch b, per-sequence context c, all sequences equal).
  A query of ``b`` sequences with ``S`` cached tokens in all looks up ``c = S / b`` -- so it depends
  only on (batch, total KV tokens), which is what lets ``predict_decode_run`` equal ``predict``
  exactly -- linear in c within a batch row and linear in b between measured rows, on a lattice
  made monotone in both (PAV, then running maxima).
* Prefill attention: bilinear on the (chunk tokens, context) lattice, monotone in both axes.

Extrapolation outside the measured grid (documented in docs/calibration.md, tested):

* tokens / bytes / batch above the grid: linear, slope = least-squares slope over the top quarter
  of the grid, clipped to [0, y_max/x_max] (GEMMs and collectives are throughput-bound there);
  below the grid: the first value (launch-bound).
* decode context above a batch row: linear in KV tokens with that row's top-quarter slope; below:
  the first value. Batch above the grid: linear in batch at fixed context (= linear in KV tokens),
  with the slope measured between b_max and ~b_max/2.
* prefill context above a chunk row: linear in context with slope ``t * sigma``, ``sigma`` the
  marginal time per (query, key) pair measured along that row (or the nearest row that covers
  enough contexts) -- attention FLOPs grow by ``4*heads*head_dim*t`` per extra key. Chunks longer
  than the grid: split into grid-sized pieces over a growing context (same FLOPs) or FLOP-ratio
  scaling of the largest measured chunk, whichever predicts the pack's own longer chunks better
  from the shorter ones (H200 FlashAttention-2: split; Vidur's A100 profile: FLOP ratio; see
  :class:`PrefillAttention`). Chunks shorter than the grid: the first row (reading the KV dominates).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from servesim.errors import PackError
from servesim.models import MODELS, ModelShape
from servesim.perf.pack import LAYER_TOKEN_OPS, OpRows, Pack, check_shape, load_pack, required_ops

from servesim.perf.packtables import (  # noqa: F401 (re-exported: the tables the model is built from)
    FAR,
    Curve,
    DecodeAttention,
    PrefillAttention,
    isotonic,
    monotone_lattice,
    pool_median,
    tail_slope,
)


def _ensure_rows(pack: Pack, op: str, rows: OpRows, what: str) -> OpRows:
    if len(rows) == 0:
        raise PackError(f"{pack.csv_path}: op '{op}' has no rows {what}")
    return rows


# --- decode attention: (batch, mean context) lattice ------------------------------------------

class PackStepModel:
    """``StepTimeModel`` built from one calibration pack; immutable after construction.

    ``cuda_graph`` replays iterations as CUDA graphs: with ``graph_scope="decode"`` (the default,
    vLLM's classic capture) only pure-decode iterations, with ``"all"`` every iteration (how the
    profiler's graph-mode validation forwards were measured).
    """

    name = "pack"

    def __init__(self, pack: Pack, shape: ModelShape, tp: int = 1, pp: int = 1,
                 cuda_graph: bool = False, loglog: bool = False, graph_scope: str = "decode"):
        if pp < 1:
            raise PackError(f"pipeline-parallel degree must be >= 1, got {pp}")
        if graph_scope not in ("decode", "all"):
            raise PackError(f"graph_scope must be 'decode' or 'all', got {graph_scope!r}")
        pack.require(required_ops(tp, pp, cuda_graph))
        check_shape(pack, shape)
        self.pack, self.shape, self.tp, self.pp, self.cuda_graph = pack, shape, tp, pp, cuda_graph
        self.graph_scope = graph_scope
        self.layers = shape.num_layers
        self.curves = {op: Curve(pack.rows(op).tokens, pack.rows(op).time_ms, loglog, monotone=False)
                       for op in LAYER_TOKEN_OPS + ("embed",)}
        for op in ("final_norm", "lm_head"):
            self.curves[op] = Curve(pack.rows(op).tokens, pack.rows(op).time_ms, loglog)
        for op in ("overhead_eager", "overhead_cuda_graph"):
            if pack.has(op):
                self.curves[op] = Curve(pack.rows(op).batch, pack.rows(op).time_ms)
        self._msg_bytes_per_token = shape.hidden_size * shape.dtype_bytes
        if tp > 1:
            ar = pack.rows("all_reduce")
            ar = _ensure_rows(pack, "all_reduce", ar.where(ar.batch == tp), f"with batch (GPUs) == tp {tp}")
            self.curves["all_reduce"] = Curve(ar.bytes, ar.time_ms)
        if pp > 1:
            sr = pack.rows("send_recv")
            self.curves["send_recv"] = Curve(sr.bytes, sr.time_ms)
        self.decode_attn = DecodeAttention(pack.rows("attn_decode"))
        self.prefill_attn = PrefillAttention(pack.rows("attn_prefill"))
        self.n_table = int(max(self.curves[op].x[-1] for op in LAYER_TOKEN_OPS + ("embed",)))
        n = np.arange(self.n_table + 1, dtype=np.float64)
        self._lin = self._monotone_lin_table(n)
        self._seq = self._per_seq_ms(n)  # head + graph gaps, by sequences
        self._dec_const = self._lin + self._seq
        self.curves["cpu_floor"] = self._cpu_floor_curve()
        self._cpu = np.where(n > 0, self.curves["cpu_floor"](n), 0.0)
        self._decode_in_graph = cuda_graph
        self._all_in_graph = cuda_graph and graph_scope == "all"

    # -- construction helpers (also the path for counts beyond the tables) ---------------------
    def _lin_ms(self, tokens: np.ndarray) -> np.ndarray:
        c = self.curves
        per_layer = sum(c[op](tokens) for op in LAYER_TOKEN_OPS) + c["residual_add"](tokens)
        out = self.layers * per_layer + c["embed"](tokens)
        msg = tokens * self._msg_bytes_per_token
        if self.tp > 1:
            out = out + 2 * self.layers * c["all_reduce"](msg)
        if self.pp > 1:
            out = out + (self.pp - 1) * c["send_recv"](msg)
        return np.where(tokens > 0, out, 0.0)

    def _monotone_lin_table(self, n: np.ndarray) -> np.ndarray:
        """``lin`` at every integer token count, made non-decreasing by PAV on the raw sum.

        The raw sum is piecewise linear with breakpoints at the union of the ops' grids, so it is
        evaluated there, fitted by PAV (the least-squares monotone fit: measured GEMM timings dip
        at well-aligned sizes and with noise) and interpolated back -- exact where the sum is
        already monotone.
        """
        pts = [self.curves[op].x for op in LAYER_TOKEN_OPS + ("embed",)]
        for op, on in (("all_reduce", self.tp > 1), ("send_recv", self.pp > 1)):
            if on:
                pts.append(self.curves[op].x / self._msg_bytes_per_token)
        grid = np.unique(np.concatenate(pts))
        grid = grid[(grid >= 1) & (grid <= self.n_table)]
        mono = isotonic(self._lin_ms(grid))
        return np.where(n > 0, np.interp(n, grid, mono), 0.0)

    def _per_seq_ms(self, seqs: np.ndarray) -> np.ndarray:
        """LM head and final norm on one row per sequence, plus the GPU-side gaps of a forward.

        The gaps are ``overhead_cuda_graph``: a graph replay's time not covered by its kernels. An
        eager forward has at least the same gaps, so both modes pay them (0 without graph rows).
        """
        c = self.curves
        gaps = c["overhead_cuda_graph"](seqs) if "overhead_cuda_graph" in c else 0.0
        return np.where(seqs > 0, c["lm_head"](seqs) + c["final_norm"](seqs) + gaps, 0.0)

    def _cpu_floor_curve(self) -> Curve:
        """Eager mode: the CPU's launch time of one forward, by sequences.

        ``overhead_eager`` rows are ``wall - kernels`` of decode calibration forwards (batch ``b``,
        context ``c0`` per sequence: ``overhead.calibration_context`` in the pack YAML, else 0).
        When the CPU launches slower than the GPU runs, the wall time is the CPU's; so the floor
        is ``C(b) = kernels(b) + overhead_eager(b)`` and an eager iteration takes
        ``max(kernels + gaps, C(n))``: a long prefill hides the launch cost, a small decode does not.
        """
        rows = self.pack.rows("overhead_eager")
        b, over = pool_median(rows.batch, rows.time_ms)
        c0 = float((self.pack.meta.get("overhead") or {}).get("calibration_context", 0) or 0)
        kernels = np.array([self._lin_at(int(x)) + float(self._per_seq_ms(np.array([x]))[0])
                            - float(self._gaps(np.array([x]))[0])
                            + self.layers * float(self.decode_attn.reference(int(x), np.array([x * c0]))[0])
                            for x in b])
        return Curve(b, kernels + over)

    def _gaps(self, seqs: np.ndarray) -> np.ndarray:
        c = self.curves
        return c["overhead_cuda_graph"](seqs) if "overhead_cuda_graph" in c else np.zeros_like(seqs)

    def _lin_at(self, tokens: int) -> float:
        """``lin`` of one token count; beyond the table the raw sum's linear tails continue it."""
        if tokens <= self.n_table:
            return float(self._lin[tokens])
        raw = self._lin_ms(np.array([float(self.n_table), float(tokens)]))
        return float(self._lin[self.n_table] + (raw[1] - raw[0]))

    def _seq_at(self, seqs: int) -> float:
        if seqs <= self.n_table:
            return float(self._seq[seqs])
        return float(self._per_seq_ms(np.array([seqs], np.float64))[0])

    def _cpu_at(self, seqs: int) -> float:
        if seqs <= self.n_table:
            return float(self._cpu[seqs])
        return float(self.curves["cpu_floor"](float(seqs)))

    def _dec_const_at(self, seqs: int) -> float:
        if seqs <= self.n_table:
            return float(self._dec_const[seqs])
        return self._lin_at(seqs) + self._seq_at(seqs)

    # -- the one code path for pure-decode iterations ---------------------------------------------
    def _decode_seconds(self, num_seqs: int, kv_tokens: np.ndarray) -> np.ndarray:
        attn = self.decode_attn(num_seqs, kv_tokens.astype(np.float64))
        ms = self._dec_const_at(num_seqs) + self.layers * attn
        if not self._decode_in_graph:
            ms = np.maximum(ms, self._cpu_at(num_seqs))
        return ms * 1e-3

    # -- StepTimeModel ------------------------------------------------------------------------
    def predict_decode_run(self, num_seqs: int, context_sum: int, steps: int) -> np.ndarray:
        if num_seqs <= 0:
            return np.zeros(steps)
        kv = context_sum + num_seqs * np.arange(steps, dtype=np.int64)
        return self._decode_seconds(int(num_seqs), kv)

    def predict(self, new_tokens: np.ndarray, context: np.ndarray) -> float:
        new = np.asarray(new_tokens)
        n = new.size
        if n == 0:
            return 0.0
        ctx = np.asarray(context)
        is_pre = new != 1
        n_pre = int(np.count_nonzero(is_pre))
        if n_pre == 0:
            return float(self._decode_seconds(n, np.array([int(ctx.sum())], np.int64))[0])
        p_new, p_ctx = new[is_pre], ctx[is_pre]
        ms = self._lin_at(int(new.sum())) + self._seq_at(n)
        ms += self.layers * float(self.prefill_attn(p_new, p_ctx).sum())
        if n_pre < n:
            kv = np.array([float(int(ctx.sum()) - int(p_ctx.sum()))])
            ms += self.layers * float(self.decode_attn(n - n_pre, kv)[0])
        if not self._all_in_graph:
            ms = max(ms, self._cpu_at(n))
        return ms * 1e-3

    def describe(self) -> str:
        meta = self.pack.meta
        return (f"pack {self.pack.gpu}/{self.pack.csv_path.stem} ({meta.get('source')}: "
                f"{meta.get('origin', '?')}), tp {self.tp}, pp {self.pp}, "
                f"{'cuda graph for decode' if self.cuda_graph else 'eager'}")

    # -- diagnostics (not in the hot path) -----------------------------------------------------
    def breakdown_ms(self, new_tokens: np.ndarray, context: np.ndarray) -> dict[str, float]:
        """Per-component ms of one iteration; ``cpu_wait`` is what the CPU floor adds (eager)."""
        new = np.asarray(new_tokens)
        ctx = np.asarray(context)
        n = new.size
        is_dec = new == 1
        n_dec = int(is_dec.sum())
        seqs = np.array([float(n)])
        head = float((self.curves["lm_head"](seqs) + self.curves["final_norm"](seqs))[0])
        kv = np.array([float(ctx[is_dec].sum())])
        out = {
            "linear_ops": self._lin_at(int(new.sum())),
            "lm_head+final_norm": head,
            "graph_gaps": float(self._gaps(seqs)[0]),
            "attn_prefill": self.layers * float(self.prefill_attn(new[~is_dec], ctx[~is_dec]).sum()),
            "attn_decode": self.layers * float(self.decode_attn(n_dec, kv)[0]) if n_dec else 0.0,
        }
        in_graph = self._all_in_graph or (self._decode_in_graph and n_dec == n)
        busy = sum(out.values())
        out["cpu_wait"] = 0.0 if in_graph else max(self._cpu_at(n) - busy, 0.0)
        return out


@lru_cache(maxsize=32)
def _cached_model(gpu: str, shape: ModelShape, tp: int, pp: int, cuda_graph: bool,
                  graph_scope: str) -> PackStepModel:
    return PackStepModel(load_pack(gpu, shape, tp), shape, tp=tp, pp=pp, cuda_graph=cuda_graph,
                         graph_scope=graph_scope)


def load_pack_model(gpu: str, model: ModelShape | str, tp: int = 1, pp: int = 1,
                    cuda_graph: bool = False, *, graph_scope: str = "decode") -> PackStepModel:
    """The step-time model for ``step_time: {model: pack}``: find the pack, validate, build.

    ``graph_scope`` (with ``cuda_graph``): ``"decode"`` replays only pure-decode iterations as
    graphs, ``"all"`` every iteration. Models are immutable, so one instance per argument set is
    cached and shared.
    """
    if isinstance(model, str):
        if model not in MODELS:
            raise PackError(f"unknown model '{model}' for a calibration pack; allowed: "
                            f"{', '.join(sorted(MODELS))}")
        model = MODELS[model]
    return _cached_model(gpu, model, int(tp), int(pp), bool(cuda_graph), graph_scope)
