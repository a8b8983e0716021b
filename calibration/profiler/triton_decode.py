"""A split-KV decode-attention kernel in Triton, for the profiler's fp8-KV and MLA surveys.

Why our own kernel: PyTorch's SDPA reads only bf16/fp16 KV and needs head_dim <= 256, so neither an
fp8 cache nor MLA's 576-wide latent key can be timed on it. This is the kind of kernel SGLang and
vLLM's Triton backend run (sglang/srt/layers/attention/triton_ops/decode_attention.py, v0.4: query
heads of one KV head grouped per program, online softmax over KV blocks, a second kernel merging the
splits); the same kernel runs bf16 KV, so fp8 / bf16 is a ratio within one kernel. MLA runs it with
one latent KV head of 512 + 64 rope dims whose first 512 are the values (DeepSeek-V2/V3 absorbed
decode), not FlashMLA. On CPU, TRITON_INTERPRET=1 runs it for tests.
"""

from __future__ import annotations

import math

import torch

try:  # Triton is on the GPU machines; on CPU the interpreter (TRITON_INTERPRET=1) runs it in tests
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover - depends on the machine
    triton = None
    tl = None

if triton is not None:
    @triton.jit
    def _decode_stage1(Q, K, V, Mid_O, Mid_LSE, kv_len, sm_scale, k_scale,
                       stride_qb, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                       stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
                       H: tl.constexpr, GROUP: tl.constexpr, HEADS_PER_PROG: tl.constexpr,
                       BLOCK_H: tl.constexpr, D: tl.constexpr, DPE: tl.constexpr, DV: tl.constexpr,
                       SPLITS, BLOCK_N: tl.constexpr, HAS_PE: tl.constexpr):
        b = tl.program_id(0)
        hb = tl.program_id(1)
        sp = tl.program_id(2)
        h0 = hb * HEADS_PER_PROG
        kvh = h0 // GROUP
        offs_h = h0 + tl.arange(0, BLOCK_H)
        mask_h = (tl.arange(0, BLOCK_H) < HEADS_PER_PROG) & (offs_h < H)
        offs_d = tl.arange(0, D)
        offs_dv = tl.arange(0, DV)
        q = tl.load(Q + b * stride_qb + offs_h[:, None] * stride_qh + offs_d[None, :],
                    mask=mask_h[:, None], other=0.0)
        if HAS_PE:
            offs_pe = D + tl.arange(0, DPE)
            qpe = tl.load(Q + b * stride_qb + offs_h[:, None] * stride_qh + offs_pe[None, :],
                          mask=mask_h[:, None], other=0.0)
        per_split = tl.cdiv(kv_len, SPLITS)
        start = sp * per_split
        end = tl.minimum(start + per_split, kv_len)
        m_i = tl.zeros([BLOCK_H], dtype=tl.float32) - float("inf")
        l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, DV], dtype=tl.float32)
        base = b.to(tl.int64) * kv_len  # B * L * stride passes 2**31 at 32 x 64K
        for n0 in range(start, end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            mask_n = offs_n < end
            k = tl.load(K + (base + offs_n)[:, None] * stride_kt + kvh * stride_kh + offs_d[None, :],
                        mask=mask_n[:, None], other=0.0)
            qk = tl.dot(q, tl.trans(k.to(q.dtype)))
            if HAS_PE:
                kpe = tl.load(K + (base + offs_n)[:, None] * stride_kt + kvh * stride_kh + offs_pe[None, :],
                              mask=mask_n[:, None], other=0.0)
                qk += tl.dot(qpe, tl.trans(kpe.to(q.dtype)))
            qk = qk * (sm_scale * k_scale)
            qk = tl.where(mask_n[None, :], qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            p = tl.exp(qk - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            v = tl.load(V + (base + offs_n)[:, None] * stride_vt + kvh * stride_vh + offs_dv[None, :],
                        mask=mask_n[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype))
            l_i = l_i * alpha + tl.sum(p, 1)
            m_i = m_new
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        lse = tl.where(l_i > 0, m_i + tl.log(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        tl.store(Mid_O + b * stride_ob + offs_h[:, None] * stride_oh + sp * stride_os + offs_dv[None, :],
                 out, mask=mask_h[:, None])
        tl.store(Mid_LSE + b * stride_lb + offs_h * stride_lh + sp, lse, mask=mask_h)

    @triton.jit
    def _decode_stage2(Mid_O, Mid_LSE, O, kv_len, v_scale,
                       stride_ob, stride_oh, stride_os, stride_lb, stride_lh, stride_fb, stride_fh,
                       SPLITS, DV: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        offs_dv = tl.arange(0, DV)
        per_split = tl.cdiv(kv_len, SPLITS)
        m = float("-inf")
        s = 0.0
        acc = tl.zeros([DV], dtype=tl.float32)
        for sp in range(0, SPLITS):
            if sp * per_split < kv_len:
                lse = tl.load(Mid_LSE + b * stride_lb + h * stride_lh + sp)
                o = tl.load(Mid_O + b * stride_ob + h * stride_oh + sp * stride_os + offs_dv)
                m_new = tl.maximum(m, lse)
                scale_old = tl.exp(m - m_new)
                w = tl.exp(lse - m_new)
                acc = acc * scale_old + o * w
                s = s * scale_old + w
                m = m_new
        tl.store(O + b * stride_fb + h * stride_fh + offs_dv, (acc / s * v_scale).to(O.dtype.element_ty))


class TritonDecode:
    """Split-KV decode attention over a sequence-major cache (the layout of ops.py's
    ``attn_decode_op``): q [B, H, D+DPE], k [B*L, KVH, D+DPE], v [B*L, KVH, DV] (v may be a view of
    k: MLA), equal context L per sequence. ``k_scale``/``v_scale`` dequantize fp8 caches."""

    def __init__(self, H: int, KVH: int, D: int, DV: int, DPE: int = 0, sms: int = 132):
        if triton is None:
            raise RuntimeError("Triton is not installed")
        self.H, self.KVH, self.D, self.DV, self.DPE = H, KVH, D, DV, DPE
        self.group = H // KVH
        self.block_h = 16
        self.heads_per_prog = min(self.block_h, self.group)
        self.sms = sms
        self.block_n = 32 if D >= 256 else 64
        self.backend = (f"Triton split-KV decode (grouped heads, {self.block_n}-token blocks; "
                        f"SGLang-style two-stage)")

    def splits(self, B: int, L: int) -> int:
        progs = B * (self.H // self.heads_per_prog)
        want = max(1, math.ceil(2 * self.sms / max(progs, 1)))
        return int(max(1, min(want, 32, math.ceil(L / self.block_n))))

    def __call__(self, q, k, v, out, B: int, L: int, k_scale: float = 1.0, v_scale: float = 1.0):
        S = self.splits(B, L)
        mid_o = torch.empty(B, self.H, S, self.DV, device=q.device, dtype=torch.float32)
        mid_l = torch.empty(B, self.H, S, device=q.device, dtype=torch.float32)
        grid = (B, self.H // self.heads_per_prog, S)
        sm_scale = 1.0 / math.sqrt(self.D + self.DPE)
        _decode_stage1[grid](q, k, v, mid_o, mid_l, L, sm_scale, k_scale,
                             q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                             mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_l.stride(0), mid_l.stride(1),
                             H=self.H, GROUP=self.group, HEADS_PER_PROG=self.heads_per_prog,
                             BLOCK_H=self.block_h, D=self.D, DPE=max(self.DPE, 16), DV=self.DV,
                             SPLITS=S, BLOCK_N=self.block_n, HAS_PE=self.DPE > 0)
        _decode_stage2[(B, self.H)](mid_o, mid_l, out, L, v_scale,
                                    mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
                                    mid_l.stride(0), mid_l.stride(1), out.stride(0), out.stride(1),
                                    SPLITS=S, DV=self.DV)
        return out


def decode_reference(q, k, v, B: int, L: int, D: int, DPE: int, k_scale: float = 1.0, v_scale: float = 1.0):
    """float64 decode attention in the layout of :class:`TritonDecode` (accuracy checks)."""
    H, KVH = q.shape[1], k.shape[1]
    g = H // KVH
    qd = q.double()
    kd = k.double().reshape(B, L, KVH, -1) * k_scale
    vd = v.double().reshape(B, L, KVH, -1) * v_scale
    kd = kd.repeat_interleave(g, dim=2)  # [B, L, H, D+DPE]
    vd = vd.repeat_interleave(g, dim=2)
    s = torch.einsum("bhd,blhd->bhl", qd[..., :D + DPE], kd[..., :D + DPE]) / math.sqrt(D + DPE)
    p = torch.softmax(s, dim=-1)
    return torch.einsum("bhl,blhd->bhd", p, vd)
