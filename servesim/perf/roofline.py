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
    per stage boundary (pp > 1)                    T*hidden*2 / NVLink + latency; a boundary
                                                   between servers: the inter-server link's

The efficiency factors ``mfu`` (fraction of peak FLOP/s) and ``mbu`` (fraction of peak bandwidth)
are stated in the scenario (defaults 0.6 and 0.8, typical of well-tuned serving kernels). This model
ignores kernel launch granularity and tile quantization; calibration packs capture those.
"""

from __future__ import annotations


from servesim.hardware import GPUSpec
from servesim.models import ModelShape
from servesim.perf.base import KernelModel, check_bounds

ELEMENTWISE_TENSORS = 16  # reads+writes of hidden-sized tensors per token per layer
ALLREDUCE_LATENCY_S = 8e-6
SEND_RECV_LATENCY_S = 10e-6


class RooflineStepModel(KernelModel):
    """The equations above, evaluated by :mod:`servesim.perf.kernels` (``roofline_*``) on the
    constants this class derives from the GPU, the model shape and the parallelism; ``predict`` /
    ``predict_decode_run`` come from :class:`~servesim.perf.base.KernelModel`."""

    name = "roofline"

    def __init__(self, gpu: GPUSpec, shape: ModelShape, tp: int = 1, pp: int = 1,
                 mfu: float = 0.6, mbu: float = 0.8, overhead_s: float = 0.002, *,
                 cross_hops: int = 0, link_bytes_per_s: float = 0.0, link_latency_s: float = 0.0,
                 note: str = ""):
        if not 0 <= cross_hops <= max(pp - 1, 0) or (cross_hops and not link_bytes_per_s > 0):
            raise ValueError(f"cross_hops {cross_hops} needs 0..pp-1 ({pp - 1}) and a link bandwidth > 0")
        self.gpu, self.shape, self.tp, self.pp = gpu, shape, tp, pp
        self.cross_hops, self.link_bytes_per_s, self.link_latency_s = cross_hops, link_bytes_per_s, link_latency_s
        self.note = note  # where mfu / mbu / overhead_s came from (a fit), for describe()
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
        # decode attention over all layers = layers * max(kv * f, kv * b + n * q)
        self._dec_f = self._layers * 4.0 * self._heads * self._hd / self._flops
        self._dec_b = self._layers * self._kv_bytes_tok_layer / self._bw
        self._dec_q = self._layers * 2 * self._heads * self._hd * self._b / self._bw
        self._tab = None

    def tables(self, max_tokens: int, max_seqs: int):
        """The kernels' :class:`~servesim.perf.kernels.StepTables` (closed forms: no per-count
        tables, so the bounds change nothing)."""
        check_bounds(max_tokens, max_seqs)
        return self._tables()

    def _tables(self):
        if self._tab is None:
            from servesim.perf.kernels import ROOFLINE, step_tables

            (qkv_k, qkv_n), (o_k, o_n), (gu_k, gu_n), (dn_k, dn_n) = self._gemms
            self._tab = step_tables(ROOFLINE, rf=dict(
                layers=self._layers, tp=self.tp, pp=self.pp, qkv_k=qkv_k, qkv_n=qkv_n, o_k=o_k,
                o_n=o_n, gate_up_k=gu_k, gate_up_n=gu_n, down_k=dn_k, down_n=dn_n,
                lm_k=self._lm[0], lm_n=self._lm[1], dtype_bytes=self._b, hidden=self.shape.hidden_size,
                heads=self._heads, head_dim=self._hd, kv_bytes_tok_layer=self._kv_bytes_tok_layer,
                elementwise_bytes_tok=self._elementwise_bytes_tok, flops=self._flops, bw=self._bw,
                link=self.gpu.nvlink_bytes_per_s, allreduce_latency=ALLREDUCE_LATENCY_S,
                send_latency=SEND_RECV_LATENCY_S, x_hops=self.cross_hops, x_bw=self.link_bytes_per_s,
                x_latency=self.link_latency_s, overhead=self.overhead_s, dec_f=self._dec_f,
                dec_b=self._dec_b, dec_q=self._dec_q))
        return self._tab

    def describe(self) -> str:
        return (f"roofline on {self.gpu.name} (mfu {self.mfu:.2f}, mbu {self.mbu:.2f}, "
                f"overhead {self.overhead_s * 1e3:.1f} ms{'; ' + self.note if self.note else ''}), "
                f"tp {self.tp}, pp {self.pp}"
                + (f", {self.cross_hops} stage hop(s) between servers" if self.cross_hops else ""))
