"""Step times as kernels: the one source of every built-in step-time model's arithmetic.

The engine's hot loop asks two questions (the contract is :mod:`servesim.perf.base`):

``iteration_seconds(tab, new, ctx, nb)``
    one iteration in which request ``i < nb`` computes ``new[i]`` tokens on top of ``ctx[i]``
    cached ones (``new``/``ctx`` int64 arrays, possibly longer than ``nb``: the engine's scratch).
``decode_seconds(tab, num_seqs, context_sum, steps, out)``
    fills ``out[:steps]`` with ``steps`` consecutive pure-decode iterations.

``tab`` is a :class:`StepTables`: everything any built-in model needs, with every field always
present at a fixed type, so that one compiled specialization serves every model (``kind``
selects the formulas). The model classes (constant, roofline, pack) build their tables once and
their ``predict`` / ``predict_decode_run`` are thin wrappers over these kernels; the engine calls
the kernels directly from its own compiled loop (``jit.pure`` runs the same source as Python).

Exactness: the kernels reproduce the float operations of the numpy formulations they replaced in
the same order, so predictions did not change by one bit (tests/fixtures/step_times.npz). Two
numpy behaviours are reproduced explicitly: ``ndarray.sum`` of floats (:func:`np_sum`: pairwise
summation in blocks of 8 under 128 elements, added to the reduction's identity 0.0) and
``np.interp`` (:func:`interp_at`). Extrapolation beyond the pack's per-count tables (tokens or
sequences above the measured grid) is computed here, so any count is answered exactly as before;
``PackStepModel.tables(max_tokens, max_seqs)`` merely pre-evaluates it up to the engine's bounds.

Nothing here may read module globals that live outside the kernel modules (numba freezes them
and the compile cache would not see their edits): constants such as the roofline's collective
latencies or the pack lattices' far point travel in the tables.
"""

from typing import NamedTuple  # (no postponed annotations: step_tables reads the field types)

import numpy as np

from servesim.jit import kernel
from servesim.perf.roofline_kernels import roofline_decode_run, roofline_iteration_seconds

# numpy-exact arithmetic and the attention lattices live in their own kernel modules; every name
# stays importable here
from servesim.perf.arith_kernels import curve_at, interp_at, np_sum, pairwise_block, tail_at  # noqa: F401
from servesim.perf.lattice_kernels import (decode_lattice, decode_lattice_into, prefill_attention,  # noqa: F401
                                           prefill_attention_ms, prefill_lattice, prefill_lattice_ms)

CONSTANT, ROOFLINE, PACK = 0, 1, 2

#: rows of ``StepTables.pk_tails`` (columns: x_last, y_last, slope of a curve's linear tail)
TAIL_TOKEN_OPS = 11  # rows 0..10: per-layer token ops in forward order, residual_add counted twice
TAIL_EMBED = 11
TAIL_LM_HEAD, TAIL_FINAL_NORM, TAIL_GAPS = 12, 13, 14
N_TAILS = 15

#: ``StepTables.pk_ex``: the pack's measured grid ends (0..4), then per op kind (5 kinds and "any")
#: the committed iterations outside the grid (5..10) and their seconds (11..16), then all committed
#: iterations (17) and their seconds (18): servesim/perf/extrapolation.py reads them
EX_GEMM, EX_DEC_BATCH, EX_DEC_CTX, EX_PRE_CHUNK, EX_PRE_CTX = 0, 1, 2, 3, 4
EX_KINDS = 5
EX_N0, EX_S0, EX_TOTAL_N, EX_TOTAL_S, EX_LEN = 5, 11, 17, 18, 19


class RooflineConsts(NamedTuple):
    """The roofline model's constants (servesim/perf/roofline.py has the equations). Scalars
    only: a kernel receiving a tuple of arrays pays a reference-count update per array, one of
    scalars costs nothing, so the roofline kernels take this part alone."""

    layers: int  # all layers of all pipeline stages (one batch passes them all)
    tp: int
    pp: int
    qkv_k: int  # (K, N) per rank of the four GEMMs of a layer
    qkv_n: int
    o_k: int
    o_n: int
    gate_up_k: int
    gate_up_n: int
    down_k: int
    down_n: int
    lm_k: int
    lm_n: int
    dtype_bytes: int
    hidden: int
    heads: int  # per rank
    head_dim: int
    kv_bytes_tok_layer: int
    elementwise_bytes_tok: int
    flops: float  # peak * mfu
    bw: float  # peak * mbu
    link: float  # NVLink bytes/s
    allreduce_latency: float
    send_latency: float
    x_hops: int  # stage boundaries that cross servers (the inter-server link, not NVLink)
    x_bw: float  # inter-server link bytes/s
    x_latency: float
    overhead: float
    dec_f: float  # decode attention over all layers: max(kv * f, kv * b + n * q)
    dec_b: float
    dec_q: float
    # the general path (roofline_kernels.roofline_token_seconds_general): general 0 = the dense
    # bf16 formulas above, bit for bit; 1 = weight formats, MoE layers, MLA projections
    general: int
    w_bytes: float  # bytes per quantized weight
    gemm_flops: float  # the weight format's GEMM rate x mfu
    dequant_s: float  # seconds per weight dequantized (weight-only formats), per row tile
    dequant_tile: int  # rows one dequantization serves
    x1_k: int  # extra attention GEMMs (MLA: q_b, kv_b), (K, N) per rank; 0: none
    x1_n: int
    x2_k: int
    x2_n: int
    dense_layers: int  # layers with a dense MLP (gate_up, down above)
    moe_layers: int
    moe_experts: int  # experts on one rank (E / ep)
    moe_total: int  # E
    moe_topk: int
    moe_n: int  # one expert's intermediate per rank (I_e / tp without EP, I_e with EP)
    moe_ep: int  # expert-parallel degree (1: experts TP-sharded)
    moe_imbalance: float  # busiest rank's routed tokens / the mean (EP)
    moe_q_experts: int  # 1: expert weights take the quantized format; 0: the model dtype
    moe_q_dense: int  # 1: attention and dense/shared MLP weights take the quantized format
    shared_n: int  # shared experts' intermediate per rank


class PackConsts(NamedTuple):
    """The pack model's scalars (servesim/perf/packmodel.py has the equations; times in ms)."""

    layers: int
    tp: int
    pp: int
    n_table: int  # the measured-token table's end: beyond it, ``lin`` follows the ops' tails
    msg_bytes: int  # activation bytes per token (all-reduce, send/recv)
    lin_raw_end: float  # the raw op sum at n_table (the tails continue from there)
    ar_slope: float
    sr_slope: float
    cpu_slope: float
    far: float  # the lattices' last context point
    decode_in_graph: bool  # pure-decode iterations replay a CUDA graph (no CPU floor) ...
    graph_max_batch: int  # ... of at most this many sequences (0: any); more run eager
    all_in_graph: bool  # every iteration does
    graph_max_tokens: int  # (with decode_in_graph) every iteration of at most this many tokens
    #                        does, prefills too: piecewise capture (vLLM V1); 0: none
    x_hops: int  # stage boundaries that cross servers: latency + bytes / bandwidth of the link
    x_bw: float  # inter-server link bytes/s
    x_latency: float  # seconds


class StepTables(NamedTuple):
    """All a step-time kernel needs, for any model kind (unused parts: zeros, empty arrays).

    Build with :func:`step_tables`, which fills the defaults and fixes every dtype and rank.
    """

    kind: int  # CONSTANT, ROOFLINE or PACK
    seconds: float  # CONSTANT: every iteration takes this long
    rf: RooflineConsts
    pk: PackConsts
    pk_lin: np.ndarray  # lin(T) in ms for T < len (monotone table, extended to the engine's bound)
    pk_seq: np.ndarray  # head + graph gaps by sequences, for n < len
    pk_cpu: np.ndarray  # eager CPU floor by sequences, for n < len
    pk_dec_const: np.ndarray  # lin(n) + seq(n), for n < len
    pk_tails: np.ndarray  # (N_TAILS, 3): linear tails of the token ops, embed, lm_head, norm, gaps
    pk_ar: np.ndarray  # (2, n) all-reduce curve by bytes (tp > 1): rows x, y
    pk_sr: np.ndarray  # (2, n) send/recv curve by bytes (pp > 1)
    pk_cpu_curve: np.ndarray  # (2, n) CPU floor by sequences (beyond pk_cpu)
    pk_dec_grid: np.ndarray  # decode attention lattice: per-sequence context grid
    pk_dec_table: np.ndarray  # (batches, grid)
    pk_dec_batches: np.ndarray
    pk_dec_beta: np.ndarray  # per-sequence slope beyond the largest batch
    pk_pre_chunks: np.ndarray  # prefill attention lattice: chunk rows
    pk_pre_grid: np.ndarray
    pk_pre_flat: np.ndarray  # (chunks * grid) row-major
    pk_ex: np.ndarray  # grid ends and extrapolation counters (EX_*; empty: not counted)


_ARRAY_RANK = {"pk_tails": 2, "pk_ar": 2, "pk_sr": 2, "pk_cpu_curve": 2, "pk_dec_table": 2}


def _scalars(cls, given: dict):
    unknown = sorted(set(given) - set(cls._fields))
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field '{unknown[0]}'")
    return cls(**{f: cls.__annotations__[f](given.get(f, 0)) for f in cls._fields})


def step_tables(kind: int, seconds: float = 0.0, rf: dict | None = None, pk: dict | None = None,
                **arrays) -> StepTables:
    """A :class:`StepTables` with defaults for what ``kind`` does not use; scalars cast to their
    field's type, arrays fresh C-contiguous writable float64 copies of their rank -- so every
    model's tables have one numba type (one compiled specialization)."""
    if kind not in (CONSTANT, ROOFLINE, PACK):
        raise ValueError(f"step-table kind must be {CONSTANT}, {ROOFLINE} or {PACK}, got {kind!r}")
    names = StepTables._fields[4:]
    unknown = sorted(set(arrays) - set(names))
    if unknown:
        raise ValueError(f"unknown step-table field '{unknown[0]}'")
    out = {}
    for name in names:
        rank = _ARRAY_RANK.get(name, 1)
        v = arrays.get(name)
        a = np.zeros((0,) * rank) if v is None else np.array(v, dtype=np.float64, order="C", copy=True)
        if a.ndim != rank:
            raise ValueError(f"step-table field {name} must have {rank} dimension(s), got {a.ndim}")
        out[name] = a
    return StepTables(int(kind), float(seconds), _scalars(RooflineConsts, rf or {}),
                      _scalars(PackConsts, pk or {}), **out)


# --- pack: per-count terms (tables, and the extrapolation beyond them) -------------------------

@kernel
def pack_lin_ms(tab, tokens):
    """``lin(T)``: the token-keyed ops of one iteration (all layers, embed, collectives). Beyond
    the monotone table the raw op sum's linear tails (every token op is past its grid there)
    continue it from the table's end."""
    if tokens < tab.pk_lin.shape[0]:
        return tab.pk_lin[tokens]
    pk = tab.pk
    q = float(tokens)
    per_layer = 0.0
    for r in range(TAIL_TOKEN_OPS):
        per_layer += tail_at(tab.pk_tails, r, q)
    out = pk.layers * per_layer + tail_at(tab.pk_tails, TAIL_EMBED, q)
    msg = q * pk.msg_bytes
    if pk.tp > 1:
        out = out + 2 * pk.layers * curve_at(msg, tab.pk_ar, pk.ar_slope)
    if pk.pp > 1:
        out = out + (pk.pp - 1 - pk.x_hops) * curve_at(msg, tab.pk_sr, pk.sr_slope)
        if pk.x_hops > 0:
            out = out + pk.x_hops * (pk.x_latency + msg / pk.x_bw) * 1e3
    return tab.pk_lin[pk.n_table] + (out - pk.lin_raw_end)


@kernel
def pack_seq_ms(tab, seqs):
    """LM head + final norm on one row per sequence + the forward's GPU gaps (0 without rows);
    beyond the table every one of these curves is past its grid."""
    if seqs < tab.pk_seq.shape[0]:
        return tab.pk_seq[seqs]
    q = float(seqs)
    t = tab.pk_tails
    return tail_at(t, TAIL_LM_HEAD, q) + tail_at(t, TAIL_FINAL_NORM, q) + tail_at(t, TAIL_GAPS, q)


@kernel
def pack_cpu_ms(tab, seqs):
    """The eager CPU floor: the launch time of one forward of ``seqs`` sequences."""
    if seqs < tab.pk_cpu.shape[0]:
        return tab.pk_cpu[seqs]
    return curve_at(float(seqs), tab.pk_cpu_curve, tab.pk.cpu_slope)


@kernel
def pack_dec_const_ms(tab, seqs):
    """Everything of a pure-decode iteration but its attention."""
    if seqs < tab.pk_dec_const.shape[0]:
        return tab.pk_dec_const[seqs]
    return pack_lin_ms(tab, seqs) + pack_seq_ms(tab, seqs)


@kernel
def pack_extend(tab, max_tokens, max_seqs):
    """The per-count tables evaluated up to the engine's bounds (the same values the kernels
    compute beyond them): lin to ``max_tokens``, the per-sequence tables to ``max_seqs``."""
    lin = np.empty(max(max_tokens + 1, tab.pk_lin.shape[0]))
    for i in range(lin.shape[0]):
        lin[i] = pack_lin_ms(tab, i)
    seq = np.empty(max(max_seqs + 1, tab.pk_seq.shape[0]))
    for i in range(seq.shape[0]):
        seq[i] = pack_seq_ms(tab, i)
    cpu = np.empty(max(max_seqs + 1, tab.pk_cpu.shape[0]))
    for i in range(cpu.shape[0]):
        cpu[i] = pack_cpu_ms(tab, i)
    dec = np.empty(max(max_seqs + 1, tab.pk_dec_const.shape[0]))
    for i in range(dec.shape[0]):
        dec[i] = pack_dec_const_ms(tab, i)
    return lin, seq, cpu, dec


# --- pack: iterations ------------------------------------------------------------------------

@kernel(inline=True)
def pack_in_graph(pk, nb, tokens, pure_decode):
    """Whether an iteration of ``nb`` sequences and ``tokens`` new tokens replays a CUDA graph
    (else it pays the eager CPU floor): every iteration with ``all_in_graph``; a pure decode up
    to ``graph_max_batch`` sequences (0: any); any iteration up to ``graph_max_tokens`` tokens
    (piecewise capture; 0: none). servesim/config/engines.py sets the caps per engine version."""
    if pk.all_in_graph:
        return True
    if not pk.decode_in_graph:
        return False
    if pure_decode and (pk.graph_max_batch == 0 or nb <= pk.graph_max_batch):
        return True
    return pk.graph_max_tokens > 0 and tokens <= pk.graph_max_tokens


@kernel
def pack_decode_s(pk, nb, const_ms, cpu_ms, attn_ms):
    """A pure-decode iteration of ``nb`` sequences from its parts: all but attention, the CPU
    floor (eager), and the per-layer attention."""
    ms = const_ms + pk.layers * attn_ms
    if not pack_in_graph(pk, nb, nb, True):
        ms = max(ms, cpu_ms)
    return ms * 1e-3


# --- the contract ----------------------------------------------------------------------------
#
# The pack branches are written in place rather than in helpers taking ``tab``: numba updates the
# reference count of every array of a tuple on entry to (and exit from) each kernel that receives
# it, ~0.2 us for these tables, so ``tab`` is received once per question. Per-count lookups read
# the tables here and call the ``pack_*_ms`` kernels only beyond them.

@kernel
def iteration_seconds(tab, new, ctx, nb):
    """Seconds of one iteration: request ``i < nb`` computes ``new[i]`` tokens over ``ctx[i]``."""
    if tab.kind == CONSTANT:
        return tab.seconds
    if tab.kind == ROOFLINE:
        return roofline_iteration_seconds(tab.rf, new, ctx, nb)
    if nb == 0:
        return 0.0
    pk = tab.pk
    chunks = tab.pk_pre_chunks
    t_max = chunks[chunks.shape[0] - 1]
    n_pre = 0
    tokens = 0
    ctx_all = 0
    ctx_pre = 0
    split = False
    for i in range(nb):
        tokens += new[i]
        ctx_all += ctx[i]
        if new[i] != 1:
            n_pre += 1
            ctx_pre += ctx[i]
            if new[i] > t_max:
                split = True
    attn = np.empty(n_pre + 1)  # per-layer ms: the prefill rows, then the decodes together
    if n_pre < nb:
        kv = attn[n_pre:]
        kv[0] = float(ctx_all - ctx_pre)
        decode_lattice_into(nb - n_pre, kv, 1, kv, tab.pk_dec_grid, tab.pk_dec_table,
                            tab.pk_dec_batches, tab.pk_dec_beta, pk.far)
    cpu = tab.pk_cpu
    cpu_ms = cpu[nb] if nb < cpu.shape[0] else pack_cpu_ms(tab, nb)
    if n_pre == 0:
        dec = tab.pk_dec_const
        return pack_decode_s(pk, nb, dec[nb] if nb < dec.shape[0] else pack_dec_const_ms(tab, nb), cpu_ms, attn[0])
    grid = tab.pk_pre_grid
    flat = tab.pk_pre_flat
    k = 0
    for i in range(nb):
        if new[i] != 1:
            attn[k] = prefill_attention_ms(float(new[i]), float(ctx[i]), split, chunks, grid, flat, pk.far)
            k += 1
    lin = tab.pk_lin
    seq = tab.pk_seq
    ms = ((lin[tokens] if tokens < lin.shape[0] else pack_lin_ms(tab, tokens))
          + (seq[nb] if nb < seq.shape[0] else pack_seq_ms(tab, nb)))
    ms += pk.layers * np_sum(attn, n_pre)
    if n_pre < nb:
        ms += pk.layers * attn[n_pre]
    if not pack_in_graph(pk, nb, tokens, False):
        ms = max(ms, cpu_ms)
    return ms * 1e-3


@kernel
def decode_seconds(tab, num_seqs, context_sum, steps, out):
    """``out[:steps]``: ``steps`` pure-decode iterations of ``num_seqs`` sequences whose contexts
    sum to ``context_sum`` at the first and grow by ``num_seqs`` per step. Element ``j`` equals
    :func:`iteration_seconds` of any all-decode batch with that context total."""
    if tab.kind == CONSTANT:
        for j in range(steps):
            out[j] = tab.seconds
        return
    if tab.kind == ROOFLINE:
        roofline_decode_run(tab.rf, num_seqs, context_sum, steps, out)
        return
    if num_seqs <= 0:
        for j in range(steps):
            out[j] = 0.0
        return
    for j in range(steps):
        out[j] = float(context_sum + num_seqs * j)
    pk = tab.pk
    decode_lattice_into(num_seqs, out, steps, out, tab.pk_dec_grid, tab.pk_dec_table,
                        tab.pk_dec_batches, tab.pk_dec_beta, pk.far)
    dec = tab.pk_dec_const
    const_ms = dec[num_seqs] if num_seqs < dec.shape[0] else pack_dec_const_ms(tab, num_seqs)
    cpu = tab.pk_cpu
    cpu_ms = cpu[num_seqs] if num_seqs < cpu.shape[0] else pack_cpu_ms(tab, num_seqs)
    for j in range(steps):
        out[j] = pack_decode_s(pk, num_seqs, const_ms, cpu_ms, out[j])


# --- extrapolation accounting (servesim/perf/extrapolation.py) --------------------------------
#
# The engine calls these once per committed iteration or decode run (never for a planned step
# that is not run), so the counts are the run's own. Outside the grid means beyond the pack's
# measured range on that op's axis (below it the first measurement is used, which is not
# extrapolation): GEMM tokens of the iteration, decode batch, decode KV tokens per sequence,
# prefill chunk tokens, prefill cached context. A few comparisons per iteration.

@kernel(inline=True)
def ex_one(ex, kind, hit, seconds):
    if hit:
        ex[EX_N0 + kind] += 1.0
        ex[EX_S0 + kind] += seconds


@kernel(inline=True)
def ex_tally(ex, gemm, dec_b, dec_c, pre_t, pre_c, seconds):
    ex_one(ex, 0, gemm, seconds)
    ex_one(ex, 1, dec_b, seconds)
    ex_one(ex, 2, dec_c, seconds)
    ex_one(ex, 3, pre_t, seconds)
    ex_one(ex, 4, pre_c, seconds)
    ex_one(ex, EX_KINDS, gemm or dec_b or dec_c or pre_t or pre_c, seconds)
    ex[EX_TOTAL_N] += 1.0
    ex[EX_TOTAL_S] += seconds


@kernel
def count_iteration(tab, new, ctx, nb, seconds):
    """Tally one committed iteration (requests ``i < nb``: ``new[i]`` tokens over ``ctx[i]``,
    as :func:`iteration_seconds` saw them) that took ``seconds``."""
    ex = tab.pk_ex
    if tab.kind != PACK or ex.shape[0] < EX_LEN or nb == 0:
        return
    tokens = 0
    n_dec = 0
    kv = 0
    pre_t = False
    pre_c = False
    for i in range(nb):
        tokens += new[i]
        if new[i] == 1:
            n_dec += 1
            kv += ctx[i]
        else:
            if new[i] > ex[EX_PRE_CHUNK]:
                pre_t = True
            if ctx[i] > ex[EX_PRE_CTX]:
                pre_c = True
    dec_b = n_dec > 0 and n_dec > ex[EX_DEC_BATCH]
    dec_c = n_dec > 0 and kv / n_dec > ex[EX_DEC_CTX]
    ex_tally(ex, tokens > ex[EX_GEMM], dec_b, dec_c, pre_t, pre_c, seconds)


@kernel
def count_decode_run(tab, ids, computed, nb, k, t0, ends):
    """Tally ``k`` committed pure-decode steps of requests ``ids[:nb]`` (their cached tokens
    ``computed`` before the first step), step ``j`` ending at ``ends[j]`` (the first began at
    ``t0``), as :func:`decode_seconds` priced them."""
    ex = tab.pk_ex
    if tab.kind != PACK or ex.shape[0] < EX_LEN or nb == 0:
        return
    ctx_sum = 0
    for i in range(nb):
        ctx_sum += computed[ids[i]]
    gemm = nb > ex[EX_GEMM]
    dec_b = nb > ex[EX_DEC_BATCH]
    prev = t0
    for j in range(k):
        ex_tally(ex, gemm, dec_b, (ctx_sum + nb * j) / nb > ex[EX_DEC_CTX], False, False, ends[j] - prev)
        prev = ends[j]
