"""GPU specifications: the one registry of GPUs, with the numbers the roofline model, the memory
planner and pack transfer need.

Every number is a vendor data-sheet figure (dense tensor-core throughput, i.e. without 2:4
sparsity; HBM bandwidth; memory), with its source in the comment beside it. ``memory_bytes`` is
what the driver reports (``nvidia-smi``, MiB) where that reading is stated, else the data sheet's
decimal gigabytes. ``nvlink_bytes_per_s`` is the per-direction bandwidth a ring all-reduce sees
(half the data sheet's bidirectional figure; PCIe peer-to-peer where a card has no NVLink);
``pcie_bytes_per_s`` the effective host link one way (~78 % of the PCIe generation's x16 peak:
25 GB/s Gen4, 50 GB/s Gen5), used for KV swapping. ``arch`` groups GPUs whose kernels behave
alike: a pack is transferred only within an architecture (servesim/perf/transfer.py).

Sources (data sheets, as published by the vendor):

* [A100]  NVIDIA A100 Tensor Core GPU data sheet, nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
* [H100]  NVIDIA H100 Tensor Core GPU data sheet, h100-datasheet-2430615 (SXM, PCIe, NVL columns)
* [H200]  NVIDIA H200 Tensor Core GPU data sheet, hpc-datasheet-sc23-h200 (H200 SXM column)
* [H20]   NVIDIA HGX H20 product brief (2024): 96 GB HBM3, 4.0 TB/s, FP8 296 TFLOPS, BF16 148 TFLOPS,
          NVLink 900 GB/s
* [L40S]  NVIDIA L40S data sheet, l40s-datasheet-2878744 (figures without sparsity)
* [B200]  NVIDIA DGX B200 / HGX B200 data sheet (per-GPU figures: the 8-GPU totals / 8, dense = half
          the sparse figures the sheet leads with)
* [MI300X] AMD Instinct MI300X data sheet, amd-instinct-mi300x-data-sheet.pdf
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
    arch: str = ""  # ampere, hopper, ada, blackwell, cdna3: packs transfer within one
    fp8_flops_per_s: float = 0.0  # dense FP8 tensor throughput; 0: no FP8 tensor cores
    int8_ops_per_s: float = 0.0  # dense INT8 tensor throughput
    fp4_flops_per_s: float = 0.0  # dense FP4 tensor throughput (Blackwell); 0: none
    source: str = ""  # the data sheet

    def gemm_rate(self, kind: str) -> float:
        """Peak tensor throughput for a GEMM computed as ``kind`` (bf16, fp8, int8); FP8 on a GPU
        without FP8 tensor cores computes in 16 bits (vLLM's weight-only FP8 Marlin kernel)."""
        if kind == "fp8":
            return self.fp8_flops_per_s or self.bf16_flops_per_s
        if kind == "int8":
            return self.int8_ops_per_s or self.bf16_flops_per_s
        if kind == "fp4":
            return self.fp4_flops_per_s or self.bf16_flops_per_s
        return self.bf16_flops_per_s


def _gpus(*specs: GPUSpec) -> dict[str, GPUSpec]:
    return {s.name: s for s in specs}


GPUS: dict[str, GPUSpec] = _gpus(
    # --- Ampere [A100] ---------------------------------------------------------------------
    GPUSpec(
        name="a100-80g", arch="ampere", source="A100",
        memory_bytes=81920 * MIB,  # [A100] SXM 80 GB HBM2e; nvidia-smi 81920 MiB
        hbm_bytes_per_s=2.039e12,  # [A100] SXM 80GB: 2,039 GB/s
        bf16_flops_per_s=312e12,  # [A100] BF16 tensor 312 TFLOPS
        int8_ops_per_s=624e12,  # [A100] INT8 tensor 624 TOPS; no FP8
        nvlink_bytes_per_s=300e9,  # [A100] NVLink 600 GB/s bidirectional
        pcie_bytes_per_s=25e9,  # [A100] PCIe Gen4 64 GB/s bidirectional
        description="NVIDIA A100-SXM4-80GB (HBM2e 2.0 TB/s, 312 TFLOP/s bf16, NVLink3 600 GB/s bidir.)",
    ),
    GPUSpec(
        name="a100-40g", arch="ampere", source="A100",
        memory_bytes=40960 * MIB,  # [A100] SXM 40 GB HBM2; nvidia-smi 40960 MiB
        hbm_bytes_per_s=1.555e12,  # [A100] SXM 40GB: 1,555 GB/s
        bf16_flops_per_s=312e12,  # [A100] BF16 tensor 312 TFLOPS
        int8_ops_per_s=624e12,  # [A100] INT8 624 TOPS
        nvlink_bytes_per_s=300e9,  # [A100] NVLink 600 GB/s bidirectional
        pcie_bytes_per_s=25e9,  # [A100] PCIe Gen4
        description="NVIDIA A100-SXM4-40GB (HBM2 1.6 TB/s, 312 TFLOP/s bf16, NVLink3 600 GB/s bidir.)",
    ),
    GPUSpec(
        name="a100-80g-pcie", arch="ampere", source="A100",
        memory_bytes=81920 * MIB,  # [A100] PCIe 80 GB HBM2e (as nvidia-smi reports the SXM 80GB: 81920 MiB)
        hbm_bytes_per_s=1.935e12,  # [A100] PCIe 80GB: 1,935 GB/s
        bf16_flops_per_s=312e12,  # [A100] BF16 tensor 312 TFLOPS
        int8_ops_per_s=624e12,  # [A100] INT8 624 TOPS
        nvlink_bytes_per_s=300e9,  # [A100] NVLink bridge for 2 GPUs 600 GB/s bidirectional
        pcie_bytes_per_s=25e9,  # [A100] PCIe Gen4
        description="NVIDIA A100 80GB PCIe (HBM2e 1.9 TB/s, 312 TFLOP/s bf16, NVLink bridge 600 GB/s bidir.)",
    ),
    GPUSpec(
        name="a100-40g-pcie", arch="ampere", source="A100",
        memory_bytes=40960 * MIB,  # [A100] PCIe 40 GB HBM2 (nvidia-smi 40960 MiB)
        hbm_bytes_per_s=1.555e12,  # [A100] PCIe 40GB: 1,555 GB/s
        bf16_flops_per_s=312e12,  # [A100] BF16 tensor 312 TFLOPS
        int8_ops_per_s=624e12,  # [A100] INT8 624 TOPS
        nvlink_bytes_per_s=300e9,  # [A100] NVLink bridge 600 GB/s bidirectional
        pcie_bytes_per_s=25e9,  # [A100] PCIe Gen4
        description="NVIDIA A100 40GB PCIe (HBM2 1.6 TB/s, 312 TFLOP/s bf16, NVLink bridge 600 GB/s bidir.)",
    ),
    # --- Hopper [H100] [H200] [H20] ----------------------------------------------------------
    GPUSpec(
        name="h100-80g", arch="hopper", source="H100",
        memory_bytes=81559 * MIB,  # [H100] SXM 80 GB HBM3; nvidia-smi 81559 MiB
        hbm_bytes_per_s=3.35e12,  # [H100] SXM: 3.35 TB/s
        bf16_flops_per_s=989e12,  # [H100] SXM BF16 1,979 TFLOPS with sparsity -> 989 dense
        fp8_flops_per_s=1979e12,  # [H100] SXM FP8 3,958 with sparsity -> 1,979 dense
        int8_ops_per_s=1979e12,  # [H100] SXM INT8 3,958 TOPS with sparsity -> 1,979 dense
        nvlink_bytes_per_s=450e9,  # [H100] SXM NVLink 900 GB/s bidirectional
        pcie_bytes_per_s=50e9,  # [H100] PCIe Gen5 128 GB/s bidirectional
        description="NVIDIA H100-SXM5-80GB (HBM3 3.35 TB/s, 989 TFLOP/s bf16, NVLink4 900 GB/s bidir.)",
    ),
    GPUSpec(
        name="h100-pcie", arch="hopper", source="H100",
        memory_bytes=81559 * MIB,  # [H100] PCIe 80 GB HBM2e (nvidia-smi 81559 MiB, as the SXM)
        hbm_bytes_per_s=2.0e12,  # [H100] PCIe: 2 TB/s
        bf16_flops_per_s=756e12,  # [H100] PCIe BF16 1,513 with sparsity -> 756 dense
        fp8_flops_per_s=1513e12,  # [H100] PCIe FP8 3,026 with sparsity -> 1,513 dense
        int8_ops_per_s=1513e12,  # [H100] PCIe INT8 3,026 TOPS with sparsity -> 1,513 dense
        nvlink_bytes_per_s=300e9,  # [H100] PCIe: NVLink bridge 600 GB/s bidirectional
        pcie_bytes_per_s=50e9,  # [H100] PCIe Gen5 128 GB/s bidirectional
        description="NVIDIA H100 PCIe 80GB (HBM2e 2.0 TB/s, 756 TFLOP/s bf16, NVLink bridge 600 GB/s bidir.)",
    ),
    GPUSpec(
        name="h100-nvl", arch="hopper", source="H100",
        memory_bytes=94 * 10**9,  # [H100] NVL: 94 GB HBM3
        hbm_bytes_per_s=3.9e12,  # [H100] NVL: 3.9 TB/s
        bf16_flops_per_s=835e12,  # [H100] NVL BF16 1,671 with sparsity -> 835 dense
        fp8_flops_per_s=1671e12,  # [H100] NVL FP8 3,341 with sparsity -> 1,671 dense
        int8_ops_per_s=1671e12,  # [H100] NVL INT8 3,341 TOPS with sparsity -> 1,671 dense
        nvlink_bytes_per_s=300e9,  # [H100] NVL: NVLink bridge 600 GB/s bidirectional
        pcie_bytes_per_s=50e9,  # [H100] PCIe Gen5 128 GB/s bidirectional
        description="NVIDIA H100 NVL 94GB (HBM3 3.9 TB/s, 835 TFLOP/s bf16, NVLink bridge 600 GB/s bidir.)",
    ),
    GPUSpec(
        name="h200", arch="hopper", source="H200",
        memory_bytes=143771 * MIB,  # [H200] 141 GB HBM3e; nvidia-smi 143771 MiB
        hbm_bytes_per_s=4.8e12,  # [H200] 4.8 TB/s
        bf16_flops_per_s=989e12,  # [H200] BF16 1,979 TFLOPS with sparsity -> 989 dense
        fp8_flops_per_s=1979e12,  # [H200] FP8 3,958 with sparsity -> 1,979 dense
        int8_ops_per_s=1979e12,  # [H200] INT8 3,958 TOPS with sparsity -> 1,979 dense
        nvlink_bytes_per_s=450e9,  # [H200] NVLink 900 GB/s bidirectional
        pcie_bytes_per_s=50e9,  # [H200] PCIe Gen5 128 GB/s bidirectional
        description="NVIDIA H200-SXM-141GB (HBM3e 4.8 TB/s, 989 TFLOP/s bf16, NVLink4 900 GB/s bidir.)",
    ),
    GPUSpec(
        name="h20", arch="hopper", source="H20",
        memory_bytes=96 * 10**9,  # [H20] 96 GB HBM3
        hbm_bytes_per_s=4.0e12,  # [H20] 4.0 TB/s
        bf16_flops_per_s=148e12,  # [H20] BF16 148 TFLOPS (dense)
        fp8_flops_per_s=296e12,  # [H20] FP8 296 TFLOPS (dense)
        int8_ops_per_s=296e12,  # [H20] INT8 296 TOPS (dense)
        nvlink_bytes_per_s=450e9,  # [H20] NVLink 900 GB/s bidirectional
        pcie_bytes_per_s=50e9,  # [H20] PCIe Gen5 128 GB/s bidirectional
        description="NVIDIA H20 96GB (HBM3 4.0 TB/s, 148 TFLOP/s bf16, NVLink 900 GB/s bidir.)",
    ),
    # --- Ada [L40S] --------------------------------------------------------------------------
    GPUSpec(
        name="l40s", arch="ada", source="L40S",
        memory_bytes=48 * 10**9,  # [L40S] 48 GB GDDR6 with ECC
        hbm_bytes_per_s=864e9,  # [L40S] 864 GB/s
        bf16_flops_per_s=362.05e12,  # [L40S] BF16 tensor 362.05 TFLOPS (733 with sparsity)
        fp8_flops_per_s=733e12,  # [L40S] FP8 733 TFLOPS (1,466 with sparsity)
        int8_ops_per_s=733e12,  # [L40S] INT8 733 TOPS (1,466 with sparsity)
        nvlink_bytes_per_s=25e9,  # [L40S] no NVLink: PCIe Gen4 x16 64 GB/s bidirectional peer-to-peer
        pcie_bytes_per_s=25e9,  # [L40S] PCIe Gen4 x16 64 GB/s bidirectional
        description="NVIDIA L40S 48GB (GDDR6 864 GB/s, 362 TFLOP/s bf16, PCIe Gen4, no NVLink)",
    ),
    # --- Blackwell [B200] ----------------------------------------------------------------------
    GPUSpec(
        name="b200", arch="blackwell", source="B200",
        memory_bytes=180 * 10**9,  # [B200] HGX B200 1,440 GB total / 8 GPUs
        hbm_bytes_per_s=7.7e12,  # [B200] HGX B200 62 TB/s total / 8 = 7.7 TB/s
        bf16_flops_per_s=2.25e15,  # [B200] HGX B200 FP16/BF16 36 PFLOPS sparse / 8 / 2 = 2.25 dense
        fp8_flops_per_s=4.5e15,  # [B200] HGX B200 FP8 72 PFLOPS sparse / 8 / 2 = 4.5 dense
        int8_ops_per_s=4.5e15,  # [B200] HGX B200 INT8 72 POPS sparse / 8 / 2 = 4.5 dense
        fp4_flops_per_s=9e15,  # [B200] HGX B200 FP4 144 PFLOPS sparse / 8 / 2 = 9 dense
        nvlink_bytes_per_s=900e9,  # [B200] NVLink 5: 1.8 TB/s bidirectional per GPU
        pcie_bytes_per_s=50e9,  # [B200] PCIe Gen5 128 GB/s bidirectional
        description="NVIDIA B200 180GB (HBM3e 7.7 TB/s, 2.25 PFLOP/s bf16, NVLink5 1.8 TB/s bidir.)",
    ),
    # --- CDNA3 [MI300X] ------------------------------------------------------------------------
    GPUSpec(
        name="mi300x", arch="cdna3", source="MI300X",
        memory_bytes=192 * 10**9,  # [MI300X] 192 GB HBM3
        hbm_bytes_per_s=5.3e12,  # [MI300X] 5.3 TB/s peak memory bandwidth
        bf16_flops_per_s=1307.4e12,  # [MI300X] BF16 1,307.4 TFLOPS (2,614.9 with sparsity)
        fp8_flops_per_s=2614.9e12,  # [MI300X] FP8 2,614.9 TFLOPS (5,229.8 with sparsity)
        int8_ops_per_s=2614.9e12,  # [MI300X] INT8 2,614.9 TOPS (5,229.8 with sparsity)
        nvlink_bytes_per_s=448e9,  # [MI300X] Infinity Fabric: 7 links x 128 GB/s bidirectional -> 448 one way
        pcie_bytes_per_s=50e9,  # [MI300X] PCIe Gen5 x16 128 GB/s bidirectional
        description="AMD Instinct MI300X 192GB (HBM3 5.3 TB/s, 1.3 PFLOP/s bf16, Infinity Fabric 896 GB/s)",
    ),
)


def gpu_names() -> list[str]:
    return sorted(GPUS)
