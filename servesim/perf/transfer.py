"""Transferred packs: a pack for a GPU nobody measured, from a measured GPU of the same class, by
op-wise efficiency.

Every op of a pack ran at some efficiency ``e = t_ideal / t`` on its GPU, ``t_ideal`` the op's
roofline at that GPU's data-sheet peaks (servesim/hardware.py). The transfer keeps each op's
efficiency and changes the peaks: ``t_dst = t_src x t_ideal(dst) / t_ideal(src)``, per row:

* GEMMs (qkv, o, gate_up, down, lm_head) at ``M`` tokens: ``max(2MKN / F, 2(KN + MK + MN) / B)``;
* bandwidth-bound token ops (norms, rope, activation, KV write, embedding, residual add, an MoE
  layer's router and combine): ``floor + (t - floor) x B_src / B_dst``, ``floor`` the op's
  shortest time in the source pack (its smallest-size rows). These kernels move a few kB to a few
  MB: at serving sizes most of their time is the kernel's fixed cost (launch, one wave, the
  reduction's latency), which HBM bandwidth does not shorten, and only the time above it is the
  bytes' (``bytes / B``). Measured within the Hopper class the whole time scaled by the HBM ratio
  over-predicted these ops by a median 37-47 %; the floor is read from the source's data, not fitted
  to the target's;
* an MoE layer's experts at ``M`` tokens: ``max(2 M k 3 h I / F, (hit experts' weights + routed
  activations) / B)``, ``hit = E (1 - (1 - k/E)^M)`` (the derivation's roofline);
* attention: decode rows ``max(4 h d n (c+1) / F, n (c+1) kv_bytes / B)``, prefill rows
  ``max(4 h d t (c + (t+1)/2) / F, (c + t) kv_bytes / B)`` per layer (MLA: ``4 d`` is
  ``2 (2 kv_lora + rope)`` in decode, the absorbed form, and ``2 (nope + rope + v)`` in prefill);
* collectives: ``bytes / link + 8 us``; CPU and graph overheads are copied (the host, not the GPU).

Within one architecture (``GPUSpec.arch``: the same kernels, tile shapes and launch behaviour) this
is the assumption that a kernel reaches the same share of the peak; across architectures it is
not made (:func:`transfer_source` looks within the class only). The error of the rule where both
GPUs were measured -- within the class, H200 -> H100 on the H100's whole forwards, and across
generations, A100 <-> H200 -- is in calibration/VALIDATION.md, "Transferred packs"
(``benchmarks/transfer_check.py [--within]``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from servesim.hardware import GPUS, GPUSpec
from servesim.models import ModelShape, weight_format
from servesim.perf.dims import RankDims
from servesim.perf.pack import Pack, available_packs, load_pack

GEMMS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")
BANDWIDTH = ("input_norm", "post_attn_norm", "final_norm", "residual_add", "embed", "act", "rope", "kv_write",
             "moe_gate", "moe_combine")
COPIED = ("overhead_eager", "overhead_cuda_graph")
LINK_LATENCY_S = 8e-6


def _gemm_ideal(g: GPUSpec, M: np.ndarray, K: int, N: int, kind: str = "bf16") -> np.ndarray:
    M = np.asarray(M, np.float64)
    return np.maximum(2 * M * K * N / g.gemm_rate(kind), 2 * (K * N + M * K + M * N) / g.hbm_bytes_per_s)


def op_factor(op: str, rows, shape: ModelShape, tp: int, src: GPUSpec, dst: GPUSpec) -> np.ndarray:
    """``t_dst / t_src`` of each row of ``op`` (module doc)."""
    n = len(rows.time_ms)
    if op in GEMMS:
        K, N = RankDims.of_shape(shape, tp).gemm(op)
        kind = "bf16" if op == "lm_head" else weight_format(shape.quantization).gemm  # a quantized pack's rate
        return _gemm_ideal(dst, rows.tokens, K, N, kind) / _gemm_ideal(src, rows.tokens, K, N, kind)
    if op in BANDWIDTH:  # the source's floor stays, the part above it scales (module doc)
        t = np.asarray(rows.time_ms, np.float64)
        floor = t.min() if n else 0.0
        above = t - floor
        return np.divide(floor + above * src.hbm_bytes_per_s / dst.hbm_bytes_per_s, t,
                         out=np.ones(n), where=t > 0)
    if op == "moe_experts":  # the expected work of M routed tokens (servesim/tools/derive_variants.py)
        E, k = shape.num_experts, shape.num_experts_per_tok
        h, inter = shape.hidden_size, max(1, shape.moe_intermediate_size // tp)
        M = rows.tokens.astype(np.float64)
        hit = E * (1 - (1 - k / E) ** M)
        wb = weight_format(shape.quantization).bytes_per_param or shape.dtype_bytes
        byts = hit * 3 * h * inter * wb + 2 * M * k * (2 * h + 3 * inter)
        flops = 2 * M * k * 3 * h * inter
        kind = weight_format(shape.quantization).gemm

        def moe_ideal(g: GPUSpec) -> np.ndarray:
            return np.maximum(flops / g.gemm_rate(kind), byts / g.hbm_bytes_per_s)
        return moe_ideal(dst) / moe_ideal(src)
    if op in ("attn_decode", "attn_prefill"):
        heads, d = max(1, shape.num_heads // tp), shape.head_dim
        kvb = shape.kv_values_per_token_layer(tp) * shape.kv_dtype_bytes
        # per key: 2 x heads x (qk + v) FLOPs; MLA decodes in the absorbed form over the latent
        # (qk = kv_lora + rope, v = kv_lora) and prefills as MHA (qk = nope + rope, v = v_head_dim)
        dec_w, pre_w = 4.0 * d, 4.0 * d
        if getattr(shape, "is_mla", False):
            dec_w = 2.0 * (2 * shape.kv_lora_rank + shape.qk_rope_head_dim)
            pre_w = 2.0 * (shape.qk_nope_head_dim + shape.qk_rope_head_dim + shape.v_head_dim)
        if op == "attn_decode":
            keys = rows.batch * (rows.context + 1.0)
            flops, byts = heads * dec_w * keys, kvb * keys
        else:
            t, c = rows.tokens.astype(np.float64), rows.context.astype(np.float64)
            flops, byts = heads * pre_w * t * (c + (t + 1) / 2), kvb * (c + t)

        def ideal(g: GPUSpec) -> np.ndarray:
            return np.maximum(flops / g.bf16_flops_per_s, byts / g.hbm_bytes_per_s)
        return ideal(dst) / ideal(src)
    if op in ("all_reduce", "send_recv"):
        b = rows.bytes.astype(np.float64)
        return (b / dst.nvlink_bytes_per_s + LINK_LATENCY_S) / (b / src.nvlink_bytes_per_s + LINK_LATENCY_S)
    return np.ones(n)  # overheads: the host's, copied


def transfer_pack(pack: Pack, dst_gpu: str, shape: ModelShape | None = None) -> Pack:
    """``pack`` (measured on its GPU) as a pack of ``dst_gpu``, each op at its measured efficiency."""
    shape = shape or pack.shape()
    src, dst = GPUS[pack.gpu], GPUS[dst_gpu]
    ops = {}
    for op, rows in pack.ops.items():
        f = op_factor(op, rows, shape, pack.tp, src, dst)
        ops[op] = replace(rows, time_ms=rows.time_ms * f, std_ms=rows.std_ms * f)
    origin = (f"transferred from {pack.gpu}/{pack.stem} "
              f"({pack.meta.get('source')}) by op-wise efficiency (achieved / peak)")
    meta = {**dict(pack.meta), "gpu": dst_gpu, "source": "transferred", "origin": origin,
            "transferred_from": f"{pack.gpu}/{pack.stem}"}
    return Pack(dst_gpu, pack.model, pack.tp, pack.csv_path, meta, ops)


def transfer_source(gpu: str, model: str, tp: int) -> str | None:
    """A measured GPU of ``gpu``'s class with a pack of (model, tp), or None (``model``: a pack
    name, so a precision's pack transfers only to the same precision). Prefers measured
    packs over imported or derived ones, then the GPU nearest in memory bandwidth."""
    arch = GPUS[gpu].arch
    cands = [g for g, m, t in available_packs() if m == model and t == tp and g != gpu and GPUS[g].arch == arch]
    if not cands:
        return None

    return min(cands, key=lambda g: source_rank(gpu, g, load_pack(g, model, tp)))


def source_rank(gpu: str, src: str, pack) -> tuple:
    """How good ``src``'s ``pack`` is as a transfer source for ``gpu`` (smaller is better): a
    measured pack first, then the GPU nearest in memory bandwidth. The one ranking of sources,
    for a model's own pack and for a pack of the same layer shapes (servesim/perf/select.py)."""
    return (pack.meta.get("source") != "measured", abs(np.log(GPUS[src].hbm_bytes_per_s / GPUS[gpu].hbm_bytes_per_s)))
