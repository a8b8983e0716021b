"""Simulated maximum throughput against published figures (docs/models.md, "Against published
throughput").

The published rows are TensorRT-LLM's performance overview (NVIDIA/TensorRT-LLM,
docs/source/performance/perf-overview.md at commit 00f37686aa85): "Total Output Throughput
(tokens/sec)" of ``trtllm-bench throughput`` with requests fed at an infinite rate, uniform
input/output lengths (ISL/OSL), FP8 (Hopper) or FP4 (Blackwell) ModelOpt checkpoints. Each row is
simulated as that offline run: all requests queued at once (a rate far above capacity), fixed
lengths, the roofline step model (its defaults: mfu 0.6, mbu 0.8, 2 ms per iteration), a large
batch (max_num_seqs 1024, chunked prefill, 16,384-token budget) and gpu_memory_utilization 0.95
as the overview's runs used. Run: ``python benchmarks/published_throughput.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servesim import scenario_from_dict, simulate  # noqa: E402

# requests per ISL/OSL as the overview ran them ($num_requests of its "Preparing a Dataset" table)
REQUESTS = {(128, 128): 30000, (128, 2048): 3000, (1000, 1000): 3000, (1000, 2000): 1500, (2048, 128): 3000,
            (2048, 2048): 1500, (5000, 500): 1500}
# (label, model, quantization, gpu, tp, isl, osl, published output tok/s of the whole replica)
ROWS = [
    ("Llama-3.1-8B FP8, H100 TP1", "llama-3.1-8b", "fp8", "h100-80g", 1, 128, 2048, 22714),
    ("Llama-3.1-8B FP8, H100 TP1", "llama-3.1-8b", "fp8", "h100-80g", 1, 1000, 1000, 15220),
    ("Llama-3.1-8B FP8, H200 TP1", "llama-3.1-8b", "fp8", "h200", 1, 128, 2048, 26221),
    ("Llama-3.1-8B FP8, H200 TP1", "llama-3.1-8b", "fp8", "h200", 1, 1000, 1000, 17744),
    ("Qwen3-30B-A3B FP4, B200 TP1 (MoE)", "qwen3-30b-a3b", "nvfp4", "b200", 1, 128, 2048, 37844),
    ("Qwen3-30B-A3B FP4, B200 TP1 (MoE)", "qwen3-30b-a3b", "nvfp4", "b200", 1, 1000, 1000, 25828),
    ("Qwen3-30B-A3B FP4, B200 TP1 (MoE)", "qwen3-30b-a3b", "nvfp4", "b200", 1, 1000, 2000, 22051),
    ("Qwen3-30B-A3B FP4, B200 TP1 (MoE)", "qwen3-30b-a3b", "nvfp4", "b200", 1, 2048, 2048, 17554),
    ("Qwen3-30B-A3B FP4, B200 TP1 (MoE)", "qwen3-30b-a3b", "nvfp4", "b200", 1, 5000, 500, 6142),
    ("Qwen3-30B-A3B FP4, B200 TP1 (MoE)", "qwen3-30b-a3b", "nvfp4", "b200", 1, 2048, 128, 6251),
    ("Qwen3-30B-A3B FP4, B200 TP1 (MoE)", "qwen3-30b-a3b", "nvfp4", "b200", 1, 128, 128, 39827),
]


def simulated(model: str, q: str, gpu: str, tp: int, isl: int, osl: int, requests: int | None = None) -> float:
    requests = requests or REQUESTS[(isl, osl)]
    sc = scenario_from_dict({
        "model": {"name": model, "quantization": q}, "hardware": {"gpu": gpu},
        "engine": {"tensor_parallel_size": tp, "max_num_seqs": 1024, "max_num_batched_tokens": 16384,
                   "enable_chunked_prefill": True, "gpu_memory_utilization": 0.95, "max_model_len": 8192},
        "step_time": {"model": "roofline"},
        "workload": {"arrival": {"process": "poisson", "rate": 1e5},
                     "prompt": {"dist": "fixed", "value": isl},
                     "output": {"dist": "fixed", "value": osl}},
        "stop": {"requests": requests}}, "published_throughput")
    return simulate(sc).summary["throughput"]["output_tok_per_s"]


def main() -> None:
    print("| row | ISL/OSL | published tok/s | simulated tok/s | error |")
    print("|---|---|---:|---:|---:|")
    for label, model, q, gpu, tp, isl, osl, pub in ROWS:
        sim = simulated(model, q, gpu, tp, isl, osl)
        print(f"| {label} | {isl}/{osl} | {pub:,} | {sim:,.0f} | {100 * (sim / pub - 1):+.0f} % |", flush=True)


if __name__ == "__main__":
    main()
