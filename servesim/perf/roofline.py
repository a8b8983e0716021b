"""Analytical roofline step-time model: the baseline, and the model for GPUs without a pack.

Every op of one iteration costs ``max(FLOPs / (peak * mfu), bytes / (bandwidth * mbu))`` on one
GPU of the replica (per-rank slices under tensor parallelism), summed over ops and layers, plus
ring all-reduces for TP, activation sends between PP stages, and a fixed per-iteration overhead::

    per layer:  qkv, o, gate_up, down GEMMs       2*T*K*N FLOPs,  2*(K*N + T*K + T*N) bytes
                elementwise (norms, rope, act,     ~ELEMENTWISE_TENSORS * T * hidden * 2 bytes
                 residual adds, KV write)
                attention prefill, per sequence    4*heads*hd*new*(ctx + (new+1)/2) FLOPs,
                                                   KV bytes of ctx+new tokens
                attention decode, whole batch      4*heads*hd*(ctx+1) FLOPs per sequence,
                                                   KV bytes of ctx+1 tokens per sequence
                all-reduce x2 (tp > 1)             2*(tp-1)/tp * T*hidden*2 / link bandwidth
    once:       LM head on one row per sequence    2*R*hidden*vocab FLOPs, weight bytes

The efficiency factors ``mfu`` (fraction of peak FLOP/s) and ``mbu`` (fraction of peak bandwidth)
are stated in the scenario (defaults 0.6 and 0.8, typical of well-tuned serving kernels). This model
ignores kernel launch granularity and tile quantization; calibration packs capture those.
"""

from __future__ import annotations

import numpy as np

from servesim.hardware import GPUSpec
from servesim.models import ModelShape

ELEMENTWISE_TENSORS = 16  # reads+writes of hidden-sized tensors per token per layer
ALLREDUCE_LATENCY_S = 8e-6
SEND_RECV_LATENCY_S = 10e-6


class RooflineStepModel:
    name = "roofline"

    def __init__(self, gpu: GPUSpec, shape: ModelShape, tp: int = 1, pp: int = 1,
                 mfu: float = 0.6, mbu: float = 0.8, overhead_s: float = 0.002):
        self.gpu, self.shape, self.tp, self.pp = gpu, shape, tp, pp
        self.mfu, self.mbu, self.overhead_s = mfu, mbu, overhead_s
        self._flops = gpu.bf16_flops_per_s * mfu
        self._bw = gpu.hbm_bytes_per_s * mbu
        h, b = shape.hidden_size, shape.dtype_bytes
        self._gemms = [  # (K, N) per rank
            (h, (shape.q_dim + 2 * shape.kv_dim) // tp),
            (shape.q_dim // tp, h),
            (h, 2 * shape.intermediate_size // tp),
            (shape.intermediate_size // tp, h),
        ]
        self._layers = shape.num_layers  # all stages run in sequence for one batch
        self._heads = max(1, shape.num_heads // tp)
        self._kv_bytes_tok_layer = 2 * max(1, shape.num_kv_heads // tp) * shape.head_dim * b
        self._hd = shape.head_dim
        self._b = b
        self._elementwise_bytes_tok = ELEMENTWISE_TENSORS * h * b
        self._lm = (h, shape.vocab_size // tp)
        self._token_cache: dict[int, float] = {}  # decode batches: tokens == rows
        # decode attention over all layers = layers * max(kv * f, kv * b + n * q)
        self._dec_f = self._layers * 4.0 * self._heads * self._hd / self._flops
        self._dec_b = self._layers * self._kv_bytes_tok_layer / self._bw
        self._dec_q = self._layers * 2 * self._heads * self._hd * self._b / self._bw

    # -- pieces ---------------------------------------------------------------------------
    def _gemm_time(self, t: float) -> float:
        total = 0.0
        for k, n in self._gemms:
            total += max(2.0 * t * k * n / self._flops, self._b * (k * n + t * k + t * n) / self._bw)
        return total

    def _token_time(self, tokens: int, rows: int) -> float:
        """Everything that depends only on the token count and sampled rows (not on context);
        memoized for decode batches: the hot loop asks for the same few sizes over and over."""
        if tokens != rows:  # mixed batches vary too much to be worth keeping
            return self._token_time_uncached(tokens, rows)
        t = self._token_cache.get(tokens)
        if t is None:
            t = self._token_cache[tokens] = self._token_time_uncached(tokens, rows)
        return t

    def _token_time_uncached(self, tokens: int, rows: int) -> float:
        per_layer = self._gemm_time(tokens) + tokens * self._elementwise_bytes_tok / self._bw
        if self.tp > 1:
            msg = tokens * self.shape.hidden_size * self._b
            per_layer += 2 * (2 * (self.tp - 1) / self.tp * msg / self.gpu.nvlink_bytes_per_s
                              + ALLREDUCE_LATENCY_S)
        k, n = self._lm
        lm = max(2.0 * rows * k * n / self._flops, self._b * (k * n + rows * k + rows * n) / self._bw)
        pp_send = 0.0
        if self.pp > 1:
            msg = tokens * self.shape.hidden_size * self._b
            pp_send = (self.pp - 1) * (msg / self.gpu.nvlink_bytes_per_s + SEND_RECV_LATENCY_S)
        return self._layers * per_layer + lm + pp_send + self.overhead_s

    def _decode_attn(self, n: int, kv_tokens):
        """Decode attention over all layers for ``n`` sequences reading ``kv_tokens`` keys in all:
        FLOPs 4 * heads * hd per key, bytes the keys' K/V plus each query's q/o. Scalars or
        arrays, with the same float operations either way."""
        if isinstance(kv_tokens, np.ndarray):
            return np.maximum(kv_tokens * self._dec_f, kv_tokens * self._dec_b + n * self._dec_q)
        return max(kv_tokens * self._dec_f, kv_tokens * self._dec_b + n * self._dec_q)

    def _prefill_attn_one(self, new: float, ctx: float) -> float:
        flops = 4.0 * self._heads * self._hd * new * (ctx + (new + 1) / 2)
        byts = self._kv_bytes_tok_layer * (ctx + new) + 2 * new * self._heads * self._hd * self._b
        return self._layers * max(flops / self._flops, byts / self._bw)

    # -- contract -------------------------------------------------------------------------
    def predict_decode_run(self, num_seqs: int, context_sum: int, steps: int) -> np.ndarray:
        base = self._token_time(num_seqs, num_seqs)
        if steps == 1:  # the same operations on scalars: the common single step, cheaper
            return np.array([base + self._decode_attn(num_seqs, float(context_sum + num_seqs))])
        kv = context_sum + num_seqs + num_seqs * np.arange(steps, dtype=np.float64)
        return base + self._decode_attn(num_seqs, kv)

    def predict(self, new_tokens: np.ndarray, context: np.ndarray) -> float:
        tokens = rows = n_dec = dec_ctx = 0
        attn = 0.0
        for n, c in zip(new_tokens.tolist(), context.tolist()):
            tokens += n
            rows += 1
            if n == 1:
                n_dec += 1
                dec_ctx += c
            else:
                attn += self._prefill_attn_one(float(n), float(c))
        if n_dec == rows:
            return float(self.predict_decode_run(n_dec, dec_ctx, 1)[0])
        t = self._token_time(tokens, rows) + attn
        if n_dec:
            t += self._decode_attn(n_dec, float(dec_ctx + n_dec))
        return float(t)

    def describe(self) -> str:
        return (f"roofline on {self.gpu.name} (mfu {self.mfu:.2f}, mbu {self.mbu:.2f}, "
                f"overhead {self.overhead_s * 1e3:.1f} ms), tp {self.tp}, pp {self.pp}")
