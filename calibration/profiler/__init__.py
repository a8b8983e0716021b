"""Measure op timings on a GPU and write servesim calibration packs and validation data.

Why this exists: servesim predicts an iteration's time by summing per-op timings from a
calibration pack (format: calibration/PACK_FORMAT.md). Those timings must come from a real GPU,
and the prediction must be checked against whole iterations measured on the same GPU. This
package does both, on any CUDA GPU, with nothing but PyTorch and NumPy installed (PyYAML
optional). The GPU machines have no servesim dependencies, so nothing here imports servesim: the
model shapes are read from servesim's model library files (``shapes.py``), and the main test suite
checks them, the pack columns and the stems against servesim's own readers
(tests/test_calibration_profiler.py).

Run it as ``python calibration/profile_gpu.py MODE ...`` (a thin script calling :func:`cli.main`).
Modules, bottom to top (the torch-free ones are tested without torch in the main suite):

* torch-free: ``shapes`` (model and per-rank shapes, pack stems), ``grids`` (op grids, overhead
  batches, validation compositions), ``common`` (log, time budget, measurement record),
  ``writers`` (pack / validation CSV and YAML), ``combine`` (``merge`` and ``combine``: finishing
  packs on a machine without a GPU), ``cli`` (the argument parser, modes loaded when named);
* torch: ``attn_backends`` (SDPA backend check, survey, choice), ``variants`` (quantized linears,
  MoE with its backends), ``triton_moe`` (our fused MoE Triton kernel, the default experts backend
  on a GPU), ``triton_decode``, ``surveys``, ``timing`` (graph-replay timer), ``ops`` (the op
  functions), ``forward`` (the random-weight model and its forward), ``opbench`` (op tables),
  ``environment`` (device facts, pack metadata, device peaks), and one module per mode:
  ``mode_ops``, ``mode_iterations``, ``mode_collectives``, ``mode_misc`` (survey, backends),
  ``mode_all``.

Modes (``python calibration/profile_gpu.py --help``):

* ``ops``         every op of PACK_FORMAT.md for one model shape and TP degree (per-rank slices),
                  plus ``overhead_eager`` / ``overhead_cuda_graph`` from a few calibration forwards.
* ``iterations``  whole random-weight forwards of mixed prefill/decode batches, eager and as a CUDA
                  graph: validation data, never read by the fit.
* ``allreduce``   NCCL ``all_reduce`` over N GPUs and ``send_recv`` between two (one process a GPU).
* ``all``         the above for several models, spread over the visible GPUs, then packs merged.
* ``merge``       add measured collectives to the packs (used by ``all``; also runnable by hand).
* ``combine``     finish packs measured in pieces: keep, replace or add rows; median overheads.
* ``survey``      op surveys beyond the packs (GEMM formats, MoE, fp8-KV and MLA decode attention).
* ``backends``    time a few attention shapes on every SDPA backend (evidence for the choice).

How op times are taken: random bf16 tensors (never zeros), warm-up, then the op is captured
``R`` times back to back in a CUDA graph and the graph is replayed; the op time is replay time / R,
median over repeats, with the standard deviation recorded. Graph replay removes the CPU launch cost
from op times on purpose: that cost is measured separately as ``overhead_eager`` /
``overhead_cuda_graph`` (the wall time of a real forward minus the sum of its ops as the tables
predict). Weights and KV caches are rotated among several copies so that a small op does not run
out of the L2 cache, which it never does in a real forward where every layer has its own weights.
On CPU (``--device cpu``, for logic tests only) times are wall-clock.

NVLink multicast (NVLS) is forced off for NCCL, PyTorch and NVSHMEM before torch is imported:
on shared multi-GPU hosts a program that uses it can take the GPUs out of service.
"""

from __future__ import annotations

import os

# Multicast off, before torch or NCCL is loaded, and inherited by every child process we start.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"
