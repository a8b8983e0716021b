"""GPU specifications: the numbers the roofline model and the memory planner need.

Values are vendor datasheet figures for dense bf16 tensor-core throughput, HBM bandwidth and
memory size (as ``nvidia-smi`` reports it, in MiB), plus the intra-node interconnect used for
tensor-parallel all-reduce and the host link used for KV swapping. They are *peaks*; the roofline
model applies stated efficiency factors, and calibration packs replace them with measurements.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024**2
GIB = 1024**3


@dataclass(frozen=True)
class GPUSpec:
    name: str
    memory_bytes: int
    hbm_bytes_per_s: float
    bf16_flops_per_s: float  # dense, no sparsity
    nvlink_bytes_per_s: float  # per-direction bandwidth available to an all-reduce ring
    pcie_bytes_per_s: float  # host <-> device, one direction, effective
    description: str


GPUS: dict[str, GPUSpec] = {
    "a100-80g": GPUSpec(
        name="a100-80g",
        memory_bytes=81920 * MIB,
        hbm_bytes_per_s=2.039e12,
        bf16_flops_per_s=312e12,
        nvlink_bytes_per_s=300e9,
        pcie_bytes_per_s=25e9,
        description="NVIDIA A100-SXM4-80GB (HBM2e 2.0 TB/s, 312 TFLOP/s bf16, NVLink3 600 GB/s bidir.)",
    ),
    "h100-80g": GPUSpec(
        name="h100-80g",
        memory_bytes=81559 * MIB,
        hbm_bytes_per_s=3.35e12,
        bf16_flops_per_s=989e12,
        nvlink_bytes_per_s=450e9,
        pcie_bytes_per_s=50e9,
        description="NVIDIA H100-SXM5-80GB (HBM3 3.35 TB/s, 989 TFLOP/s bf16, NVLink4 900 GB/s bidir.)",
    ),
    "h200": GPUSpec(
        name="h200",
        memory_bytes=143771 * MIB,
        hbm_bytes_per_s=4.8e12,
        bf16_flops_per_s=989e12,
        nvlink_bytes_per_s=450e9,
        pcie_bytes_per_s=50e9,
        description="NVIDIA H200-SXM-141GB (HBM3e 4.8 TB/s, 989 TFLOP/s bf16, NVLink4 900 GB/s bidir.)",
    ),
}


def gpu_names() -> list[str]:
    return sorted(GPUS)
