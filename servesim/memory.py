"""How many KV-cache blocks fit on a GPU.

vLLM sizes its KV cache by profiling: the engine may use ``gpu_memory_utilization x total``
bytes; from that it subtracts the weights, the peak activation memory of a forward pass at
``max_num_batched_tokens`` and non-PyTorch memory (CUDA context, cuBLAS/NCCL workspaces); what is
left becomes KV blocks. We follow the same arithmetic with the activation peak estimated from the
model shape instead of profiled::

    budget      = gpu_memory_utilization * gpu memory
    activations = max_num_batched_tokens * activation_bytes_per_token   (one layer live)
                + max_num_seqs * vocab / tp * 4                          (fp32 logits)
    kv bytes    = budget - weights - activations - NON_TORCH_BYTES
    blocks      = kv bytes // (block_size * kv_bytes_per_token)

Each GPU of a TP/PP group holds its slice, so block counts are per GPU and equal on all of them.
The plan is printed in the run header so a user can check it against their engine's log line
("# GPU blocks: N").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from servesim.hardware import GIB, GPUS

if TYPE_CHECKING:
    from servesim.scenario import Scenario

NON_TORCH_BYTES = int(0.75 * GIB)  # CUDA context + library workspaces, a typical vLLM reading


@dataclass(frozen=True)
class MemoryPlan:
    gpu_bytes: int
    budget_bytes: int
    weight_bytes: int
    activation_bytes: int
    non_torch_bytes: int
    kv_bytes: int
    kv_bytes_per_token: int
    block_size: int
    num_blocks: int

    @property
    def kv_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def describe(self) -> str:
        g = GIB
        return (
            f"GPU {self.gpu_bytes / g:.1f} GiB x util = {self.budget_bytes / g:.1f} GiB: weights "
            f"{self.weight_bytes / g:.2f} GiB, activations {self.activation_bytes / g:.2f} GiB, "
            f"other {self.non_torch_bytes / g:.2f} GiB -> KV {self.kv_bytes / g:.2f} GiB = "
            f"{self.num_blocks:,} blocks x {self.block_size} tokens ({self.kv_tokens:,} tokens, "
            f"{self.kv_bytes_per_token / 1024:.0f} KiB/token)"
        )


def plan_memory(scenario: "Scenario") -> MemoryPlan:
    """Compute the KV block count for one GPU of a replica; ValueError if the model cannot run."""
    gpu = GPUS[scenario.hardware.gpu]
    shape = scenario.model_shape
    tp, pp = scenario.tp, scenario.pp
    e = scenario.engine
    budget = int(e.gpu_memory_utilization * gpu.memory_bytes)
    weights = shape.weight_bytes(tp, pp)
    acts = e.max_num_batched_tokens * shape.activation_bytes_per_token(tp)
    acts += e.max_num_seqs * (shape.vocab_size // tp) * 4
    kv_per_token = shape.kv_bytes_per_token(tp, pp)
    kv_bytes = budget - weights - acts - NON_TORCH_BYTES
    if e.num_gpu_blocks_override is not None:
        num_blocks = e.num_gpu_blocks_override
        kv_bytes = num_blocks * e.block_size * kv_per_token
    else:
        num_blocks = max(0, kv_bytes) // (e.block_size * kv_per_token)
        if num_blocks < 1:
            raise ValueError(
                f"model {shape.name} does not fit: {gpu.name} x gpu_memory_utilization "
                f"{e.gpu_memory_utilization} = {budget / GIB:.1f} GiB per GPU, but weights need "
                f"{weights / GIB:.1f} GiB and activations {acts / GIB:.1f} GiB at tp {tp}, pp {pp}; "
                f"use more GPUs per replica (engine.tensor_parallel_size / pipeline_parallel_size), a larger GPU, "
                f"or a higher utilization"
            )
    return MemoryPlan(
        gpu_bytes=gpu.memory_bytes,
        budget_bytes=budget,
        weight_bytes=weights,
        activation_bytes=acts,
        non_torch_bytes=NON_TORCH_BYTES,
        kv_bytes=int(kv_bytes),
        kv_bytes_per_token=kv_per_token,
        block_size=e.block_size,
        num_blocks=int(num_blocks),
    )
