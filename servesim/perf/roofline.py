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

Weight formats, MoE and MLA (the general path of :mod:`servesim.perf.roofline_kernels`, whose
docstring has its equations): a quantized GEMM reads ``bytes_per_param`` per weight and computes
at the format's tensor rate (FP8 / INT8 where the GPU has them: ``GPUSpec.gemm_rate``), and a
weight-only format (AWQ/GPTQ/MXFP4 as w4a16; FP8 on a GPU without FP8 tensor cores as w8a16)
adds its dequantization, ``DEQUANT_OPS_PER_WEIGHT`` CUDA-core operations per weight per
``DEQUANT_TILE`` rows, at ``CUDA_CORE_SHARE`` of the tensor peak -- small next to the weight reads
at small batch (Marlin's near-4x over fp16 up to ~16-32 rows), the reason weight-only GEMMs fall
behind 16-bit ones at large batch. An MoE layer runs its routed experts (expected experts hit by
``t x top-k`` routings; under expert parallelism the busiest rank's share of routed tokens, times
``moe_imbalance``, and an all-to-all dispatch and combine), its shared experts and its router.
MLA: the fused q/kv down-projection (replicated on every rank), the q and kv up-projections, and
attention over the compressed latent: decode reads ``kv_lora_rank + qk_rope_head_dim`` values per
cached token and spends ``heads x (4 kv_lora_rank + 2 qk_rope_head_dim)`` FLOPs on it (the
absorbed form vLLM decodes with); prefill as multi-head attention of (qk 192 + v 128) / 2 = 160
wide heads for DeepSeek-V3.

The efficiency factors ``mfu`` (fraction of peak FLOP/s) and ``mbu`` (fraction of peak bandwidth)
are stated in the scenario (defaults 0.6 and 0.8, typical of well-tuned serving kernels). This model
ignores kernel launch granularity and tile quantization; calibration packs capture those.
"""

from __future__ import annotations


from servesim.hardware import GPUSpec
from servesim.models import ModelShape, weight_format
from servesim.perf.base import KernelModel, check_bounds

ELEMENTWISE_TENSORS = 16  # reads+writes of hidden-sized tensors per token per layer
# weight-only dequantization (w4a16 / w8a16): ~2 integer/half operations per weight (the lop3
# bit tricks of Frantar et al., "MARLIN: Mixed-Precision Auto-Regressive Parallel Inference on
# Large Language Models", arXiv:2408.11743, section 4), once per 64-row tile of the batch, on CUDA
# cores at 1/16 of the tensor peak (A100: 19.5 of 312 TFLOP/s fp32 vs bf16 tensor; H100 SXM: 67 of
# 989: data sheets in servesim/hardware.py)
DEQUANT_OPS_PER_WEIGHT = 2.0
DEQUANT_TILE = 64
CUDA_CORE_SHARE = 1 / 16
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
                 note: str = "", expert_parallel: bool = False, moe_imbalance: float = 1.0):
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
        self._kv_bytes_tok_layer = shape.kv_values_per_token_layer(tp) * shape.kv_dtype_bytes
        self._hd = shape.head_dim
        self._b = b
        self.expert_parallel, self.moe_imbalance = expert_parallel, moe_imbalance
        self._general = self._general_consts(gpu, shape, tp, mfu, expert_parallel, moe_imbalance)
        attn_flops_tok = 4.0 * self._heads * self._hd  # per cached token and layer (QK^T and PV)
        if shape.is_mla:  # decode over the latent; prefill as MHA of (qk + v) / 2 wide heads
            attn_flops_tok = self._heads * (4.0 * shape.kv_lora_rank + 2.0 * shape.qk_rope_head_dim)
            self._hd = (shape.qk_nope_head_dim + shape.qk_rope_head_dim + shape.v_head_dim) // 2
        self._elementwise_bytes_tok = ELEMENTWISE_TENSORS * h * b
        self._lm = (h, shape.vocab_size // tp)
        # decode attention over all layers = layers * max(kv * f, kv * b + n * q)
        self._dec_f = (self._layers * 4.0 * self._heads * self._hd / self._flops if not shape.is_mla
                       else self._layers * attn_flops_tok / self._flops)
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
            self._tab = step_tables(ROOFLINE, rf=self._general_over(dict(
                layers=self._layers, tp=self.tp, pp=self.pp, qkv_k=qkv_k, qkv_n=qkv_n, o_k=o_k,
                o_n=o_n, gate_up_k=gu_k, gate_up_n=gu_n, down_k=dn_k, down_n=dn_n,
                lm_k=self._lm[0], lm_n=self._lm[1], dtype_bytes=self._b, hidden=self.shape.hidden_size,
                heads=self._heads, head_dim=self._hd, kv_bytes_tok_layer=self._kv_bytes_tok_layer,
                elementwise_bytes_tok=self._elementwise_bytes_tok, flops=self._flops, bw=self._bw,
                link=self.gpu.nvlink_bytes_per_s, allreduce_latency=ALLREDUCE_LATENCY_S,
                send_latency=SEND_RECV_LATENCY_S, x_hops=self.cross_hops, x_bw=self.link_bytes_per_s,
                x_latency=self.link_latency_s, overhead=self.overhead_s, dec_f=self._dec_f,
                dec_b=self._dec_b, dec_q=self._dec_q)))
        return self._tab

    def _general_over(self, base: dict) -> dict:
        return {**base, **self._general}

    @staticmethod
    def _general_consts(gpu: GPUSpec, shape: ModelShape, tp: int, mfu: float, expert_parallel: bool,
                        moe_imbalance: float) -> dict:
        """The general path's constants (:mod:`servesim.perf.roofline_kernels`); ``{}`` (the
        dense bf16 path, unchanged) for an unquantized dense GQA model."""
        fmt = weight_format(shape.quantization)
        if fmt.name == "none" and not shape.is_moe and not shape.is_mla:
            return {}
        h = shape.hidden_size
        weight_only = fmt.gemm == "w4a16" or (fmt.gemm == "fp8" and not gpu.fp8_flops_per_s) \
            or (fmt.gemm == "int8" and not gpu.int8_ops_per_s) or (fmt.gemm == "fp4" and not gpu.fp4_flops_per_s)
        rate = gpu.gemm_rate(fmt.gemm if fmt.gemm in ("fp8", "int8", "fp4") else "bf16") * mfu
        out = dict(general=1, w_bytes=float(fmt.bytes_per_param or shape.dtype_bytes), gemm_flops=rate,
                   dequant_s=(DEQUANT_OPS_PER_WEIGHT / (gpu.bf16_flops_per_s * CUDA_CORE_SHARE * mfu)
                              if weight_only else 0.0),
                   dequant_tile=DEQUANT_TILE, moe_q_experts=int(fmt.name != "none"),
                   moe_q_dense=int(fmt.name != "none" and not fmt.experts_only))
        if fmt.name == "none":
            out["gemm_flops"] = gpu.bf16_flops_per_s * mfu
        if shape.is_mla:
            H, dq = shape.num_heads, shape.qk_nope_head_dim + shape.qk_rope_head_dim
            rq, rkv, dr = shape.q_lora_rank, shape.kv_lora_rank, shape.qk_rope_head_dim
            out.update(qkv_k=h, qkv_n=rq + rkv + dr,  # fused q_a + kv_a: replicated on every rank
                       x1_k=rq or h, x1_n=H * dq // tp,  # q_b (or q_proj)
                       x2_k=rkv, x2_n=H * (shape.qk_nope_head_dim + shape.v_head_dim) // tp,  # kv_b
                       o_k=H * shape.v_head_dim // tp, o_n=h)
        dense = shape.num_layers - shape.num_moe_layers
        out.update(dense_layers=dense, moe_layers=shape.num_moe_layers)
        if shape.is_moe:
            ep = tp if expert_parallel else 1
            out.update(moe_experts=-(-shape.num_experts // ep), moe_total=shape.num_experts,
                       moe_topk=shape.num_experts_per_tok, moe_ep=ep, moe_imbalance=float(moe_imbalance),
                       moe_n=shape.moe_intermediate_size if ep > 1 else shape.moe_intermediate_size // tp,
                       shared_n=shape.shared_expert_intermediate_size // tp)
        return out

    def precision_note(self) -> str:
        """How the weight format and the experts are modelled, for describe()."""
        g = self._general
        s = self.shape
        parts = []
        if s.quantization != "none":
            fmt = weight_format(s.quantization)
            how = "weight-only, dequantized" if g["dequant_s"] > 0 else f"{fmt.gemm} GEMMs"
            parts.append(f"weights {s.quantization} ({how})")
        if s.kv_cache_dtype != "auto":
            parts.append(f"KV {s.kv_cache_dtype}")
        if s.is_moe:
            parts.append(f"MoE {s.num_experts} experts top-{s.num_experts_per_tok}, "
                         + (f"EP {g['moe_ep']} (imbalance {self.moe_imbalance:g})" if g["moe_ep"] > 1
                            else "experts TP-sharded"))
        if s.is_mla:
            parts.append("MLA")
        return "; ".join(parts)

    def describe(self) -> str:
        extra = "; ".join(x for x in (self.note, self.precision_note()) if x)
        return (f"roofline on {self.gpu.name} (mfu {self.mfu:.2f}, mbu {self.mbu:.2f}, "
                f"overhead {self.overhead_s * 1e3:.1f} ms{'; ' + extra if extra else ''}), "
                f"tp {self.tp}, pp {self.pp}"
                + (f", {self.cross_hops} stage hop(s) between servers" if self.cross_hops else ""))
