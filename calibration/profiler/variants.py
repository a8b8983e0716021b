"""Ops beyond the bf16 dense decoder, for the profiler: quantized linears and MoE layers.

Why a module of its own: the bf16 ops of ops.py are one torch call each; these are small
recipes (activation quantization + a scaled GEMM, routing + grouped GEMMs, a Triton attention
kernel) with more than one possible backend, and each records which backend ran so that a pack
names the kernel its numbers came from. Everything here runs on the GPU machine with only PyTorch
(and Triton, where present); on CPU the same code runs on PyTorch's CPU kernels (logic tests only:
tests never read CPU times as data).

What each recipe stands for (engines' sources read for the shape of the work, not copied):

* ``fp8`` linear -- vLLM ``--quantization fp8`` on a bf16 checkpoint (vLLM v0.6-v0.10,
  model_executor/layers/quantization/fp8.py): weights e4m3 with one per-tensor scale, activations
  quantized per tensor at run time (one amax reduction + one cast kernel), then a scaled GEMM with
  bf16 output. Here: ``torch._scaled_mm`` (cuBLASLt fp8 on Hopper).
* ``fp8_static`` -- an FP8 checkpoint with STATIC activation scales (NVIDIA ModelOpt's FP8
  checkpoints, e.g. nvidia/Llama-3.1-8B-Instruct-FP8, as TensorRT-LLM and vLLM serve them): weights
  e4m3 with one per-tensor scale, activations with one per-tensor scale fixed at calibration. The
  engines quantize the activation upstream, in the kernel that produces it: TensorRT-LLM's FP8
  linear takes an input that is already e4m3 as it is and quantizes a bf16 one with the static
  scale only otherwise (tensorrt_llm/_torch/modules/linear.py FP8QDQLinearMethod.apply, read at
  00bbf71e), and fuses residual + RMSNorm + FP8 quantization into one kernel
  (AllReduceFusionOp.RESIDUAL_RMS_NORM_QUANT_FP8, tensorrt_llm/_torch/distributed/ops.py); vLLM's
  torch.compile pass replaces RMSNorm followed by static FP8 quantization with one fused kernel
  (vllm/compilation/fusion.py RMSNormStaticQuantPattern / FusedAddRMSNormStaticQuantPattern ->
  _C.rms_norm_static_fp8_quant, read at ef0feb37). So the linear's op is the scaled GEMM alone on
  an e4m3 input, and the producing op writes e4m3 (ops.py, ``fp8=True``): the attention's output
  copy stores e4m3 directly (no kernel of its own), the RMSNorm and the act multiply are followed
  by one cast kernel each (eager PyTorch has no fused norm / act + quant: one small kernel above
  the engines' fused one, charged to the norm and act rows). The static scale is 1 (the profiler's random
  activations stay far inside +-448; an engine's scale is amax / 448 per linear, the same kernels
  and bytes), so the quantization is a plain cast. ``prepare`` does it outside the timed call
  where the op tables need a pre-quantized input; ``__call__`` given bf16 casts first. Not
  modelled: TensorRT-LLM's CUDA-core FP8 GEMM for M <= 8 (cuda_scaled_mm, same file): every M
  runs ``torch._scaled_mm`` (cuBLASLt) here.
* ``fp8_channel`` -- the llm-compressor "FP8 dynamic" checkpoints: per-channel weight scales,
  per-token activation scales, ``torch._scaled_mm`` with row-wise scales (CUTLASS on sm90).
* ``int8`` -- W8A8 int8 (vLLM compressed-tensors w8a8): per-token dynamic activation scales,
  per-channel weight scales, ``torch._int_mm`` (int32 accumulate) then one dequantizing multiply.
  ``_int_mm`` needs more than 16 rows: smaller batches are padded to 32 rows (said in the pack).
* ``int4`` -- weight-only 4-bit with group size 128 (AWQ/GPTQ-style W4A16): PyTorch's tinygemm
  kernel (``torch._weight_int4pack_mm``, the kernel of gpt-fast/torchao), not vLLM's Marlin; where
  it is unavailable the weight is dequantized to bf16 each call and multiplied (vLLM's AWQ path
  for large batches), and the pack says which ran.
* MoE (Qwen3-MoE / Mixtral style, top-k softmax routing with renormalization): ``moe_gate`` =
  router GEMM + softmax + top-k. Two backends for the rest. ``triton-fused`` (the default on a
  CUDA GPU; triton_moe.py, the design of vLLM's fused MoE kernel): ``moe_experts`` = align the
  (token, k) pairs to BLOCK_M-padded expert segments, grouped gate_up GEMM gathering rows by
  sorted id, SiLU*up, grouped down GEMM times the routing weight; ``moe_combine`` = the sum over
  k. ``grouped_mm``: ``moe_experts`` = sort the pairs by expert, gather, ``torch._grouped_mm``
  (CUTLASS grouped GEMM on sm90, as torchtitan uses), SiLU*up, ``torch._grouped_mm``;
  ``moe_combine`` = the routing-weighted index_add back into token order (a per-expert loop where
  the grouped GEMM is absent). Random router weights route nearly uniformly, which is what the
  pack says it measured.
* Decode attention over fp8 KV and MLA decode: triton_decode.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
INT4_GROUP = 128
WEIGHT_FORMATS = ("bf16", "fp8", "fp8_static", "fp8_channel", "int8", "int4")
#: the pack's ``dtype`` (bytes per weight) for each format
FORMAT_DTYPE = {"bf16": "bf16", "fp8": "fp8", "fp8_static": "fp8", "fp8_channel": "fp8", "int8": "int8",
                "int4": "int4"}
#: formats whose activation is quantized by the op that produces it (the linear takes e4m3)
UPSTREAM_QUANT = ("fp8_static",)


# ============================================================================== quantized linears
class QLinear:
    """``y = x @ W.T`` (bf16 in, bf16 out) with W stored in one of WEIGHT_FORMATS.

    Built from a bf16 weight [out, in]; ``__call__`` does everything an engine does per call
    (activation quantization included), so its time is the op's time.
    """

    def __init__(self, w: torch.Tensor, fmt: str):
        if fmt not in WEIGHT_FORMATS:
            raise ValueError(f"weight format {fmt!r}; known: {WEIGHT_FORMATS}")
        self.sx = None  # fp8_static: the static activation scale
        self.fmt = fmt
        self.out_f, self.in_f = w.shape
        self.backend = "torch.nn.functional.linear (bf16)"
        dev = w.device
        if fmt == "bf16":
            self.w = w
        elif fmt in ("fp8", "fp8_static"):
            s = (w.abs().amax().float() / FP8_MAX).clamp(min=1e-12)
            self.wq_t = (w.float() / s).to(FP8).t()  # column-major [in, out], as cuBLASLt wants
            self.sw = s.reshape(())
            self.backend = "torch._scaled_mm e4m3, per-tensor scales (dynamic per-tensor activation quant)"
            if fmt == "fp8_static":
                self.sx = torch.ones((), device=dev, dtype=torch.float32)  # static scale 1 (module doc)
                self.backend = ("torch._scaled_mm e4m3, per-tensor scales, static activation scale; input "
                                "quantized upstream (by the op that produces it, as engines fuse it: not in "
                                "the linear's time)")
        elif fmt == "fp8_channel":
            s = (w.abs().amax(dim=1, keepdim=True).float() / FP8_MAX).clamp(min=1e-12)  # [out, 1]
            self.wq_t = (w.float() / s).to(FP8).t()
            self.sw = s.t().contiguous()  # [1, out]
            self.backend = "torch._scaled_mm e4m3, row-wise scales (per-token activation, per-channel weight)"
        elif fmt == "int8":
            s = (w.abs().amax(dim=1, keepdim=True).float() / 127.0).clamp(min=1e-12)
            self.wq_t = torch.round(w.float() / s).clamp(-127, 127).to(torch.int8).t()
            self.sw = s.t().contiguous()
            self.backend = "torch._int_mm int8 (per-token activation, per-channel weight), int32 accumulate"
        else:  # int4 weight-only, group 128, asymmetric (scale and zero per group)
            self._init_int4(w, dev)

    # --- int4 -----------------------------------------------------------------------------
    def _init_int4(self, w: torch.Tensor, dev) -> None:
        n, k = w.shape
        g = INT4_GROUP if k % INT4_GROUP == 0 else k
        wg = w.float().reshape(n, k // g, g)
        lo, hi = wg.amin(dim=2, keepdim=True), wg.amax(dim=2, keepdim=True)
        scale = ((hi - lo) / 15.0).clamp(min=1e-6)
        q = torch.round((wg - lo) / scale).clamp(0, 15).to(torch.int32).reshape(n, k)
        zero_mid = lo + 8 * scale  # tinygemm's zero point convention: w = (q - 8) * s + z
        self.group = g
        self.q = q
        self.scale = scale.reshape(n, k // g)
        self.lo = lo.reshape(n, k // g)
        sz = torch.stack([scale.reshape(n, k // g).t(), zero_mid.reshape(n, k // g).t()], dim=2)
        self.scales_zeros = sz.to(torch.bfloat16).contiguous()  # [k/g, n, 2]
        self.packed = None
        try:
            if dev.type == "cuda":
                u8 = ((q[:, ::2] << 4) | q[:, 1::2]).to(torch.uint8)
                self.packed = torch._convert_weight_to_int4pack(u8.contiguous(), 8)
                self._mm = lambda x: torch._weight_int4pack_mm(x, self.packed, g, self.scales_zeros)
            else:
                self.packed = torch._convert_weight_to_int4pack_for_cpu(q.contiguous(), 8)
                self._mm = lambda x: torch._weight_int4pack_mm_for_cpu(x, self.packed, g, self.scales_zeros)
            self._mm(torch.zeros(1, k, device=dev, dtype=torch.bfloat16))  # fails here, not later
            self.backend = f"torch._weight_int4pack_mm (tinygemm) W4A16, group {g}"
        except Exception as exc:  # dequantize per call, then a bf16 GEMM
            self.packed = None
            self.q8 = q.to(torch.uint8)
            self._mm = self._dequant_mm
            self.backend = (f"dequantize to bf16 + F.linear, group {g} (tinygemm unavailable: "
                            f"{type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''})")

    def _dequant_mm(self, x):
        n, k = self.q8.shape
        g = self.group
        w = (self.q8.reshape(n, k // g, g).to(torch.bfloat16) * self.scale.to(torch.bfloat16)[..., None]
             + self.lo.to(torch.bfloat16)[..., None]).reshape(n, k)
        return F.linear(x, w)

    def dequantized(self) -> torch.Tensor:
        """The weight this linear multiplies by, in float32 (for accuracy checks)."""
        if self.fmt == "bf16":
            return self.w.float()
        if self.fmt in ("fp8", "fp8_static"):
            return self.wq_t.t().float() * self.sw
        if self.fmt in ("fp8_channel", "int8"):
            return self.wq_t.t().float() * self.sw.t()
        n, k = self.q.shape
        g = self.group
        return (self.q.reshape(n, k // g, g).float() * self.scale[..., None] + self.lo[..., None]).reshape(n, k)

    # --- the call -------------------------------------------------------------------------------
    def quantize(self, x: torch.Tensor) -> torch.Tensor:
        """fp8_static: ``x`` (bf16) in e4m3 with the static scale 1 -- one cast (PyTorch's e4m3fn
        cast saturates at +-448), the work an engine fuses into the kernel that produces ``x``."""
        if self.fmt not in UPSTREAM_QUANT:
            raise ValueError(f"quantize: weight format {self.fmt!r} quantizes inside the call; only "
                             f"{', '.join(UPSTREAM_QUANT)} takes a pre-quantized input")
        return x.to(FP8)

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """The input as the timed call takes it: pre-quantized for fp8_static (its quantization is
        upstream work, not the linear's), ``x`` itself for every other format."""
        return self.quantize(x) if self.fmt in UPSTREAM_QUANT and x.dtype != FP8 else x

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        f = self.fmt
        if f == "bf16":
            return F.linear(x, self.w)
        if f == "fp8_static":
            xq = x if x.dtype == FP8 else self.quantize(x)
            return torch._scaled_mm(xq, self.wq_t, self.sx, self.sw, out_dtype=torch.bfloat16)
        if f == "fp8":
            sx = (x.abs().amax().float() / FP8_MAX).clamp(min=1e-12)
            xq = (x / sx).to(FP8)
            return torch._scaled_mm(xq, self.wq_t, sx, self.sw, out_dtype=torch.bfloat16)
        if f == "fp8_channel":
            sx = (x.abs().amax(dim=1, keepdim=True).float() / FP8_MAX).clamp(min=1e-12)
            xq = (x / sx).to(FP8)
            return torch._scaled_mm(xq, self.wq_t, sx, self.sw, out_dtype=torch.bfloat16)
        if f == "int8":
            m = x.shape[0]
            sx = (x.abs().amax(dim=1, keepdim=True).float() / 127.0).clamp(min=1e-12)
            xq = torch.round(x / sx).clamp(-127, 127).to(torch.int8)
            if m <= 16:  # _int_mm needs more than 16 rows
                xq = F.pad(xq, (0, 0, 0, 32 - m))
            acc = torch._int_mm(xq, self.wq_t)[:m]
            return (acc.float() * sx * self.sw).to(torch.bfloat16)
        return self._mm(x)


# ============================================================================== mixture of experts
@dataclass(frozen=True)
class MoEShape:
    experts: int
    top_k: int
    inter: int  # moe_intermediate_size (per expert)
    hidden: int
    norm_topk: bool = True  # Qwen3-MoE renormalizes the top-k weights; Mixtral's softmax is over top-k


def has_grouped_mm(device) -> bool:
    return hasattr(torch, "_grouped_mm") and (device.type != "cuda"
                                              or torch.cuda.get_device_capability(device) >= (9, 0))


#: the experts' backends: our fused Triton kernel (triton_moe.py), PyTorch's grouped GEMM after a
#: sort-by-expert permutation, and a per-expert loop (CPU / older GPUs)
MOE_BACKENDS = ("triton-fused", "grouped_mm", "loop")
#: set by the command line's ``--moe-backend`` (environment.setup); "auto": triton-fused on a CUDA
#: device with Triton, else grouped_mm where PyTorch has it, else loop
MOE_DEFAULT = {"backend": "auto"}


def _why(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"


class MoE:
    """One MoE layer's experts with random weights; gate / experts / combine are the pack's three ops.

    ``backend`` (MOE_BACKENDS, or None for MOE_DEFAULT) picks the experts' kernels; ``use`` switches
    it on the same weights (the survey times both). ``kind`` is the short label of the backend that
    runs (a survey row's ``backend``), ``backend`` the description a pack's YAML stores.
    ``grouped`` (True/False) is the older spelling of grouped_mm / loop."""

    def __init__(self, shape: MoEShape, device, gen: torch.Generator, grouped: Optional[bool] = None,
                 backend: Optional[str] = None, tune: Optional[bool] = None):
        s = shape
        self.s = s
        self.device = device
        dt = torch.bfloat16

        def r(*sh, scale=1.0):
            return torch.randn(*sh, generator=gen, device=device, dtype=dt) * scale
        self.router = r(s.experts, s.hidden, scale=s.hidden ** -0.5)
        self.w13 = r(s.experts, 2 * s.inter, s.hidden, scale=s.hidden ** -0.5)  # [E, 2I, h]
        self.w2 = r(s.experts, s.hidden, s.inter, scale=s.inter ** -0.5)  # [E, h, I]
        self.tune = tune
        self.fused = None
        self.failed: dict[str, str] = {}  # backend -> why it could not run here
        if backend is None and grouped is not None:
            backend = "grouped_mm" if grouped else "loop"
        backend = backend or MOE_DEFAULT["backend"]
        if backend == "auto":
            backend = next(b for b in ("triton-fused", "grouped_mm", "loop")
                           if (b != "triton-fused" or device.type == "cuda") and self.available(b))
        self.use(backend)

    def available(self, backend: str) -> bool:
        """Whether ``backend`` runs here (tried once on a small input; the reason is kept in
        ``failed``), so that a timed call never fails."""
        if backend not in MOE_BACKENDS:
            raise ValueError(f"moe backend {backend!r}; known: {MOE_BACKENDS}")
        if backend in self.failed:
            return False
        s, dev = self.s, self.device
        try:
            if backend == "grouped_mm":
                if not has_grouped_mm(dev):
                    raise RuntimeError("torch._grouped_mm needs PyTorch >= 2.8 and sm90+")
                x = torch.zeros(2 * s.experts, s.hidden, device=dev, dtype=torch.bfloat16)
                offs = torch.arange(2, 2 * s.experts + 1, 2, device=dev, dtype=torch.int32)
                torch._grouped_mm(x, self.w13.transpose(-2, -1), offs=offs)
            elif backend == "triton-fused" and self.fused is None:
                from .triton_moe import FusedMoE
                fused = FusedMoE(self.w13, self.w2, s.top_k, tune=self.tune)
                x = torch.zeros(2, s.hidden, device=dev, dtype=torch.bfloat16)
                idx = torch.arange(2 * s.top_k, device=dev).reshape(2, s.top_k) % s.experts
                fused.run(x, idx, torch.ones(2, s.top_k, device=dev), fused.config(2))
                self.fused = fused
        except Exception as exc:
            self.failed[backend] = _why(exc)
            return False
        return True

    def use(self, backend: str) -> "MoE":
        """Run the experts on ``backend`` from now on (a failed one falls back to grouped_mm, then
        loop, and the description says why)."""
        why = "" if self.available(backend) else f" ({backend} failed: {self.failed[backend]})"
        if why:
            backend = "grouped_mm" if backend != "grouped_mm" and self.available("grouped_mm") else "loop"
        self.kind = backend
        self.grouped = backend == "grouped_mm"
        if backend == "triton-fused":
            self.backend = self.fused.describe(self.fused.tune)
        elif backend == "grouped_mm":
            self.backend = "torch._grouped_mm (CUTLASS grouped GEMM), sort-by-expert permutation, index_add combine"
        else:
            self.backend = "per-expert F.linear loop (host-synchronizing), index_add combine"
        self.backend += why
        return self

    def gate(self, x, bias=None):
        """Router logits, softmax, top-k. ``bias`` ([T, E], optional) is added to the logits: the
        profiler's forwards pass a per-token random one so that routing stays uniform at random
        per token (random weights otherwise route the tokens of one prompt, whose hidden states the
        attention of random weights makes nearly equal, to the same few experts)."""
        logits = F.linear(x, self.router)
        if bias is not None:
            logits = logits + bias
        probs = torch.softmax(logits.float(), dim=-1)
        w, idx = torch.topk(probs, self.s.top_k, dim=-1)
        if self.s.norm_topk:
            w = w / w.sum(dim=-1, keepdim=True)
        return w, idx

    def experts(self, x, idx, w=None):
        """Returns (expert outputs, sort order). grouped_mm / loop: the outputs in expert-sorted
        order [T*k, h], unweighted, and the order; triton-fused: [T, k, h] already multiplied by
        the routing weights ``w`` (the fused down GEMM does it), and None."""
        s = self.s
        if self.kind == "triton-fused":
            if w is None:
                raise ValueError("moe experts: the triton-fused backend needs the routing weights w")
            return self.fused(x, idx, w), None
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        xs = x.index_select(0, order // s.top_k)
        if self.grouped:
            # counts without a host sync (bincount reads its maximum back): capturable in a graph
            counts = torch.zeros(s.experts, dtype=torch.int64, device=x.device).index_add_(
                0, flat, torch.ones_like(flat))
            offs = torch.cumsum(counts, 0).to(torch.int32)
            h1 = torch._grouped_mm(xs, self.w13.transpose(-2, -1), offs=offs)
            a = F.silu(h1[:, :s.inter]) * h1[:, s.inter:]
            return torch._grouped_mm(a, self.w2.transpose(-2, -1), offs=offs), order
        counts = torch.bincount(flat, minlength=s.experts).tolist()
        outs, start = [], 0
        for e, c in enumerate(counts):
            if c:
                h1 = F.linear(xs[start:start + c], self.w13[e])
                outs.append(F.linear(F.silu(h1[:, :s.inter]) * h1[:, s.inter:], self.w2[e]))
            start += c
        return torch.cat(outs, 0), order

    def combine(self, y_sorted, order, w, T: int):
        """The layer's output [T, h]: the sum over k (triton-fused: ``order`` None, ``y`` weighted
        [T, k, h]) or the routing-weighted index_add back into token order."""
        if order is None:
            return y_sorted.sum(1)
        wts = w.reshape(-1).index_select(0, order).to(y_sorted.dtype)
        out = torch.zeros(T, self.s.hidden, device=y_sorted.device, dtype=y_sorted.dtype)
        out.index_add_(0, order // self.s.top_k, y_sorted * wts[:, None])
        return out

    def __call__(self, x, bias=None):
        w, idx = self.gate(x, bias)
        y, order = self.experts(x, idx, w)
        return self.combine(y, order, w, x.shape[0])

    def reference(self, x, bias=None):
        """float64 loop over tokens (accuracy check)."""
        w, idx = self.gate(x, bias)
        out = torch.zeros(x.shape[0], self.s.hidden, dtype=torch.float64, device=x.device)
        xd = x.double()
        for t in range(x.shape[0]):
            for j in range(self.s.top_k):
                e = int(idx[t, j])
                h1 = xd[t] @ self.w13[e].double().t()
                a = F.silu(h1[:self.s.inter]) * h1[self.s.inter:]
                out[t] += float(w[t, j]) * (a @ self.w2[e].double().t())
        return out


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref).norm() / ref.norm().clamp(min=1e-30))
