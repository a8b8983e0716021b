"""The roofline model's kernels (servesim/perf/roofline.py has the equations; the constants travel
in :class:`servesim.perf.kernels.RooflineConsts`).

Two paths. ``rf.general == 0``: the dense bf16 decoder (four GEMMs a layer), kept bit for bit as it
was. ``rf.general == 1``: any weight format (bytes per weight, the format's GEMM rate, the
dequantization of weight-only formats), MLA's extra projections, dense and MoE layers apart, and
expert parallelism's all-to-all::

    quantized GEMM     max(2tkn / rate_q + dequant, (w_q kn + 2(tk + tn)) / bw)
                       dequant = kn x dequant_s x ceil(t / dequant_tile)   (w4a16, w8a16 only)
    MoE layer          busiest rank: routed pairs r = t k / ep x imbalance (at most t k);
                       experts hit a = E_rank (1 - (1 - k/E)^t);
                       max(2 r 3 h n / rate_q + dequant, (a 3 h n w_q + 2 r (2h + 3n)) / bw)
                       + shared experts (a dense MLP) + router GEMM (h x E)
                       + ep > 1: all-to-all, dispatch and combine: 2 (t/ep k h 2 (ep-1)/ep / link
                         + latency), in place of the MLP's all-reduce
"""

import math

from servesim.jit import kernel


@kernel
def roofline_gemm_s(rf, t, k, n):
    """One GEMM of ``t`` rows by (K, N): compute- or bandwidth-bound, whichever is slower."""
    return max(2.0 * t * k * n / rf.flops, rf.dtype_bytes * (k * n + t * k + t * n) / rf.bw)


@kernel
def roofline_pp_send(rf, tokens):
    """Seconds to hand ``tokens`` activations down a pipeline: pp - 1 sends, those between
    servers (``x_hops``) over the inter-server link."""
    pp_send = 0.0
    if rf.pp > 1:
        msg = tokens * rf.hidden * rf.dtype_bytes
        pp_send = (rf.pp - 1 - rf.x_hops) * (msg / rf.link + rf.send_latency)
        if rf.x_hops > 0:
            pp_send += rf.x_hops * (msg / rf.x_bw + rf.x_latency)
    return pp_send


@kernel
def roofline_token_seconds(rf, tokens, rows):
    """Everything that depends only on the token count and the sampled rows (not on context):
    GEMMs, elementwise traffic, all-reduces, LM head, stage sends, the fixed overhead."""
    if rf.general != 0:
        return roofline_token_seconds_general(rf, tokens, rows)
    per_layer = 0.0
    per_layer += roofline_gemm_s(rf, tokens, rf.qkv_k, rf.qkv_n)
    per_layer += roofline_gemm_s(rf, tokens, rf.o_k, rf.o_n)
    per_layer += roofline_gemm_s(rf, tokens, rf.gate_up_k, rf.gate_up_n)
    per_layer += roofline_gemm_s(rf, tokens, rf.down_k, rf.down_n)
    per_layer = per_layer + tokens * rf.elementwise_bytes_tok / rf.bw
    if rf.tp > 1:
        msg = tokens * rf.hidden * rf.dtype_bytes
        per_layer += 2 * (2 * (rf.tp - 1) / rf.tp * msg / rf.link + rf.allreduce_latency)
    lm = roofline_gemm_s(rf, rows, rf.lm_k, rf.lm_n)
    pp_send = roofline_pp_send(rf, tokens)
    return rf.layers * per_layer + lm + pp_send + rf.overhead


@kernel
def roofline_decode_attn(rf, n, kv):
    """Decode attention over all layers for ``n`` sequences reading ``kv`` keys in all."""
    return max(kv * rf.dec_f, kv * rf.dec_b + n * rf.dec_q)


@kernel
def roofline_prefill_attn(rf, new, ctx):
    """Prefill attention over all layers of one chunk (``new``, ``ctx`` as floats)."""
    flops = 4.0 * rf.heads * rf.head_dim * new * (ctx + (new + 1) / 2)
    byts = rf.kv_bytes_tok_layer * (ctx + new) + 2 * new * rf.heads * rf.head_dim * rf.dtype_bytes
    return rf.layers * max(flops / rf.flops, byts / rf.bw)


@kernel
def roofline_iteration_seconds(rf, new, ctx, nb):
    tokens = 0
    n_dec = 0
    dec_ctx = 0
    attn = 0.0
    for i in range(nb):
        tokens += new[i]
        if new[i] == 1:
            n_dec += 1
            dec_ctx += ctx[i]
        else:
            attn += roofline_prefill_attn(rf, float(new[i]), float(ctx[i]))
    if n_dec == nb:
        return roofline_token_seconds(rf, n_dec, n_dec) + roofline_decode_attn(rf, n_dec, float(dec_ctx + n_dec))
    t = roofline_token_seconds(rf, tokens, nb) + attn
    if n_dec:
        t += roofline_decode_attn(rf, n_dec, float(dec_ctx + n_dec))
    return t


@kernel
def roofline_decode_run(rf, num_seqs, context_sum, steps, out):
    base = roofline_token_seconds(rf, num_seqs, num_seqs)
    if steps == 1:
        out[0] = base + roofline_decode_attn(rf, num_seqs, float(context_sum + num_seqs))
        return
    first = float(context_sum + num_seqs)
    for j in range(steps):
        out[j] = base + roofline_decode_attn(rf, num_seqs, first + num_seqs * float(j))



# --- the general path ------------------------------------------------------------------------

@kernel
def roofline_qgemm_s(rf, t, k, n, quantized):
    """A GEMM whose weights take the weight format (``quantized`` 1) or the model dtype (0)."""
    if k <= 0 or n <= 0 or t <= 0:
        return 0.0
    if quantized == 0:
        return max(2.0 * t * k * n / rf.flops, rf.dtype_bytes * (k * n + t * k + t * n) / rf.bw)
    comp = 2.0 * t * k * n / rf.gemm_flops
    if rf.dequant_s > 0.0:
        comp += k * n * rf.dequant_s * ((t + rf.dequant_tile - 1) // rf.dequant_tile)
    return max(comp, (rf.w_bytes * k * n + rf.dtype_bytes * (t * k + t * n)) / rf.bw)


@kernel
def roofline_moe_s(rf, tokens):
    """One MoE layer's routed experts on the busiest rank (module doc)."""
    if tokens <= 0:
        return 0.0
    k = rf.moe_topk
    active = rf.moe_experts * (1.0 - (1.0 - k / rf.moe_total) ** tokens)
    routed = tokens * k / rf.moe_ep * rf.moe_imbalance
    if routed > tokens * k:
        routed = float(tokens * k)
    h = rf.hidden
    n = rf.moe_n
    q = rf.moe_q_experts
    wb = rf.w_bytes if q == 1 else float(rf.dtype_bytes)
    comp = 2.0 * routed * 3.0 * h * n / (rf.gemm_flops if q == 1 else rf.flops)
    if q == 1 and rf.dequant_s > 0.0 and active > 0.0:
        comp += active * 3.0 * h * n * rf.dequant_s * math.ceil(routed / active / rf.dequant_tile)
    byts = active * 3.0 * h * n * wb + rf.dtype_bytes * routed * (2.0 * h + 3.0 * n)
    return max(comp, byts / rf.bw)


@kernel
def roofline_token_seconds_general(rf, tokens, rows):
    """:func:`roofline_token_seconds` for weight formats, MoE and MLA (module doc)."""
    qa = rf.moe_q_dense
    attn = roofline_qgemm_s(rf, tokens, rf.qkv_k, rf.qkv_n, qa) + roofline_qgemm_s(rf, tokens, rf.o_k, rf.o_n, qa)
    attn += roofline_qgemm_s(rf, tokens, rf.x1_k, rf.x1_n, qa) + roofline_qgemm_s(rf, tokens, rf.x2_k, rf.x2_n, qa)
    attn += tokens * rf.elementwise_bytes_tok / rf.bw
    ar = 0.0
    if rf.tp > 1:
        ar = 2 * (rf.tp - 1) / rf.tp * tokens * rf.hidden * rf.dtype_bytes / rf.link + rf.allreduce_latency
    total = rf.layers * (attn + ar)
    if rf.dense_layers > 0:
        dense = roofline_qgemm_s(rf, tokens, rf.gate_up_k, rf.gate_up_n, qa)
        dense += roofline_qgemm_s(rf, tokens, rf.down_k, rf.down_n, qa)
        total += rf.dense_layers * (dense + ar)
    if rf.moe_layers > 0:
        moe = roofline_moe_s(rf, tokens)
        if rf.shared_n > 0:
            moe += roofline_qgemm_s(rf, tokens, rf.hidden, 2 * rf.shared_n, qa)
            moe += roofline_qgemm_s(rf, tokens, rf.shared_n, rf.hidden, qa)
        moe += roofline_qgemm_s(rf, tokens, rf.hidden, rf.moe_total, 0)  # the router
        if rf.moe_ep > 1:
            msg = tokens / rf.moe_ep * rf.moe_topk * rf.hidden * rf.dtype_bytes * (rf.moe_ep - 1) / rf.moe_ep
            moe += 2 * (msg / rf.link + rf.allreduce_latency)
        else:
            moe += ar
        total += rf.moe_layers * moe
    lm = roofline_gemm_s(rf, rows, rf.lm_k, rf.lm_n)
    pp_send = roofline_pp_send(rf, tokens)
    return total + lm + pp_send + rf.overhead
