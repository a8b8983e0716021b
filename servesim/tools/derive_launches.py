"""The eager CPU floor of a derived MoE or MLA pack: the base's launch time x the ratio of kernel
launches per forward.

Why: an eager iteration costs ``max(kernels, C(b))`` (servesim/perf/packmodel.py), ``C(b)`` the
CPU's time to launch one forward. A derived pack used to carry its base's ``overhead_eager``
rows (llama-3-8b's) scaled by the layer ratio, i.e. the launch time of a dense layer. An MoE or MLA
layer launches far more kernels: in vLLM v0.6.4, a Llama layer 10, a DeepSeek-V2 layer 53
(``ENGINE`` below). DeepSeek-V2-Lite's derived pack therefore priced an eager decode step at
~19 ms on the H200 where the CPU needs several times the dense floor, and the published eager run
of vLLM PR #10927 came out 1.8x too fast (docs/models.md, "MoE and MLA on one GPU").

The rule: ``C_t(b) = (N_t / N_b) F_b(b)``, where ``N`` is the kernel launches of one forward
(layers x launches per layer + the fixed head) of the engine's model code for the target and for
the base, and ``F_b(b)`` the base pack's launch time at batch ``b``: its eager calibration wall
where that forward was CPU-bound (``overhead_eager >= 0.25 x kernels``, servesim/perf/packmodel.py's
test), else the CPU-bound walls' line continued (least-squares slope, >= 0) -- a GPU-bound wall
holds GPU time, which does not scale with launches. The derived rows are ``overhead_eager(b) =
max(C_t(b) - kernels_t(b), g(b))``, so the pack model's ``C = kernels + overhead_eager`` gives back
``C_t`` where the target is CPU-bound, and its kernels plus ``g`` where it is not (``g``: the
base's rows scaled by the layer ratio, the rule before: a GPU-bound forward's excess is its gaps).

Held-out (:func:`launch_rule_check`): the H200 profiler's own forwards, counted the same way
(``PROFILER``), each pack's CPU-bound walls predicted from llama-3-8b's: calibration/VALIDATION.md,
"Eager floor of derived packs". A launch is not a fixed CPU cost (a GEMM or an attention call costs
the CPU more than an element-wise op), so the rule over-predicts a forward whose extra launches are
cheap element-wise ops (the profiler's unfused FP8 quantization) and is close where they are routing
and grouped GEMMs (the profiler's MoE layer). Precision variants keep their base's rows: vLLM's FP8
linear adds one fused quantization per GEMM, and the bf16 rows were validated on FP8 forwards
(docs/models.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from servesim.models import ModelShape
from servesim.perf.packmodel import PackStepModel, cpu_bound_walls

#: the engine version whose model code the launch counts are read from
ENGINE_VERSION = "vLLM v0.6.4 (the engine of the published eager run, vLLM PR #10927)"
#: the test of a CPU-bound calibration forward, the pack model's (servesim/perf/packmodel.py)
CPU_BOUND_SHARE = PackStepModel.CPU_BOUND_SHARE


@dataclass(frozen=True)
class LaunchCounts:
    """Kernel launches of one eager forward, by block (CUDA, one rank, unquantized)."""

    norms: int  # input and post-attention RMSNorm per layer
    dense_attention: int  # a GQA layer's attention block
    mla_attention: int  # an MLA layer's attention block (q_lora_rank absent)
    mla_q_lora: int  # added when the query is low-rank (q_a_proj + q_a_layernorm)
    dense_mlp: int
    moe_experts: int  # router GEMM + fused experts (align, two GEMMs, activation, sum)
    topk: int  # softmax top-k routing
    grouped_topk: int  # DeepSeek's group-limited routing (+ the routed scaling multiply)
    shared_experts: int  # a dense MLP + its add
    tp_all_reduce: int  # per layer under TP > 1
    fixed: int  # embedding, final norm, lm_head

    def per_layer(self, shape: ModelShape, tp: int, dense: bool = False) -> int:
        if shape.is_mla:
            attn = self.mla_attention + (self.mla_q_lora if shape.q_lora_rank else 0)
        else:
            attn = self.dense_attention
        if shape.is_moe and not dense:
            mlp = self.moe_experts + (self.grouped_topk if shape.is_mla else self.topk)
            mlp += self.shared_experts if shape.shared_expert_intermediate_size else 0
        else:
            mlp = self.dense_mlp
        return self.norms + attn + mlp + (self.tp_all_reduce if tp > 1 else 0)

    def per_forward(self, shape: ModelShape, tp: int) -> int:
        d = shape.num_dense_layers if shape.is_moe else 0
        return (d * self.per_layer(shape, tp, dense=True)
                + (shape.num_layers - d) * self.per_layer(shape, tp) + self.fixed)


#: vLLM v0.6.4, read from its model code (vllm/model_executor/models/llama.py, deepseek_v2.py;
#: layers/fused_moe/fused_moe.py, layers/rotary_embedding.py). Views and allocations launch
#: nothing and are not counted.
#: * Llama layer, 10: input (fused_add_)rms_norm; qkv_proj, rotary_embedding (one custom op),
#:   reshape_and_cache + attention, o_proj; post-attention norm; gate_up_proj, silu_and_mul,
#:   down_proj.
#: * DeepseekV2Attention (q_lora_rank None), 27: q_proj, kv_a_proj_with_mqa, kv_a.contiguous(),
#:   kv_a_layernorm, kv_b_proj; DeepseekScalingRotaryEmbedding.forward in PyTorch, 13 (the
#:   cos/sin gather, two repeat_interleave, and per q and k: a GPT-J rotation (neg, stack), two
#:   multiplies and an add); the q_pe copy into q, two copies into the new k, v's pad (2: fill and
#:   copy), reshape_and_cache + attention, the output slice's copy, o_proj. q_lora_rank set: +2.
#:   (PR #10927's MLA branch replaces the attention calls with a latent cache write, FlashInfer's
#:   MLA decode and the absorbed up-projections: about as many launches; its code is unreleased.)
#: * FusedMoE: router GEMM 1; fused_experts 6 (sorted_ids fill, moe_align_block_size, two
#:   fused_moe_kernel, silu_and_mul, moe_sum); fused_topk 3 (topk_softmax, renormalize: sum,
#:   divide); DeepSeek-V2's grouped_topk 13 (softmax, group max, group topk, zeros + scatter,
#:   the mask's expand copy, bool + not + masked_fill, topk, two dtype casts; routed scaling
#:   multiply); shared experts 4 (gate_up, silu_and_mul, down, add).
ENGINE = LaunchCounts(norms=2, dense_attention=5, mla_attention=27, mla_q_lora=2, dense_mlp=3,
                      moe_experts=7, topk=3, grouped_topk=13, shared_experts=4, tp_all_reduce=2,
                      fixed=3)

#: The H200 profiler's eager forwards (calibration/profiler/forward.py), counted on CPU by a
#: TorchDispatchMode that counts every aten op but views and allocations (torch 2.13 CPU; one
#: layer = the difference between 3 and 1 layers), with F.rms_norm as 1 launch (CUDA's fused
#: ``_fused_rms_norm`` kernel, PyTorch PR #153666, in the measured torch 2.11; on CPU it decomposes
#: into 8 ops). Dense layer 19; FP8 weights (QLinear: activation abs, amax, clamp, two divides,
#: casts, _scaled_mm) 47; FP8 weights with a static activation scale (fp8_static: each linear one
#: _scaled_mm on an e4m3 input; one cast kernel after each of the two norms and the act multiply;
#: the attention's output copy stores e4m3 itself) 22; MoE layer (router,
#: bias, softmax, top-k, renormalize, sort, gather, counts, cumsum, two grouped GEMMs, activation,
#: weighted index_add combine) 40.
PROFILER_PER_LAYER = {"dense": 19, "fp8": 47, "fp8_static": 22, "moe": 40}
PROFILER_FIXED = 4  # embedding, row gather, final norm, lm_head


def profiler_launches(shape: dict, weights: str = "bf16") -> int:
    """Launches of one profiler forward of a pack's ``shape`` (its YAML ``shape``)."""
    kind = "moe" if shape.get("num_experts") else (weights if weights in ("fp8", "fp8_static") else "dense")
    return int(shape["num_layers"]) * PROFILER_PER_LAYER[kind] + PROFILER_FIXED


def launch_ratio(shape: ModelShape, tp: int, base: ModelShape) -> float:
    """``N_t / N_b`` of the engine's forwards (``ENGINE``)."""
    return ENGINE.per_forward(shape, tp) / ENGINE.per_forward(base, tp)


def launch_floor(batches, kernels, over) -> np.ndarray:
    """The launch time at calibration batches from (kernels, overhead) pairs, by the pack model's
    eager floor rule (``PackStepModel._cpu_floor_curve``): the wall where the forward was
    CPU-bound, else the CPU-bound walls' line continued (slope >= 0), never above the wall; with
    no CPU-bound row, the walls. For walls read from a YAML (the held-out check), not a pack."""
    b = np.asarray(batches, np.float64)
    wall = np.asarray(kernels, np.float64) + np.asarray(over, np.float64)
    cpu_bound = cpu_bound_walls(b, kernels, over)
    if cpu_bound is None:
        return wall
    xs, ys, slope = cpu_bound
    f = np.interp(b, xs, ys) + slope * np.maximum(b - xs[-1], 0.0)
    return np.minimum(f, wall)


def forward_kernels_ms(model, batches, c0: float) -> np.ndarray:
    """GPU kernels of a decode calibration forward (batch ``b``, ``c0`` tokens of context each)
    by a pack model's parts (what ``overhead_eager`` rows are measured against)."""
    out = []
    for b in batches:
        br = model.breakdown_ms(np.ones(int(b), np.int64), np.full(int(b), c0))
        out.append(br["linear_ops"] + br["lm_head+final_norm"] + br["attn_decode"])
    return np.array(out)


def eager_rows(rows: list[tuple], meta: dict, shape: ModelShape, tp: int, base) -> tuple[list[tuple], str]:
    """``rows`` with ``overhead_eager`` replaced by the launch rule (module doc); ``base`` the
    source pack the rows were derived from. Returns the rows and the rule's note."""
    import tempfile

    from servesim.perf.pack import read_pack, write_pack
    from servesim.perf.packtables import pool_median

    c0 = float((base.meta.get("overhead") or {}).get("calibration_context", 0) or 0)
    b, _ = pool_median(base.rows("overhead_eager").batch, base.rows("overhead_eager").time_ms)
    # the base's launch time: the pack model's own eager floor rule (CPU-bound walls, their line on)
    floor = PackStepModel(base, base.shape(), tp=base.tp).curves["cpu_floor"](b)
    s = launch_ratio(shape, tp, base.shape())
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{shape.name}.csv"
        write_pack(rows, meta, path)
        kt = forward_kernels_ms(PackStepModel(read_pack(path), shape, tp=tp), b, c0)
    old = [(x[2], x[5]) for x in rows if x[0] == "overhead_eager"]
    prev = dict(zip(*pool_median([x for x, _ in old], [t for _, t in old]))) if old else {}
    gaps = np.array([prev.get(float(x), 0.0) for x in b])  # a GPU-bound forward's excess: the old rows
    new = np.maximum(s * floor - kt, np.maximum(gaps, 1e-3))
    rows = [x for x in rows if x[0] != "overhead_eager"]
    rows += [("overhead_eager", 0, int(x), 0, 0, float(t), None) for x, t in zip(b, new)]
    note = (f"launch rule: (C = kernels + overhead_eager) = {s:.3f} x {base.gpu}/{base.stem}'s launch time "
            f"({ENGINE.per_forward(shape, tp)} / {ENGINE.per_forward(base.shape(), tp)} kernel launches per "
            f"forward, {ENGINE_VERSION}), at least the kernels (servesim/tools/derive_launches.py)")
    return rows, note


# --- held-out check -----------------------------------------------------------------------------

def _walls(meta: dict) -> pd.DataFrame:
    """Per batch: kernels (table sum) and wall of the pack's eager calibration forwards, as its
    YAML recorded them (measured, one process)."""
    pts = (meta.get("overhead") or {}).get("points") or {}
    rows = [(int(k.split("=")[1]), v["table_sum_ms"], v["forward_ms"]) for k, v in pts.items()
            if k.startswith("overhead_eager")]
    return pd.DataFrame(rows, columns=["batch", "kernels", "wall"]).sort_values("batch")


def launch_rule_check(base: Path, targets: list[Path]) -> pd.DataFrame:
    """Each target pack's CPU-bound eager calibration walls predicted from ``base``'s by the
    profiler's launch counts (``PROFILER_PER_LAYER``); one row per target: the ratio used, the
    rows scored, median and max relative error. Packs are YAML paths."""
    bm = yaml.safe_load(Path(base).read_text())
    bw = _walls(bm)
    # a pack that carries the base's own calibration forwards (llama-3.1-8b: llama-3-8b's layers) tests nothing
    targets = [t for t in targets if not _walls(yaml.safe_load(Path(t).read_text())).reset_index(drop=True)
               .equals(bw.reset_index(drop=True))]
    fb = launch_floor(bw.batch, bw.kernels, bw.wall - bw.kernels)
    nb = profiler_launches(bm["shape"], bm.get("quantization", "none"))
    out = []
    for t in targets:
        tm = yaml.safe_load(Path(t).read_text())
        tw = _walls(tm)
        cpu = (tw.wall - tw.kernels >= CPU_BOUND_SHARE * tw.kernels).to_numpy()
        weights = (tm["quantization"] if tm.get("quantization") in ("fp8", "fp8_static")
                   else "fp8" if tm.get("dtype") == "fp8" else "bf16")
        s = profiler_launches(tm["shape"], weights) / nb
        pred = s * np.interp(tw.batch, bw.batch, fb)
        err = (pred / tw.wall.to_numpy() - 1)[cpu]
        out.append({"target": f"{tm['gpu']}/{Path(t).stem}", "date": tm.get("date"), "launch ratio": s,
                    "rows": int(cpu.sum()), "median": float(np.median(np.abs(err))) if err.size else np.nan,
                    "max": float(np.max(np.abs(err))) if err.size else np.nan,
                    "signed median": float(np.median(err)) if err.size else np.nan})
    return pd.DataFrame(out)


def launch_check(gpu: str = "h200", base: str = "llama-3-8b") -> pd.DataFrame:
    """:func:`launch_rule_check` over every measured tp-1 pack of ``gpu`` with eager calibration
    walls (the MoE pack of the first MoE run, calibration/device_runs/moe_first, when no measured
    MoE pack ships)."""
    from servesim.perf.pack import pack_root

    root = pack_root() / gpu
    targets = []
    for y in sorted(root.glob("*.yaml")):
        m = yaml.safe_load(y.read_text())
        if y.stem != base and m.get("source") == "measured" and int(m.get("tp", 1)) == 1 and not _walls(m).empty:
            targets.append(y)
    first = pack_root().parent / "device_runs" / "moe_first" / "qwen3-30b-a3b.yaml"
    if not any("qwen3-30b-a3b" in t.stem for t in targets) and first.is_file():
        targets.append(first)
    return launch_rule_check(root / f"{base}.yaml", targets)


def validation_check(gpu: str = "h200", base: str = "llama-3-8b") -> pd.DataFrame:
    """The same rule on the validation forwards (calibration/validation/<gpu>/): each eager
    forward that was CPU-bound (its wall over its CUDA-graph replay's >= 0.25) predicted as
    ``ratio x F_b(sequences)``, ``F_b`` from the base pack's calibration walls. One row per pack."""
    from servesim.perf.pack import pack_root

    root = pack_root()
    bm = yaml.safe_load((root / gpu / f"{base}.yaml").read_text())
    bw = _walls(bm)
    fb = launch_floor(bw.batch, bw.kernels, bw.wall - bw.kernels)
    nb = profiler_launches(bm["shape"])
    out = []
    for csv in sorted((root.parent / "validation" / gpu).glob("*.csv")):
        v = pd.read_csv(csv)
        key = ["n_prefill", "prefill_len", "prefill_ctx", "n_decode", "decode_ctx"]
        e = v[~v.cuda_graph.astype(str).str.lower().eq("true")].merge(
            v[v.cuda_graph.astype(str).str.lower().eq("true")][key + ["measured_ms"]], on=key, suffixes=("", "_graph"))
        e = e[e.measured_ms - e.measured_ms_graph >= CPU_BOUND_SHARE * e.measured_ms_graph]
        if e.empty:
            continue
        meta = yaml.safe_load((root / gpu / f"{csv.stem}.yaml").read_text())
        q = str(e.quantization.iloc[0]) if "quantization" in e else "none"
        weights = q if q in ("fp8", "fp8_static") else "bf16"
        s = profiler_launches(meta["shape"], weights) / nb
        seqs = (e.n_prefill + e.n_decode).to_numpy(np.float64)
        f = np.interp(seqs, bw.batch, fb)
        err = s * f / e.measured_ms.to_numpy() - 1
        out.append({"target": f"{gpu}/{csv.stem}", "launch ratio": s, "rows": int(len(e)),
                    "median": float(np.median(np.abs(err))), "max": float(np.max(np.abs(err))),
                    "signed median": float(np.median(err))})
    return pd.DataFrame(out)
