"""Derived packs for any model shape (dense, MoE, MLA) and precision on a measured GPU, from that
GPU's measured op curves: its bf16 packs and its op surveys (``calibration/surveys/<gpu>/``).

Why: a planner asks for Qwen3-30B-A3B, DeepSeek-V2-Lite or an FP8 Llama on an H200, and the only
measured packs there are bf16 dense decoders (plus llama-3-8b in FP8). Every op of those models
is a kernel the H200 *did* time -- a GEMM in another weight format, a grouped expert GEMM, a
decode over an FP8 or latent KV cache -- in the surveys. The rules, op family by op family (their
held-out errors: calibration/VALIDATION.md, "Derived packs for precisions, experts and latent
attention"):

* **Weight formats**: the layer GEMMs (qkv, o, gate_up, down) of the bf16 pack in the format.
  FP8 (W8A8): ``t_fp8 = a + b M K + alpha t_bf16`` (:class:`Fp8Rule`: the activation's
  quantization -- a launch floor and a pass over the ``M x K`` activation -- plus the FP8 GEMM as a
  share of the bf16 one), three constants fitted on every surveyed GEMM point; FP8 is slower than
  bf16 on narrow GEMMs below ~1K tokens on this stack, and a plain ratio does not carry that across
  GEMM widths. int4 weight-only (awq/gptq): the survey's ratio ``t_int4 / t_bf16`` at the same
  tokens (interpolated in ``log M``, inverse-distance weighted in ``(log K, log N)`` over the
  surveyed shapes); the survey's tinygemm W4A16 is a GEMV kernel that loses to bf16 from 16 tokens
  on, engines switch kernels there, so the ratio is capped at 1 (dequantization not counted). lm_head and
  the element-wise ops stay as measured in bf16 (vLLM does not quantize lm_head; the measured
  FP8 pack's element-wise ops are within 4 % of the bf16 pack's). int8 is refused: its surveyed
  kernel (``torch._int_mm`` + a dequantizing multiply) is 1.3-2.6x slower than bf16 everywhere,
  not an engine-class kernel.
* **FP8 KV cache**: decode attention x the survey's ``triton-fp8 / triton-bf16`` ratio at the
  same (batch, context) (bilinear in log batch, log context; held at the grid's edges); prefill
  attention unchanged (it reads the new chunk in bf16). The rule lives in
  :mod:`servesim.perf.kvfp8`: runs apply it at selection time to the pack of the model's own KV
  dtype, so a derived kvfp8 pack and a run without one agree.
* **Experts** (``moe_gate``, ``moe_experts``, ``moe_combine``): the experts' time is its roofline
  over the expected work -- weights of the ``E (1 - (1 - k/E)^M)`` experts hit by ``M`` tokens
  plus the routed activations at the HBM peak, ``2 M k 3 h I x imbalance`` FLOPs at the bf16 peak
  -- divided by an efficiency read from the MoE survey (its most engine-like experts backend:
  the fused MoE Triton kernel where surveyed, on this GPU or, carried over by efficiency, on
  another of its architecture; :func:`servesim.tools.derive_moe.moe_survey`) at the same tokens per expert
  ``M k / E`` (interpolated in log), inverse-distance weighted (power 2) over the surveyed
  configurations in ``(log 3hI, log E)``. ``imbalance`` (default 1: the survey's uniform routing)
  scales the compute term: the busiest expert's tokens set a grouped GEMM's time. Router and
  combine are bandwidth-bound per token: ``t(M) = t_src(M w / w_src)`` with widths ``h + E`` and
  ``k h``. Shared experts run as a dense MLP (GEMMs by the dense rule, activation by width) added
  to ``moe_experts``; DeepSeek's dense first layers are folded in by their share of the layers
  (a pack times every layer alike, and the iteration is linear in the per-layer ops, so the sum
  is exact). Under TP each expert's intermediate is sharded ``I / tp`` (vLLM's default).
* **Latent attention (MLA)**: ``qkv_proj`` is the sum of the low-rank query path, the fused KV
  down-projection (both replicated on every rank) and the KV up-projection (whose weights equal
  the absorbed decode form's), each by the dense GEMM rule; ``o_proj`` is ``heads v_head_dim ->
  hidden``; rope and the latent KV write by width. Decode attention is the MLA survey at the
  rank's head count (16 or 128 measured; log-interpolated between) with the context scaled by
  the latent width over the survey's 576; below the survey's shortest context (1,024) it is
  extended linearly with the 1K-4K slope. Prefill attention is multi-head attention over
  ``qk = nope + rope`` and ``v`` head dims: the bf16 pack's prefill above its launch floor scaled
  by ``heads (qk + v) / (heads_src 2 head_dim_src)``. MLA's two small RMSNorms (on the q and kv
  latents) are not timed. The MLA survey ran a Triton kernel
  (FlashMLA, which engines use on Hopper, is faster at 128 heads): an upper bound there.

* **Eager CPU floor** (MoE and MLA only): the base's launch time x the ratio of kernel launches per
  forward (:mod:`servesim.tools.derive_launches`); dense and precision variants keep the base's
  ``overhead_eager`` rows x the layer ratio.

Every derived pack says ``source: derived`` and names its sources in ``origin``
(``derived from h200/llama-3-8b + surveys ...``), which the run header prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from servesim.errors import PackError
from servesim.models import ModelShape
from servesim.perf.kvfp8 import GridRatio, fp8_decode_ms  # noqa: F401 (the FP8 KV rule; re-exported)
from servesim.perf.pack import MLA_SHAPE_KEYS, MOE_SHAPE_KEYS, SHAPE_KEYS, WEIGHT_DTYPES, Pack
from servesim.tools.derive_common import IDW_POWER, _idw, _interp_log, read_survey, survey_root  # noqa: F401
from servesim.tools.derive_moe import MoeRule, MoeShape, moe_layer_rows, moe_survey  # noqa: F401 (re-exported)

#: layer GEMMs a weight format changes (lm_head stays bf16 in vLLM's FP8/AWQ/GPTQ checkpoints)
PRECISION_GEMM_OPS: tuple[str, ...] = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
#: the survey variant that times each quantization's GEMMs
SURVEY_VARIANT: dict[str, str] = {"fp8": "fp8", "awq": "int4", "gptq": "int4"}
SURVEY_LATENT = 576  # the MLA survey's cached values per token (latent 512 + rope 64)


# --- GEMMs per weight format ------------------------------------------------------------------

class GemmRatio:
    """``t_variant / t_bf16`` of a ``[M, K] @ [K, N]`` GEMM from the GEMM survey (rule: module doc)."""

    def __init__(self, gemm: pd.DataFrame, variant: str, cap: Optional[float] = None,
                 exclude: tuple[tuple[int, int], ...] = ()):
        if variant not in set(gemm.variant):
            raise PackError(f"GEMM survey has no variant '{variant}'; it has: {', '.join(sorted(set(gemm.variant)))}")
        self.variant, self.cap = variant, cap
        self.shapes = []
        for (n, k), g in gemm.groupby(["n", "k"]):
            if (int(k), int(n)) in exclude:
                continue
            p = g.pivot_table(index="tokens", columns="variant", values="time_ms")
            r = (p[variant] / p["bf16"]).dropna()
            self.shapes.append((int(k), int(n), r.index.to_numpy(np.float64), r.to_numpy(np.float64)))
        if not self.shapes:
            raise PackError("GEMM survey: no shape left to derive a ratio from")

    def __call__(self, K: float, N: float, M) -> np.ndarray:
        M = np.atleast_1d(np.asarray(M, np.float64))
        d = np.array([np.hypot(np.log(k / K), np.log(n / N)) for k, n, _, _ in self.shapes])
        w = _idw(d)
        r = sum(wi * _interp_log(M, x, y) for wi, (_, _, x, y) in zip(w, self.shapes)) / w.sum()
        return np.minimum(r, self.cap) if self.cap is not None else r


    def time(self, K: float, N: float, M, t_bf16) -> np.ndarray:
        """The format's time of a GEMM whose bf16 time is ``t_bf16`` at ``M`` tokens."""
        return np.asarray(t_bf16, np.float64) * self(K, N, M)


class Fp8Rule:
    """FP8 (W8A8, dynamic per-tensor activation scale) GEMM time from the bf16 one:
    ``t_fp8 = a + b M K + alpha t_bf16``, fitted by least squares on relative error over every
    surveyed (shape, tokens) point. ``a``: the activation quantization's launch floor; ``b M K``:
    its pass over the ``M x K`` activation; ``alpha``: the FP8 GEMM as a share of the bf16 one.
    Why not a ratio: the ratio depends on the GEMM's width (0.6 on a wide GEMM at 16K tokens, 2 on
    a narrow one below 1K: the fixed quantization cost over a short GEMM), which a ratio
    interpolated between three shapes does not carry (leave one shape out: 16-77 % median, this
    rule 4-9 %; calibration/VALIDATION.md)."""

    variant = "fp8"
    cap = None

    def __init__(self, gemm: pd.DataFrame, exclude: tuple[tuple[int, int], ...] = ()):
        p = gemm.pivot_table(index=["n", "k", "tokens"], columns="variant", values="time_ms").reset_index()
        keep = ~np.array([(int(k), int(n)) in exclude for n, k in zip(p.n, p.k)], bool)
        p = p[keep].dropna(subset=["bf16", "fp8"])
        if p.empty:
            raise PackError("GEMM survey: no fp8 points left to fit the FP8 rule on")
        X = np.c_[np.ones(len(p)), p.tokens.to_numpy(np.float64) * p.k.to_numpy(np.float64) / 1e6,
                  p.bf16.to_numpy(np.float64)]
        y = p.fp8.to_numpy(np.float64)
        coef, *_ = np.linalg.lstsq(X / y[:, None], np.ones_like(y), rcond=None)
        self.a, self.b, self.alpha = (float(c) for c in coef)
        self.points = int(len(p))

    def time(self, K: float, N: float, M, t_bf16) -> np.ndarray:
        M = np.asarray(M, np.float64)
        t = self.a + self.b * M * K / 1e6 + self.alpha * np.asarray(t_bf16, np.float64)
        return np.maximum(t, 0.25 * np.asarray(t_bf16, np.float64))

    def describe(self) -> str:
        return (f"t_fp8 = {self.a:.4f} ms + {self.b:.4f} ms x M K / 1e6 + {self.alpha:.3f} t_bf16 (fitted on "
                f"{self.points} survey points)")


def gemm_ratio(gpu: str, quantization: str, exclude=()) -> GemmRatio:
    if quantization not in SURVEY_VARIANT:
        why = (" (the surveyed int8 kernel, torch._int_mm + a dequantizing multiply, is 1.3-2.6x slower "
               "than bf16 at every size: not an engine-class kernel)" if quantization == "int8" else "")
        raise PackError(f"quantization {quantization!r} cannot be derived{why}; allowed: "
                        f"{', '.join(SURVEY_VARIANT)}")
    variant = SURVEY_VARIANT[quantization]
    return GemmRatio(read_survey(gpu, "gemm"), variant, cap=1.0 if variant == "int4" else None, exclude=exclude)


def weight_rule(gpu: str, quantization: str, exclude=()):
    """The rule that turns a bf16 GEMM time into ``quantization``'s: :class:`Fp8Rule` for fp8,
    the capped survey ratio (:class:`GemmRatio`) for int4; one-line refusal otherwise."""
    if quantization == "fp8":
        return Fp8Rule(read_survey(gpu, "gemm"), exclude=exclude)
    return gemm_ratio(gpu, quantization, exclude=exclude)


# --- latent attention --------------------------------------------------------------------------

def mla_gemms(shape: ModelShape, tp: int) -> dict[str, list[tuple[int, int]]]:
    """(K, N) of each GEMM of an MLA layer's ``qkv_proj`` and ``o_proj`` on one rank."""
    H = max(1, shape.num_heads // tp)
    h, q, c = shape.hidden_size, shape.q_lora_rank, shape.kv_lora_rank
    qk = shape.qk_nope_head_dim + shape.qk_rope_head_dim
    qkv = ([(h, q), (q, H * qk)] if q else [(h, H * qk)])
    qkv += [(h, c + shape.qk_rope_head_dim), (c, H * (shape.qk_nope_head_dim + shape.v_head_dim))]
    return {"qkv_proj": qkv, "o_proj": [(H * shape.v_head_dim, h)]}


def mla_decode_rows(mla: pd.DataFrame, shape: ModelShape, tp: int, kv_variant: str,
                    contexts: np.ndarray, floor_pack: Optional[Pack] = None) -> pd.DataFrame:
    """Decode attention rows (batch, context, time_ms) of an MLA rank from the MLA survey."""
    H = max(1, shape.num_heads // tp)
    scale = (shape.kv_lora_rank + shape.qk_rope_head_dim) / SURVEY_LATENT
    s = mla[mla.variant == kv_variant]
    heads = np.array(sorted(set(s.n)), np.float64)
    tabs = {int(n): g.pivot_table(index="batch", columns="context", values="time_ms") for n, g in s.groupby("n")}
    out = []
    for b in tabs[int(heads[0])].index:
        per_head = []
        if min(tabs[int(n)].loc[b].notna().sum() for n in heads) < 2:
            continue  # fewer than two contexts measured at this batch (memory)
        for n in heads:
            row = tabs[int(n)].loc[b].dropna()  # long contexts stop short at large batches
            c_s, y = row.index.to_numpy(np.float64), row.to_numpy(np.float64)
            c = np.asarray(contexts, np.float64) * scale
            slope = (y[1] - y[0]) / (c_s[1] - c_s[0])
            t = np.interp(c, c_s, y)
            lo = c < c_s[0]
            t[lo] = y[0] - slope * (c_s[0] - c[lo])
            hi = c > c_s[-1]
            t[hi] = y[-1] + (y[-1] - y[-2]) / (c_s[-1] - c_s[-2]) * (c[hi] - c_s[-1])
            per_head.append(t)
        per_head = np.array(per_head)
        if len(heads) == 1:
            t = per_head[0]
        else:
            lt = np.array([np.interp(np.log(H), np.log(heads), np.log(per_head[:, j]))
                           for j in range(per_head.shape[1])])
            t = np.exp(lt)
        out.append(pd.DataFrame({"batch": int(b), "context": np.asarray(contexts, np.int64), "time_ms": t}))
    df = pd.concat(out, ignore_index=True)
    floor = float(s.time_ms.min()) * 0.25
    if floor_pack is not None:  # never below the measured GQA decode floor of this GPU
        floor = float(floor_pack.rows("attn_decode").time_ms.min())
    df["time_ms"] = np.maximum(df["time_ms"], floor)
    return df


# --- whole packs -------------------------------------------------------------------------------

def _shape_meta(shape: ModelShape) -> dict:
    keys = SHAPE_KEYS
    if shape.is_moe:
        keys += MOE_SHAPE_KEYS + ("shared_expert_intermediate_size", "num_dense_layers")
    if shape.is_mla:
        keys += MLA_SHAPE_KEYS
    return {k: int(getattr(shape, k)) for k in keys}


def derive_any(gpu: str, shape: ModelShape, tp: int, source_packs: list[Pack], imbalance: float = 1.0,
               moe_exclude: Optional[MoeShape] = None, gemm_exclude=()) -> tuple[list[tuple], dict]:
    """Rows and YAML metadata of a derived pack of ``shape`` (any kind, in its precision) on
    ``gpu`` from the GPU's bf16 dense packs (``source_packs``) and its surveys."""
    from servesim.tools.derive import OpTransfer, sources_from_pack
    from servesim.tools.derived_packs import from_measured_pack

    if any(p.gpu != gpu for p in source_packs):
        raise PackError(f"source packs must be of gpu {gpu}")
    if not imbalance >= 1.0:
        raise PackError(f"moe imbalance {imbalance!r} is not allowed; allowed: >= 1 (1: uniform routing)")
    base_name = shape.name
    dense_rows, meta = from_measured_pack(source_packs, base_name, tp, shape=shape)
    base = next((p for p in source_packs if p.tp == tp), source_packs[0])
    transfer = OpTransfer([sources_from_pack(p) for p in source_packs], gpu)
    rules = dict(meta["derived"])
    surveys, sibling = [], ""
    rows = list(dense_rows)
    grid = np.unique(base.rows("qkv_proj").tokens).astype(np.float64)

    def replace(op_rows: list[tuple], ops: tuple[str, ...]):
        nonlocal rows
        rows = [r for r in rows if r[0] not in ops] + op_rows

    if shape.is_mla:
        gemms = mla_gemms(shape, tp)
        new = []
        for op, shapes in gemms.items():
            t = sum(transfer.gemm_ms(K, N, grid) for K, N in shapes)
            new += [(op, int(m), 0, 0, 0, float(x), None) for m, x in zip(grid, t)]
            rules[op] = (f"MLA: sum of GEMMs (K, N) {shapes} by the dense GEMM rule")
        H = max(1, shape.num_heads // tp)
        r = shape.qk_rope_head_dim
        for op, width in (("rope", (H + 1) * r), ("kv_write", shape.kv_lora_rank + r)):
            t = transfer.width_ms(op, width, grid)
            new += [(op, int(m), 0, 0, 0, float(x), None) for m, x in zip(grid, t)]
            rules[op] = f"MLA: bandwidth-bound, width {width}"
        kv_variant = "triton-fp8" if shape.kv_cache_dtype != "auto" else "triton-bf16"
        contexts = np.unique(base.rows("attn_decode").context)
        dec = mla_decode_rows(read_survey(gpu, "mla"), shape, tp, kv_variant, contexts, floor_pack=base)
        new += [("attn_decode", 0, int(x.batch), int(x.context), 0, float(x.time_ms), None)
                for x in dec.itertuples(index=False)]
        pre = base.rows("attn_prefill")
        src_h = max(1, base.shape().num_heads // base.tp)
        rho = H * (shape.qk_nope_head_dim + r + shape.v_head_dim) / (src_h * 2 * base.shape().head_dim)
        f = float(pre.time_ms.min())
        new += [("attn_prefill", int(tk), 0, int(c), 0, float(f + rho * (t - f)), None)
                for tk, c, t in zip(pre.tokens, pre.context, pre.time_ms)]
        replace(new, ("qkv_proj", "o_proj", "rope", "kv_write", "attn_decode", "attn_prefill"))
        rules["attn_decode"] = (f"MLA survey ({kv_variant}, {H} heads per rank; latent {shape.kv_lora_rank} + "
                                f"rope {r} vs the survey's {SURVEY_LATENT}); below 1,024 tokens of context "
                                f"linear with the 1K-4K slope")
        rules["attn_prefill"] = (f"{base.gpu}/{base.stem} prefill above its floor x {rho:.3f} (MHA over "
                                 f"qk {shape.qk_nope_head_dim + r} / v {shape.v_head_dim}, {H} heads)")
        surveys.append("mla")
    if shape.is_moe:
        survey, backend, survey_gpu = moe_survey(gpu)
        rule = MoeRule(survey, gpu, exclude=moe_exclude, survey_gpu=survey_gpu)
        new, notes = moe_layer_rows(rule, transfer, shape, tp, grid, imbalance)
        notes["moe_experts"] += f" (survey backend {backend}" + (
            f", timed on {survey_gpu}, carried over by efficiency)" if survey_gpu != gpu else ")")
        replace(new, ("gate_up_proj", "act", "down_proj"))
        rules.update(notes)
        for op in ("gate_up_proj", "act", "down_proj"):
            rules.pop(op, None)
        if survey_gpu == gpu:
            surveys.append("moe")
        else:
            sibling = f" + survey {survey_gpu}/moe ({backend}, by efficiency)"
    if shape.quantization != "none":
        rule = weight_rule(gpu, shape.quantization, exclude=gemm_exclude)
        rows = apply_weight_ratio(rows, shape, tp, rule)
        how = (rule.describe() if isinstance(rule, Fp8Rule) else
               f"x (survey {rule.variant} / bf16) at the same tokens, IDW over the surveyed shapes"
               + (", capped at 1" if rule.cap else ""))
        rules["precision"] = (f"{shape.quantization}: layer GEMMs {how}; lm_head and element-wise ops bf16")
        surveys.append("gemm")
    if shape.kv_cache_dtype != "auto" and not shape.is_mla:
        from servesim.perf.kvfp8 import BF16, FP8

        kr = GridRatio(read_survey(gpu, "decode_kv"), FP8, BF16)  # the run-time rule's function
        rows = [(op, tk, b, c, n, float(fp8_decode_ms(b, c, [t], kr)[0]) if op == "attn_decode" else t, s)
                for op, tk, b, c, n, t, s in rows]
        rules["kv_cache_dtype"] = ("fp8: decode attention x (survey triton-fp8 / triton-bf16) at the same "
                                   "(batch, context); prefill attention unchanged")
        surveys.append("decode_kv")
    origin = meta["origin"]
    if surveys:
        origin += f" + surveys {gpu}/{{{','.join(sorted(set(surveys)))}}} (calibration/surveys)"
    origin += sibling
    meta.update(
        model=shape.name, dtype=WEIGHT_DTYPES.get(shape.quantization, "bf16"), quantization=shape.quantization,
        kv_cache_dtype=shape.kv_cache_dtype, shape=_shape_meta(shape), origin=origin, derived=rules,
        method=("servesim/tools/derive_variants.py (rules in its module doc); held-out errors in "
                "calibration/VALIDATION.md, 'Derived packs for precisions, experts and latent attention'"),
    )
    if shape.is_moe:
        meta["moe_imbalance"] = float(imbalance)
    if shape.is_moe or shape.is_mla:  # more launches per layer than the dense base: its CPU floor scaled
        from servesim.tools.derive_launches import eager_rows

        rows, rules["overhead_eager"] = eager_rows(rows, meta, shape, tp, base)
        rules.pop("overheads", None)
        rules["overhead_cuda_graph"] = f"rows of {base.gpu}/{base.stem} x layer ratio (graph gaps)"
    return rows, meta


def apply_weight_ratio(rows: list[tuple], shape: ModelShape, tp: int, rule) -> list[tuple]:
    """Layer GEMM rows in the format by ``rule.time`` at each op's (K, N) (MLA: its largest GEMM;
    experts: the expert's gate_up with the routed tokens, at the tokens per hit expert)."""
    from servesim.perf.dims import RankDims

    dims = RankDims.of_shape(shape, tp)
    kn = {op: dims.gemm(op) for op in PRECISION_GEMM_OPS}
    if shape.is_mla:
        for op, shapes in mla_gemms(shape, tp).items():
            kn[op] = max(shapes, key=lambda s: s[0] * s[1])
    out = []
    for op, tk, b, c, n, t, s in rows:
        if op in kn:
            t = float(rule.time(*kn[op], [tk], [t])[0])
        elif op == "moe_experts":
            cfg = MoeShape.of(shape, tp)
            hit = cfg.experts * (1 - (1 - cfg.top_k / cfg.experts) ** tk)
            per = max(1.0, tk * cfg.top_k / hit)  # tokens per hit expert
            if isinstance(rule, Fp8Rule):  # one quantization of the routed activations, then the GEMMs
                t = float(rule.time(cfg.hidden, 2 * cfg.inter, [tk * cfg.top_k], [t])[0])
            else:
                t = t * float(rule(cfg.hidden, 2 * cfg.inter, [per])[0])
        out.append((op, tk, b, c, n, t, s))
    return out


def source_packs_for(gpu: str, shape: ModelShape) -> list[Pack]:
    """The bf16 packs a derivation reads: the model's own measured bf16 packs on ``gpu`` when they
    exist (a precision variant of a measured model), else llama-3-8b's (every TP measured)."""
    from servesim.perf.pack import available_packs, load_pack

    have = [(m, t) for g, m, t in available_packs() if g == gpu]
    own = [t for m, t in have if m == shape.name]
    name = shape.name if own and not shape.is_moe and not shape.is_mla else "llama-3-8b"
    packs = [load_pack(gpu, name, t) for m, t in have if m == name]
    packs = [p for p in packs if p.meta.get("source") != "derived"]
    if not packs:
        raise PackError(f"no measured bf16 pack of {name} on {gpu} to derive from")
    return packs


def collective_tps(gpu: str) -> list[int]:
    """TP degrees a derived pack of ``gpu`` can price: 1, and those its measured packs hold
    all-reduce rows for (a derived pack copies them: keyed by bytes, model-independent)."""
    from servesim.perf.pack import available_packs, load_pack

    tps = {1}
    for g, m, t in available_packs():
        if g == gpu:
            p = load_pack(g, m, t)
            if p.meta.get("source") == "measured" and p.has("all_reduce"):
                tps.update(int(b) for b in p.rows("all_reduce").batch)
    return sorted(tps)


def check_tps(gpu: str, tps: list[int]) -> None:
    have = collective_tps(gpu)
    bad = [t for t in tps if t not in have]
    if bad:
        raise PackError(f"--tp {bad[0]}: {gpu} has no measured all-reduce over {bad[0]} GPUs for a derived "
                        f"pack to copy; allowed: {', '.join(map(str, have))}")


def write_derived(gpu: str, out: Path, models: list[str], tps: list[int], quantization: Optional[str] = None,
                  kv_cache_dtype: str = "auto", imbalance: float = 1.0) -> list[Path]:
    """Derived packs of library ``models`` (any kind) in a precision on ``gpu``; ``quantization``
    None: each model's checkpoint format."""
    from servesim.models import MODELS, with_precision
    from servesim.perf.pack import pack_stem, write_pack

    check_tps(gpu, tps)
    written, held = [], {}
    for model in models:
        base = MODELS[model]
        shape = with_precision(base, quantization or base.quantization, kv_cache_dtype)
        for tp in tps:
            if shape.num_heads % tp or (shape.moe_intermediate_size or shape.intermediate_size) % tp:
                continue
            sources = source_packs_for(gpu, shape)
            rows, meta = derive_any(gpu, shape, tp, sources, imbalance=imbalance)
            key = (shape.name, shape.quantization, shape.kv_cache_dtype, sources[0].model != shape.name)
            if key not in held:
                from servesim.tools.derive_checks import held_out_summary

                held[key] = held_out_summary(gpu, shape, cross_model=key[-1])
            meta["held_out_error"] = held[key]
            args = (f" --quantization {shape.quantization}" if shape.quantization != "none" else "") + \
                   (f" --kv-cache-dtype {kv_cache_dtype}" if kv_cache_dtype != "auto" else "") + \
                   (f" --moe-imbalance {imbalance:g}" if shape.is_moe and imbalance != 1.0 else "")
            meta["command"] = f"servesim calibrate derive --gpu {gpu} --model {model} --tp {tp}{args}"
            meta["notes"] = ("Nothing of this model in this precision was measured on this GPU: its ops are "
                             "derived from the GPU's measured packs and op surveys (rules: "
                             "servesim/tools/derive_variants.py; held-out errors: calibration/VALIDATION.md).")
            path = Path(out) / gpu / f"{pack_stem(shape, tp)}.csv"
            write_pack(rows, meta, path)
            # the efficiency summary every pack YAML records (servesim calibrate efficiency --write)
            from servesim.perf.efficiency import pack_efficiency
            from servesim.perf.pack import read_pack

            meta["efficiency"] = pack_efficiency(read_pack(path))
            write_pack(rows, meta, path)
            written.append(path)
    return written
