"""Precisions a model is served in, with vLLM's names: one registry of weight formats
(``--quantization``) and KV-cache dtypes (``--kv-cache-dtype``).

A weight format says how many bytes one quantized parameter takes (scales included) and how its
GEMMs compute (``gemm``): at the model dtype's tensor-core rate (``bf16``), at the FP8 or INT8
rate (activations quantized too: W8A8), or as a weight-only ``w4a16`` kernel that dequantizes
4-bit weights to 16 bits in registers before 16-bit tensor-core math (vLLM's Marlin kernels for
AWQ, GPTQ and, on Hopper, MXFP4). Where a GPU has no FP8 tensor cores (Ampere), vLLM runs FP8
checkpoints weight-only (FP8 Marlin): ``gemm`` falls back to ``w8a16``.

Sources (vLLM v0.10 documentation, docs/features/quantization/): fp8.md (per-tensor/channel
scales, W8A8 on compute capability >= 8.9, weight-only Marlin below), int8.md (W8A8 INT8),
auto_awq.md and gptq.md (4-bit weights, group size 128: one fp16 scale and one 4-bit zero point
per 128 weights), and the gpt-oss model card (MXFP4: 4-bit values with one 8-bit E8M0 scale per
32, on the MoE weights only); NVFP4 (4-bit E2M1 values, one FP8 E4M3 scale per 16, W4A4 on
Blackwell's FP4 tensor cores): vLLM's ModelOpt NVFP4 support (docs/features/quantization/modelopt.md).

``fp8`` and ``fp8_static`` cost the same bytes and FP8 tensor-core math; they differ in where the
activation's quantization runs. ``fp8`` (vLLM ``--quantization fp8`` on a bf16 checkpoint) computes
a dynamic per-tensor scale inside every linear (an amax reduction and a cast kernel per call);
``fp8_static`` (a checkpoint with calibrated activation scales, e.g. NVIDIA's ModelOpt FP8
checkpoints that TensorRT-LLM's published numbers use) quantizes in the norm / activation kernel
before the linear. Packs are measured per name (``<model>-fp8`` / ``<model>-fp8_static``), so a
scenario picks the recipe its engine runs; calibration/profiler/variants.py says what each times.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WeightFormat:
    name: str
    bytes_per_param: float | None  # None: the model dtype's
    gemm: str  # bf16, fp8, int8, w4a16
    experts_only: bool = False  # only the routed experts take this format (gpt-oss's MXFP4)
    description: str = ""


GROUP = 128  # AWQ / GPTQ group size (vLLM's default checkpoints)

WEIGHT_FORMATS: dict[str, WeightFormat] = {
    "none": WeightFormat("none", None, "bf16", description="unquantized (the model dtype, bf16)"),
    "fp8": WeightFormat("fp8", 1.0, "fp8", description="FP8 E4M3 weights and activations (W8A8)"),
    "fp8_static": WeightFormat("fp8_static", 1.0, "fp8",
                               description="FP8 E4M3 weights and activations with STATIC per-tensor "
                                           "activation scales (ModelOpt FP8 checkpoints, as TensorRT-LLM "
                                           "and vLLM serve them): the activation's quantization is fused into "
                                           "the kernel before the linear, so a linear is the scaled GEMM alone"),
    "int8": WeightFormat("int8", 1.0, "int8", description="INT8 weights and activations (W8A8)"),
    "awq": WeightFormat("awq", 0.5 + 2.5 / GROUP, "w4a16",
                        description="AWQ 4-bit weights, group 128 (fp16 scale + 4-bit zero): 4.16 bits"),
    "gptq": WeightFormat("gptq", 0.5 + 2.5 / GROUP, "w4a16",
                         description="GPTQ 4-bit weights, group 128 (fp16 scale + 4-bit zero): 4.16 bits"),
    "nvfp4": WeightFormat("nvfp4", 0.5 + 1 / 16, "fp4",
                          description="NVFP4 weights and activations (4-bit, one FP8 scale per 16: 4.5 bits)"),
    "mxfp4": WeightFormat("mxfp4", 0.5 + 1 / 32, "w4a16", experts_only=True,
                          description="MXFP4 experts (4-bit, one E8M0 scale per 32: 4.25 bits), rest bf16"),
}

KV_CACHE_DTYPES: dict[str, int | None] = {"auto": None, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


def weight_format(name: str) -> WeightFormat:
    try:
        return WEIGHT_FORMATS[name]
    except KeyError:
        raise ValueError(f"quantization {name!r}: unknown; allowed: {', '.join(WEIGHT_FORMATS)}") from None


def kv_dtype_bytes(name: str, model_dtype_bytes: int) -> int:
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype {name!r}: unknown; allowed: {', '.join(KV_CACHE_DTYPES)}")
    b = KV_CACHE_DTYPES[name]
    return model_dtype_bytes if b is None else b


def split_pack_name(name: str) -> tuple[str, str, str]:
    """A pack name ``<model>[-<quantization>][-kv<dtype>]`` -> (model, quantization, kv_cache_dtype);
    here, below the configs, so that a pack reference is checked without importing perf."""
    model, quant, kv = name, "none", "auto"
    for d in sorted((k for k in KV_CACHE_DTYPES if k != "auto"), key=len, reverse=True):
        if model.endswith(f"-kv{d}"):
            model, kv = model[: -len(f"-kv{d}")], d
            break
    for q in sorted((k for k in WEIGHT_FORMATS if k != "none"), key=len, reverse=True):
        if model.endswith(f"-{q}"):
            model, quant = model[: -len(f"-{q}")], q
            break
    return model, quant, kv
