"""Whole forwards: a random-weight decoder of a rank shape and one iteration's batch, run with the
op functions of the tables (ops.py), so validation forwards run what the tables timed."""

from __future__ import annotations

from typing import Callable, Optional

import torch

from .attn_backends import BackendChooser, BackendSwitch
from .grids import Composition
from .ops import (FP8, act_op, attn_decode_op, attn_prefill_op, embed_op, kv_write_op, linear_op, make_cos_sin,
                  rms_norm_op, rope_op, route_bias)
from .shapes import RankShape
from .variants import MoE


class Model:
    """A random-weight decoder with the rank shape's sizes (bf16, no downloads).

    Every layer has its own weights when memory allows (so no layer reads another's weights from
    L2); otherwise all layers share one set, which is said in the metadata.
    """

    def __init__(self, rs: RankShape, device, share_layers: Optional[bool] = None, seed: int = 0):
        self.rs = rs
        self.device = device
        dt = torch.bfloat16
        g = torch.Generator(device=device).manual_seed(seed)

        def r(*shape, scale=1.0):
            return torch.randn(*shape, generator=g, device=device, dtype=dt) * scale
        h, I = rs.h, rs.I
        mlp_params = 3 * rs.E * rs.MI * h + rs.E * h if rs.moe else 3 * I * h
        layer_bytes = 2 * (rs.qkv_out * h + h * rs.H * rs.D + mlp_params + 2 * h)
        if share_layers is None:
            share_layers = False
            if device.type == "cuda":
                free, _total = torch.cuda.mem_get_info(device)
                share_layers = layer_bytes * rs.L > 0.6 * free
        self.shared_layers = share_layers
        n_sets = 1 if share_layers else rs.L
        sets = []
        for _ in range(n_sets):
            lw = dict(in_norm=1.0 + 0.1 * r(h), qkv=rs.linear(r(rs.qkv_out, h, scale=h ** -0.5)),
                      o=rs.linear(r(h, rs.H * rs.D, scale=(rs.H * rs.D) ** -0.5)),
                      post_norm=1.0 + 0.1 * r(h))
            if rs.moe:
                lw["moe"] = MoE(rs.moe_shape(), device, g)
            else:
                lw.update(gu=rs.linear(r(2 * I, h, scale=h ** -0.5)), down=rs.linear(r(h, I, scale=I ** -0.5)))
            sets.append(lw)
        self.layers = [sets[i % n_sets] for i in range(rs.L)]
        self.embed = r(rs.V, h, scale=0.02)
        self.lm_head = self.embed if rs.tied else r(rs.V, h, scale=h ** -0.5)
        self.final_norm = 1.0 + 0.1 * r(h)
        self.cos_sin = make_cos_sin(rs.max_len + 2, rs.D, device, dt)


class Batch:
    """Static inputs of one composition: token ids, positions, KV slots, one layer's KV cache.

    The KV cache is flat [slots, KVH, D], sequence-major: each prefilling sequence owns
    prefill_ctx + prefill_len consecutive slots (new tokens last), each decode sequence
    decode_ctx + 1. The same buffers serve every layer: the timing is the same and memory is
    1 / num_layers of a real cache.
    """

    def __init__(self, comp: Composition, rs: RankShape, device, seed: int = 1,
                 chooser: Optional[BackendChooser] = None):
        self.comp = comp
        #: the SDPA backend of each attention call (None: whatever is enabled), chosen as the op
        #: tables chose it for the same kind and point
        c0 = comp
        self.prefill_backend = None if chooser is None or not c0.n_prefill else chooser.pick(
            "prefill_context" if c0.prefill_ctx > 0 else "prefill_causal", c0.prefill_len, c0.prefill_ctx)
        self.decode_backend = None if chooser is None or not c0.n_decode else chooser.pick(
            "decode", c0.n_decode, c0.decode_ctx)
        g = torch.Generator(device=device).manual_seed(seed)
        c = comp
        T = c.tokens
        self.T = T
        pos, slots, sample, self.prefills = [], [], [], []
        base = 0
        for i in range(c.n_prefill):
            ts = i * c.prefill_len
            pos.append(torch.arange(c.prefill_ctx, c.prefill_ctx + c.prefill_len))
            slots.append(base + c.prefill_ctx + torch.arange(c.prefill_len))
            sample.append(ts + c.prefill_len - 1)
            self.prefills.append((ts, ts + c.prefill_len, base, c.prefill_ctx + c.prefill_len))
            base += c.prefill_ctx + c.prefill_len
        self.dec_tok = c.n_prefill * c.prefill_len
        self.dec_base = base
        self.dec_len = c.decode_ctx + 1
        if c.n_decode:
            pos.append(torch.full((c.n_decode,), c.decode_ctx))
            slots.append(base + torch.arange(c.n_decode) * self.dec_len + c.decode_ctx)
            sample.extend(range(self.dec_tok, self.dec_tok + c.n_decode))
        self.positions = torch.cat(pos).to(device)
        self.slots = torch.cat(slots).to(device)
        self.sample_idx = torch.tensor(sample, dtype=torch.long, device=device)
        self.ids = torch.randint(0, rs.V, (T,), generator=g, device=device)
        S = c.kv_slots
        self.route_bias = route_bias(T, rs.E, device, g) if rs.moe else None
        self.k_cache = torch.randn(S, rs.KVH, rs.D, generator=g, device=device, dtype=torch.bfloat16)
        self.v_cache = torch.randn(S, rs.KVH, rs.D, generator=g, device=device, dtype=torch.bfloat16)


def forward(m: Model, b: Batch, all_reduce: Optional[Callable] = None):
    """embedding -> layers (norm, qkv, rope, kv_write, attention, o_proj, add, norm, gate_up, act,
    down, add) -> final norm and lm_head on one row per sequence. Returns the logits.

    Under TP (``all_reduce`` given, one process per rank) the o_proj and down_proj outputs are
    all-reduced in place before the residual add -- the two collectives per layer of the pack
    model; embedding and lm_head stay on the rank's vocab slice, as in the op tables."""
    rs = m.rs
    H, KVH, D, T = rs.H, rs.KVH, rs.D, b.T
    residual = embed_op(b.ids, m.embed)
    n_dec = b.comp.n_decode
    with BackendSwitch() as sw:  # each attention call on the backend the tables chose for it
        for lw in m.layers:
            hn = rms_norm_op(residual, lw["in_norm"], rs.act_fp8)
            qkv = linear_op(hn, lw["qkv"])
            qk = rope_op(qkv, b.positions, m.cos_sin, H, KVH, D)
            kv_write_op(b.k_cache, b.v_cache, qk[:, H:], qkv[:, (H + KVH) * D:].view(T, KVH, D), b.slots)
            q = qk[:, :H]
            # fp8_static: the attention's output copy writes e4m3 for o_proj (ops.FP8)
            attn = torch.empty((T, H, D), device=qkv.device, dtype=FP8 if rs.act_fp8 else qkv.dtype)
            for ts, te, ks, kl in b.prefills:
                sw.use(b.prefill_backend)
                attn_prefill_op(q[ts:te], b.k_cache[ks:ks + kl], b.v_cache[ks:ks + kl], attn[ts:te])
            if n_dec:
                s, e = b.dec_base, b.dec_base + n_dec * b.dec_len
                sw.use(b.decode_backend)
                attn_decode_op(q[b.dec_tok:], b.k_cache[s:e], b.v_cache[s:e], attn[b.dec_tok:],
                               n_dec, b.dec_len)
            o = linear_op(attn.view(T, H * D), lw["o"])
            if all_reduce is not None:
                all_reduce(o)
            residual = residual + o
            hn = rms_norm_op(residual, lw["post_norm"], rs.act_fp8)
            if rs.moe:
                d = lw["moe"](hn, b.route_bias)
            else:
                d = linear_op(act_op(linear_op(hn, lw["gu"]), rs.I, rs.act_fp8), lw["down"])
            if all_reduce is not None:
                all_reduce(d)
            residual = residual + d
    rows = residual.index_select(0, b.sample_idx)
    return linear_op(rms_norm_op(rows, m.final_norm), m.lm_head)

