"""Step-time model fitted to a calibration pack: measured op timings -> seconds per iteration.

One iteration of a batch with ``T`` new tokens over ``n`` sequences (``n_d`` of them decodes with
cached contexts summing to ``S``, the others prefill chunks ``(t_i, c_i)``) costs, in ms::

    lin(T)       = L * (sum of per-layer token ops(T) + residual_add(T))      (residual_add twice)
                   + embed(T) + [tp>1] 2 L all_reduce(T*hidden*2 bytes) + (pp-1) send_recv(same)
                   (a stage boundary between servers: the inter-server link's latency + bytes/bw)
    head(n)      = lm_head(n) + final_norm(n)                                  (one row per sequence)
    gaps(n)      = overhead_cuda_graph(n)          GPU idle between a forward's kernels (0 if absent)
    attention    = L * attn_decode(n_d, S / n_d)  +  L * sum_i attn_prefill(t_i, c_i)
    K            = lin(T) + head(n) + gaps(n) + attention

    time = K                    in a CUDA graph
    time = max(K, C(n))         eager: C(n) = the CPU's launch time of one forward: the walls
                                (kernels + overhead_eager) of the CPU-bound calibration forwards,
                                continued linearly beyond them (``_cpu_floor_curve``)

Which iterations replay a graph is the engine version's capture rule (``cuda_graph`` on): pure
decodes of at most ``graph_max_batch`` sequences (vLLM V0, SGLang, TensorRT-LLM capture decode
batches only, up to a batch cap; 0: any batch), and with ``graph_max_tokens`` any iteration of at
most that many tokens, prefills included (vLLM V1's piecewise graphs around the attention); the
rest run eager. ``graph_scope="all"`` replays every iteration (the profiler's graph-mode forwards).
servesim/config/engines.py sets the caps per preset from each engine's source (docs/model.md).

``L`` counts all layers: with pipeline parallelism one iteration passes every stage in turn, so the
model returns that latency (the roofline model does the same); send_recv adds one activation hop per
stage boundary.

The tables below are built once here in numpy; the predictions run as numba kernels over them
(:mod:`servesim.perf.kernels`: ``iteration_seconds`` / ``decode_seconds`` evaluate the equations
above, ``tables()`` hands the arrays to the engine).

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

from servesim.diskmemo import code_stamp, disk_memo, stamp
from servesim.errors import PackError
from servesim.models import ModelShape
from servesim.perf.base import KernelModel, check_bounds
from servesim.perf.pack import OpRows, Pack, check_shape, load_pack, pack_path, pack_shape, required_ops

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

class PackStepModel(KernelModel):
    """``StepTimeModel`` built from one calibration pack; immutable after construction.

    ``cuda_graph`` replays iterations as CUDA graphs: with ``graph_scope="decode"`` (the default,
    vLLM's classic capture) only pure-decode iterations, with ``"all"`` every iteration (how the
    profiler's graph-mode validation forwards were measured). ``graph_max_batch`` caps the decode
    batches that replay (0: any); ``graph_max_tokens`` also replays every iteration of at most
    that many tokens, prefills included (vLLM V1's piecewise capture; 0: none).
    """

    name = "pack"

    def __init__(self, pack: Pack, shape: ModelShape, tp: int = 1, pp: int = 1,
                 cuda_graph: bool = False, loglog: bool = False, graph_scope: str = "decode", *,
                 cross_hops: int = 0, link_bytes_per_s: float = 0.0, link_latency_s: float = 0.0,
                 graph_max_batch: int = 0, graph_max_tokens: int = 0):
        if pp < 1:
            raise PackError(f"pipeline-parallel degree must be >= 1, got {pp}")
        if not 0 <= cross_hops <= pp - 1 or (cross_hops and not link_bytes_per_s > 0):
            raise PackError(f"cross_hops {cross_hops} needs 0..pp-1 ({pp - 1}) and a link bandwidth > 0")
        self.cross_hops, self.link_bytes_per_s, self.link_latency_s = cross_hops, link_bytes_per_s, link_latency_s
        if graph_scope not in ("decode", "all"):
            raise PackError(f"graph_scope must be 'decode' or 'all', got {graph_scope!r}")
        for name, v in (("graph_max_batch", graph_max_batch), ("graph_max_tokens", graph_max_tokens)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0:
                raise PackError(f"{name} must be an integer >= 0 (0: no cap / none), got {v!r}")
            if v and not cuda_graph:
                raise PackError(f"{name} {v} needs cuda_graph on (an eager model replays no graphs)")
        self.graph_max_batch, self.graph_max_tokens = int(graph_max_batch), int(graph_max_tokens)
        pack.require(required_ops(tp, pp, cuda_graph, moe=pack.is_moe))
        check_shape(pack, shape)
        self.pack, self.shape, self.tp, self.pp, self.cuda_graph = pack, shape, tp, pp, cuda_graph
        self.graph_scope = graph_scope
        self.layers = shape.num_layers
        self._decode_in_graph = cuda_graph
        self._all_in_graph = cuda_graph and graph_scope == "all"
        self._tab = None  # the kernels' tables, built on first prediction (numba loads then)
        #: per-layer token ops of the pack's kind (dense MLP or experts), in forward order
        self.token_ops = pack.layer_token_ops
        self.curves = {op: Curve(pack.rows(op).tokens, pack.rows(op).time_ms, loglog, monotone=False)
                       for op in self.token_ops + ("embed",)}
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
        self.n_table = int(max(self.curves[op].x[-1] for op in self.token_ops + ("embed",)))
        n = np.arange(self.n_table + 1, dtype=np.float64)
        self._lin = self._monotone_lin_table(n)
        self._seq = self._per_seq_ms(n)  # head + graph gaps, by sequences
        self._dec_const = self._lin + self._seq
        self.curves["cpu_floor"] = self._cpu_floor_curve()
        self._cpu = np.where(n > 0, self.curves["cpu_floor"](n), 0.0)

    # -- construction helpers (numpy; the kernels continue the tables beyond their ends) --------
    def _lin_ms(self, tokens: np.ndarray, hops: bool = True) -> np.ndarray:
        c = self.curves
        per_layer = sum(c[op](tokens) for op in self.token_ops) + c["residual_add"](tokens)
        out = self.layers * per_layer + c["embed"](tokens)
        msg = tokens * self._msg_bytes_per_token
        if self.tp > 1:
            out = out + 2 * self.layers * c["all_reduce"](msg)
        if hops and self.pp > 1:
            out = out + self._hops_ms(tokens)
        return np.where(tokens > 0, out, 0.0)

    def _hops_ms(self, tokens: np.ndarray) -> np.ndarray:
        """The activations' trips between pipeline stages: send/recv within a server, the
        inter-server link's latency + bytes / bandwidth between servers."""
        msg = tokens * self._msg_bytes_per_token
        out = (self.pp - 1 - self.cross_hops) * self.curves["send_recv"](msg)
        if self.cross_hops > 0:
            out = out + self.cross_hops * (self.link_latency_s + msg / self.link_bytes_per_s) * 1e3
        return out

    def _monotone_lin_table(self, n: np.ndarray) -> np.ndarray:
        """``lin`` at every integer token count, made non-decreasing by PAV on the raw sum.

        The raw sum is piecewise linear with breakpoints at the union of the ops' grids, so it is
        evaluated there, fitted by PAV (the least-squares monotone fit: measured GEMM timings dip
        at well-aligned sizes and with noise) and interpolated back -- exact where the sum is
        already monotone.

        The stage hops of pipeline parallelism are added after the fit (their curves are monotone
        already): fitted together with the compute, they would move the fit's pools, and a
        pipeline's iteration could come out faster than one GPU's at some token counts.
        """
        pts = [self.curves[op].x for op in self.token_ops + ("embed",)]
        if self.tp > 1:
            pts.append(self.curves["all_reduce"].x / self._msg_bytes_per_token)
        grid = np.unique(np.concatenate(pts))
        grid = grid[(grid >= 1) & (grid <= self.n_table)]
        mono = isotonic(self._lin_ms(grid, hops=False))
        table = np.where(n > 0, np.interp(n, grid, mono), 0.0)
        if self.pp > 1:
            table = table + np.where(n > 0, self._hops_ms(n), 0.0)
        return table

    def _per_seq_ms(self, seqs: np.ndarray) -> np.ndarray:
        """LM head and final norm on one row per sequence, plus the GPU-side gaps of a forward.

        The gaps are ``overhead_cuda_graph``: a graph replay's time not covered by its kernels. An
        eager forward has at least the same gaps, so both modes pay them (0 without graph rows).
        """
        c = self.curves
        gaps = c["overhead_cuda_graph"](seqs) if "overhead_cuda_graph" in c else 0.0
        return np.where(seqs > 0, c["lm_head"](seqs) + c["final_norm"](seqs) + gaps, 0.0)

    #: a calibration forward is CPU-bound when its eager time over the kernels is at least this
    #: share of the kernels (:meth:`_cpu_floor_curve`)
    CPU_BOUND_SHARE = 0.25

    def _cpu_floor_curve(self) -> Curve:
        """Eager mode: the CPU's launch time of one forward, by sequences.

        ``overhead_eager`` rows are ``over(b) = wall - kernels`` of decode calibration forwards
        (batch ``b``, context ``c0`` per sequence: ``overhead.calibration_context`` in the pack
        YAML, else 0). An eager iteration takes ``max(kernels + gaps, C(n))``: a long prefill hides
        the launch time, a small decode does not.

        Only a CPU-bound forward's wall is its launch time. ``over(b) >= 0.25 kernels(b)`` marks
        one: a GPU-bound forward's excess is only the GPU's gaps between kernels (1-8 % of its
        kernels on the H200 packs, batches 256-512), a CPU-bound one's is the launch time the GPU
        waits for (28-300 % there, batches 1-128). A GPU-bound wall is the GPU's time at ``c0``
        (1,024 tokens of context on the H200 packs); taken as the floor, it lifts every eager decode
        of that batch at a shorter context to 1,024-token attention (h200/llama-3-8b, batch 512 at
        450 tokens: 33.0 ms against 23.3 as a graph), so it bounds the launch time only from above.

        The rule: ``F(b)`` passes through the CPU-bound rows' walls and continues beyond the last
        of them linearly with the least-squares slope over all of them (clipped at 0: more
        sequences never launch less; 0 with one such row). The CPU's work per step is a fixed
        sequence of kernel launches plus per-sequence host work (inputs, metadata), so it grows
        weakly and about linearly with the batch: the CPU-bound walls of h200/llama-3-8b are
        12.9-13.9 ms from batch 1 to 128 (slope 0.002 ms per sequence). ``C(b) = min(F(b), W(b))``
        with ``W`` the walls' curve (the old floor): a wall is never below the launch time. Without
        a CPU-bound row (the A100 packs imported from Vidur carry estimated rows: kernels at
        context 0 + 0.5 ms) ``C = W``, unchanged.
        """
        rows = self.pack.rows("overhead_eager")
        b, over = pool_median(rows.batch, rows.time_ms)
        c0 = float((self.pack.meta.get("overhead") or {}).get("calibration_context", 0) or 0)
        kernels = np.array([self._lin_at(int(x)) + float(self._per_seq_ms(np.array([x]))[0])
                            - float(self._gaps(np.array([x]))[0])
                            + self.layers * float(self.decode_attn.reference(int(x), np.array([x * c0]))[0])
                            for x in b])
        walls = Curve(b, kernels + over)
        cpu_bound = cpu_bound_walls(b, kernels, over)
        if cpu_bound is None:
            return walls
        xs, ys, slope = cpu_bound
        fit = Curve(xs, ys)
        fit.slope = slope
        return _min_curve(walls, fit)

    def _gaps(self, seqs: np.ndarray) -> np.ndarray:
        c = self.curves
        return c["overhead_cuda_graph"](seqs) if "overhead_cuda_graph" in c else np.zeros_like(seqs)

    # -- the kernels' tables (servesim/perf/kernels.py evaluates every prediction) -------------
    #: per-count tables are extended to the engine's bounds up to this length; beyond, the
    #: kernels compute the same extrapolation per call
    EXTEND_CAP = 1 << 20

    def tables(self, max_tokens: int, max_seqs: int):
        """The kernels' :class:`~servesim.perf.kernels.StepTables`, with the per-count tables
        (``lin`` by tokens, head/gaps, CPU floor and decode constants by sequences) evaluated up
        to ``max_tokens`` / ``max_seqs``, so the engine's iterations are lookups. The values equal
        what the kernels extrapolate beyond a table, so the bounds change speed, never results."""
        check_bounds(max_tokens, max_seqs)
        tab = self._tables()
        tab = tab._replace(pk_ex=tab.pk_ex.copy())  # the engine's own extrapolation counters, at 0
        mt, ms = min(int(max_tokens), self.EXTEND_CAP), min(int(max_seqs), self.EXTEND_CAP)
        if mt < len(tab.pk_lin) and ms < min(len(tab.pk_seq), len(tab.pk_cpu), len(tab.pk_dec_const)):
            return tab
        from servesim.perf.kernels import pack_extend

        lin, seq, cpu, dec = pack_extend(tab, mt, ms)
        return tab._replace(pk_lin=lin, pk_seq=seq, pk_cpu=cpu, pk_dec_const=dec)

    def grid_ends(self) -> dict[str, float]:
        """The measured grid's end on each op kind's axis (servesim/perf/extrapolation.py):
        beyond it a prediction extrapolates. Contexts: the largest measured at any batch/chunk."""
        da, pa = self.decode_attn, self.prefill_attn
        return {"gemm_tokens": float(min(self.curves[op].x[-1] for op in self.token_ops)),
                "decode_batch": float(da.batches[-1]), "decode_kv_per_seq": float(da.grid[-2]),
                "prefill_chunk": float(pa.measured_max_chunk), "prefill_context": float(pa.grid[-2])}

    def _tables(self):
        if self._tab is None:
            self._tab = self._build_tables()
        return self._tab

    def _build_tables(self, complete: bool = True):
        """The tables as measured (``n_table``), plus each curve's linear tail for the counts
        beyond them. ``complete=False`` (during construction) leaves out the CPU floor."""
        from servesim.perf.kernels import (EX_LEN, EX_N0, N_TAILS, PACK, TAIL_EMBED, TAIL_FINAL_NORM,
                                           TAIL_GAPS, TAIL_LM_HEAD, TAIL_TOKEN_OPS, step_tables)

        c = self.curves
        tails = np.zeros((N_TAILS, 3))  # an absent curve's tail is 0.0 (adds nothing)
        rows = self.token_ops + ("residual_add",)  # residual_add twice; the pack's kind names the rest
        assert len(rows) == TAIL_TOKEN_OPS, rows
        for r, op in enumerate(rows):
            tails[r] = _tail(c[op])
        tails[TAIL_EMBED] = _tail(c["embed"])
        per_seq = {TAIL_LM_HEAD: "lm_head", TAIL_FINAL_NORM: "final_norm", TAIL_GAPS: "overhead_cuda_graph"}
        for r, op in per_seq.items():
            if op in c:
                tails[r] = _tail(c[op])
        # the per-sequence table reaches past every per-sequence curve's grid, so the kernels
        # only ever need those curves' linear tails (log-log interpolation stays in numpy)
        seq_end = int(max([self.n_table] + [np.ceil(c[op].x[-1]) for op in per_seq.values() if op in c]))
        seq = self._seq if seq_end == self.n_table else self._per_seq_ms(np.arange(seq_end + 1, dtype=np.float64))
        curve = {}
        for op in ("all_reduce", "send_recv", "cpu_floor"):
            if op in c and (complete or op != "cpu_floor"):
                curve[op] = (np.vstack([c[op].x, c[op].y]), c[op].slope)
            else:
                curve[op] = (np.zeros((2, 0)), 0.0)
        da, pa = self.decode_attn, self.prefill_attn
        return step_tables(
            PACK,
            pk=dict(layers=self.layers, tp=self.tp, pp=self.pp, n_table=self.n_table,
                    msg_bytes=self._msg_bytes_per_token,
                    lin_raw_end=float(self._lin_ms(np.array([float(self.n_table)]))[0]),
                    ar_slope=curve["all_reduce"][1], sr_slope=curve["send_recv"][1],
                    cpu_slope=curve["cpu_floor"][1], far=FAR, decode_in_graph=self._decode_in_graph,
                    all_in_graph=self._all_in_graph, graph_max_batch=self.graph_max_batch,
                    graph_max_tokens=self.graph_max_tokens, x_hops=self.cross_hops, x_bw=self.link_bytes_per_s,
                    x_latency=self.link_latency_s),
            pk_lin=self._lin, pk_seq=seq, pk_cpu=self._cpu if complete else None,
            pk_dec_const=self._dec_const, pk_tails=tails, pk_ar=curve["all_reduce"][0],
            pk_sr=curve["send_recv"][0], pk_cpu_curve=curve["cpu_floor"][0],
            pk_dec_grid=da.grid, pk_dec_table=da._table2d, pk_dec_batches=da._batches_f,
            pk_dec_beta=da.beta, pk_pre_chunks=pa._chunks_f, pk_pre_grid=pa.grid, pk_pre_flat=pa._flat,
            pk_ex=np.concatenate([list(self.grid_ends().values()), np.zeros(EX_LEN - EX_N0)]))

    # -- per-count terms (diagnostics, construction); the kernels extrapolate beyond the tables --
    def _lin_at(self, tokens: int) -> float:
        """``lin`` of one token count; beyond the table the raw sum's linear tails continue it."""
        if 0 <= tokens < len(self._lin):
            return float(self._lin[tokens])
        from servesim.perf.kernels import pack_lin_ms

        # during construction (the CPU floor's calibration batches) the tables are not complete
        tab = self._tab if self._tab is not None else self._build_tables(complete=hasattr(self, "_cpu"))
        return float(pack_lin_ms(tab, int(tokens)))

    def _cpu_at(self, seqs: int) -> float:
        from servesim.perf.kernels import pack_cpu_ms

        return float(pack_cpu_ms(self._tables(), int(seqs)))

    # -- StepTimeModel (predict / predict_decode_run: KernelModel) -----------------------------
    def describe(self) -> str:
        meta = self.pack.meta
        origin = str(meta.get("origin", "?"))
        if meta.get("source") == "derived" and not origin.startswith("derived"):
            origin = f"derived from {origin}"
        what = origin if meta.get("source") in ("derived", "transferred") else f"{meta.get('source')}: {origin}"
        return (f"pack {self.pack.gpu}/{self.pack.csv_path.stem} ({what}), tp {self.tp}, pp {self.pp}, "
                f"{self._graph_words()}"
                + (f", {self.cross_hops} stage hop(s) between servers" if self.cross_hops else ""))

    def _graph_words(self) -> str:
        """The capture rule in the header's words (unchanged text without caps)."""
        if not self.cuda_graph:
            return "eager"
        words = "cuda graph for decode" + (f" up to {self.graph_max_batch} seqs" if self.graph_max_batch else "")
        if self.graph_max_tokens:
            words += f", piecewise for any iteration up to {self.graph_max_tokens} tokens"
        return words

    def in_graph(self, seqs: int, tokens: int, pure_decode: bool) -> bool:
        """Whether such an iteration replays a graph: the kernels' own rule (``pack_in_graph``)
        run as Python on this model's caps, so the diagnostics cannot drift from the hot path."""
        from types import SimpleNamespace

        from servesim.perf.kernels import pack_in_graph

        caps = SimpleNamespace(all_in_graph=self._all_in_graph, decode_in_graph=self._decode_in_graph,
                               graph_max_batch=self.graph_max_batch, graph_max_tokens=self.graph_max_tokens)
        return bool(pack_in_graph.py_func(caps, seqs, tokens, pure_decode))

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
        in_graph = self.in_graph(n, int(new.sum()), n_dec == n)
        busy = sum(out.values())
        out["cpu_wait"] = 0.0 if in_graph else max(self._cpu_at(n) - busy, 0.0)
        return out


def cpu_bound_walls(batches, kernels, over) -> tuple[np.ndarray, np.ndarray, float] | None:
    """The eager floor's fit (:meth:`PackStepModel._cpu_floor_curve`, where the rule and its
    reasons are written): the CPU-bound calibration forwards (``over >= CPU_BOUND_SHARE x
    kernels``) as ``(batches, walls, slope)``, the slope least-squares over them, clipped at 0
    (0 with one row); None when no forward was CPU-bound. One rule for the pack model and for
    derive's launch-count check (servesim/tools/derive_launches.py)."""
    b = np.asarray(batches, np.float64)
    k, o = np.asarray(kernels, np.float64), np.asarray(over, np.float64)
    cpu = o >= PackStepModel.CPU_BOUND_SHARE * k
    if not cpu.any():
        return None
    xs, ys = b[cpu], (k + o)[cpu]
    slope = 0.0
    if len(xs) > 1:
        dx = xs - xs.mean()
        slope = max(float((dx * (ys - ys.mean())).sum() / (dx * dx).sum()), 0.0)
    return xs, ys, slope


def _min_curve(f: Curve, g: Curve) -> Curve:
    """``min(f, g)`` of two non-decreasing linear curves (flat below, linear tails above), exact:
    knots at both grids and where the two cross, within the grids or on the tails."""
    x = np.union1d(f.x, g.x)
    d = f(x) - g(x)
    cross = [x[i] + (x[i + 1] - x[i]) * d[i] / (d[i] - d[i + 1])
             for i in range(len(x) - 1) if d[i] * d[i + 1] < 0]
    # beyond x[-1] both are linear: the lower one stays lower unless the tails cross
    tail = min(f.slope, g.slope) if d[-1] == 0 else (f.slope if d[-1] < 0 else g.slope)
    if d[-1] != 0 and f.slope != g.slope:
        q = x[-1] - d[-1] / (f.slope - g.slope)
        if q > x[-1]:
            cross.append(q)
            tail = min(f.slope, g.slope)
    x = np.union1d(x, cross)
    out = Curve(x, np.minimum(f(x), g(x)))
    out.slope = tail
    return out


def _tail(curve: Curve) -> tuple[float, float, float]:
    """(x_last, y_last, slope): a curve above its grid is ``y_last + slope * (q - x_last)``."""
    return float(curve.x[-1]), float(curve.y[-1]), float(curve.slope)


# the sources a built model derives from, besides its pack's two files (they key the disk memo)
_MODEL_CODE = ("models/shape.py", "models/precision.py", "hardware.py", "perf/base.py", "perf/pack.py", "perf/packmodel.py", "perf/packtables.py")


@lru_cache(maxsize=32)
def _cached_model(gpu: str, shape: ModelShape, tp: int, pp: int, cuda_graph: bool,
                  graph_scope: str, cross: tuple = (0, 0.0, 0.0), where: str = "",
                  caps: tuple = (0, 0)) -> PackStepModel:
    def build() -> PackStepModel:
        return PackStepModel(load_pack(gpu, shape, tp), shape, tp=tp, pp=pp, cuda_graph=cuda_graph,
                             graph_scope=graph_scope, cross_hops=cross[0], link_bytes_per_s=cross[1],
                             link_latency_s=cross[2], graph_max_batch=caps[0], graph_max_tokens=caps[1])

    csv_path = pack_path(gpu, shape, tp)
    yaml_path = csv_path.with_suffix(".yaml")
    if not (csv_path.is_file() and yaml_path.is_file()):
        return build()  # says which pack is missing and what exists
    # parsing the pack and building its tables is most of a small run's start-up: kept on disk
    key = (gpu, repr(shape), tp, pp, cuda_graph, graph_scope, cross, stamp(csv_path), stamp(yaml_path),
           code_stamp(_MODEL_CODE)) + ((caps,) if caps != (0, 0) else ())
    return disk_memo("pack-models", key, build)


def load_pack_model(gpu: str, model: ModelShape | str, tp: int = 1, pp: int = 1,
                    cuda_graph: bool = False, *, graph_scope: str = "decode", cross_hops: int = 0,
                    link_bytes_per_s: float = 0.0, link_latency_s: float = 0.0,
                    graph_max_batch: int = 0, graph_max_tokens: int = 0) -> PackStepModel:
    """The step-time model for ``step_time: {model: pack}``: find the pack, validate, build.

    ``graph_scope`` (with ``cuda_graph``): ``"decode"`` replays only pure-decode iterations as
    graphs, ``"all"`` every iteration; ``graph_max_batch`` / ``graph_max_tokens``: the engine
    version's capture caps (:class:`PackStepModel`). Models are immutable, so one instance per argument set is
    cached and shared.
    """
    if isinstance(model, str):  # a pack name: the model in the name's precision
        model = pack_shape(model)
    cross = (int(cross_hops), float(link_bytes_per_s), float(link_latency_s))
    where = str(pack_path(gpu, model, int(tp)))  # keys the cache by the file too (another pack root)
    caps = (int(graph_max_batch or 0), int(graph_max_tokens or 0))
    return _cached_model(gpu, model, int(tp), int(pp), bool(cuda_graph), graph_scope, cross, where, caps)
