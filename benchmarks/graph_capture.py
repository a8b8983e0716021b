"""``PYTHONPATH=. python benchmarks/graph_capture.py``: what the engine versions' CUDA-graph
capture rules (docs/calibration.md, "Which iterations replay") change. Each case runs its preset
twice: with the preset's rule, and with the rule before presets given explicitly (every decode
batch replays, no prefill: cuda_graph_max_batch 2^20, no token cap). 1,000 requests, 100 warm-up,
prefix caching off (no prompts are shared)."""

from __future__ import annotations

from servesim import load_scenario, simulate

FIXED = ["workload.prompt={dist: fixed, value: 200}", "workload.output={dist: fixed, value: 500}"]
CASES = [
    ("vllm-v1, A100, 4 req/s (the preset file)", "vllm-v1", []),
    ("vllm-v1, H200, 8 req/s", "vllm-v1", ["hardware.gpu=h200", "workload.arrival.rate=8"]),
    ("vllm-v1, H200, 30 req/s", "vllm-v1", ["hardware.gpu=h200", "workload.arrival.rate=30"]),
    ("vllm-v1, H200, 20 req/s of 100 in / 250 out", "vllm-v1",
     ["hardware.gpu=h200", "workload.arrival.rate=20", "workload.prompt={dist: fixed, value: 100}",
      "workload.output={dist: fixed, value: 250}"]),
    ("vllm-v1, H200, 800 closed clients, 200 in / 500 out", "vllm-v1",
     ["hardware.gpu=h200", "workload.arrival={process: closed, clients: 800, think_s: 0}"] + FIXED),
    ("sglang, H200, 30 req/s", "sglang", ["hardware.gpu=h200", "workload.arrival.rate=30"]),
    ("sglang, H200, 400 closed clients, 200 in / 500 out", "sglang",
     ["hardware.gpu=h200", "workload.arrival={process: closed, clients: 400, think_s: 0}"] + FIXED),
    ("vllm-v0, A100, 4 req/s (the preset file)", "vllm-v0", []),
]
BEFORE = "step_time={model: pack, cuda_graph: true, cuda_graph_max_batch: 1048576, cuda_graph_max_tokens: null}"


def main() -> None:
    print("| case | rule | output tok/s | TTFT mean (ms) | TPOT mean (ms) | TPOT P99 (ms) |")
    print("|---|---|---:|---:|---:|---:|")
    for name, preset, over in CASES:
        base = over + ["stop.requests=1000", "stop.warmup_requests=100", "engine.enable_prefix_caching=false"]
        for tag, extra in (("before", [BEFORE]), ("preset", [])):
            sc = load_scenario(f"scenarios/engines/{preset}.yaml", base + extra)
            s = simulate(sc).summary
            lat = s["latency_s"]
            st = sc.step_time
            rule = ("decode, any batch" if tag == "before" else
                    f"decode <= {st.cuda_graph_max_batch}" + (f", any step <= {st.cuda_graph_max_tokens} tok"
                                                            if st.cuda_graph_max_tokens else ""))
            print(f"| {name if tag == 'before' else ''} | {rule} | {s['throughput']['output_tok_per_s']:,.0f} | "
                  f"{1e3 * lat['ttft']['mean']:.1f} | {1e3 * lat['tpot']['mean']:.2f} | {1e3 * lat['tpot']['p99']:.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
