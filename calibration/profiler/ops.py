"""The ops, each one function used both by the op tables and by the whole forward, so that the
forward's kernels are exactly the kernels the tables time (eager PyTorch, unfused)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .attn_backends import Sdpa
from .shapes import RankShape

RMS_EPS = 1e-6
FP8 = torch.float8_e4m3fn


def rms_norm_op(x, w, fp8: bool = False):
    """``fp8``: the output in e4m3 for a linear with static activation scales (variants.py
    ``fp8_static``; the engines' fused norm + quant is here the norm and one cast kernel)."""
    y = F.rms_norm(x, (x.shape[-1],), w, eps=RMS_EPS)
    return y.to(FP8) if fp8 else y


def linear_op(x, w):
    """``x @ w.T``: ``w`` a bf16 tensor, or a quantized linear (variants.QLinear) that is called."""
    return F.linear(x, w) if isinstance(w, torch.Tensor) else w(x)


def rope_op(qkv, positions, cos_sin, H: int, KVH: int, D: int):
    """Neox-style rotary embedding on q and k; returns a new [T, H+KVH, D] tensor.

    Five kernels: one gather of cos|sin by position, two multiplies and two multiply-adds.
    """
    T = qkv.shape[0]
    half = D // 2
    qk = qkv[:, : (H + KVH) * D].view(T, H + KVH, D)
    cs = cos_sin.index_select(0, positions)
    cos = cs[:, None, :half]
    sin = cs[:, None, half:]
    out = torch.empty((T, H + KVH, D), device=qkv.device, dtype=qkv.dtype)
    x1, x2 = qk[..., :half], qk[..., half:]
    o1, o2 = out[..., :half], out[..., half:]
    torch.mul(x1, cos, out=o1)
    o1.addcmul_(x2, sin, value=-1)
    torch.mul(x2, cos, out=o2)
    o2.addcmul_(x1, sin)
    return out


def kv_write_op(k_cache, v_cache, k, v, slots):
    """Scatter the step's new K and V rows ([T, KVH, D]) into flat caches ([S, KVH, D]) at slots,
    like vLLM's reshape_and_cache (two kernels)."""
    k_cache.index_copy_(0, slots, k)
    v_cache.index_copy_(0, slots, v)


def attn_prefill_op(q_rows, k_rows, v_rows, out_rows):
    """One prefilling sequence: q_rows [Tq, H, D] over k/v_rows [ctx+Tq, KVH, D] (the sequence's
    cache, new tokens at the end); the result is copied into out_rows [Tq, H, D]."""
    q = q_rows.unsqueeze(0).transpose(1, 2)
    k = k_rows.unsqueeze(0).transpose(1, 2)
    v = v_rows.unsqueeze(0).transpose(1, 2)
    o = Sdpa.prefill(q, k, v)
    out_rows.copy_(o[0].transpose(0, 1))


def attn_decode_op(q_rows, k_flat, v_flat, out_rows, batch: int, kv_len: int):
    """A decode batch: q_rows [B, H, D], caches [B*kv_len, KVH, D] (sequence-major), out [B, H, D]."""
    q = q_rows.unsqueeze(2)
    kvh, d = k_flat.shape[1], k_flat.shape[2]
    k = k_flat.view(batch, kv_len, kvh, d).transpose(1, 2)
    v = v_flat.view(batch, kv_len, kvh, d).transpose(1, 2)
    o = Sdpa.decode(q, k, v)
    out_rows.copy_(o.squeeze(2))


def act_op(gu, inter: int, fp8: bool = False):
    """SiLU(gate) * up (2 kernels); ``fp8``: then one cast to e4m3 (the engines' fused activation +
    quant is one kernel; a multiply storing e4m3 through ``out=`` would lean on CUDA's dynamic
    output casting of float8, which this profiler does not assume)."""
    y = F.silu(gu[:, :inter]) * gu[:, inter:]
    return y.to(FP8) if fp8 else y


def embed_op(ids, table):
    return F.embedding(ids, table)


def make_cos_sin(max_pos: int, D: int, device, dtype, base: float = 500000.0):
    inv = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat([ang.cos(), ang.sin()], dim=-1).to(device=device, dtype=dtype)


def route_bias(T: int, E: int, device, gen) -> torch.Tensor:
    """Per-token random router-logit offsets (std 4 against the logits' ~1): routing uniform at
    random per token, in the op tables and in the forwards alike (variants.MoE.gate says why)."""
    return torch.randn(T, E, generator=gen, device=device, dtype=torch.bfloat16) * 4.0


def layer_ops(rs: RankShape) -> tuple:
    """The per-layer token ops of a forward, in order (PACK_FORMAT.md; MoE packs replace the MLP's
    three ops by the experts' three)."""
    mlp = ("moe_gate", "moe_experts", "moe_combine") if rs.moe else ("gate_up_proj", "act", "down_proj")
    return ("input_norm", "qkv_proj", "rope", "kv_write", "o_proj", "post_attn_norm") + mlp + ("residual_add",)
