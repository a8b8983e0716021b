"""Speed benchmark: simulated requests per wall second (one core) and peak RSS.

Workloads (the [speed] issue's list; each runs in its own subprocess so peak RSS is its own):

  core  ShareGPT lengths (Sarathi-Serve's file), Llama-3-8B on one A100-80G, vllm scheduler,
        Poisson at ~80 % of capacity (CORE_RATE, measured with --find-capacity), 100k requests
  a     Azure 2023 conversation lengths, each clipped to 4,096 total tokens, Poisson 6.45 req/s,
        A100-80G, llama-3-8b, vllm, block 16, max_num_seqs 128, max_num_batched_tokens 4096
  b     (a) with the chunked scheduler, chunk 512 (runs on the Python engine)
  b_vllm (a) with vLLM's chunked prefill, budget 512 (runs on the compiled core)
  c     (a) overloaded at 10 req/s (preemptions)

Usage:  python benchmarks/speed.py [--requests 100000] [--only a,b] [--step-model roofline|pack]
        python benchmarks/speed.py --find-capacity
Append the printed table to benchmarks/RESULTS.md with the date and machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
CORE_RATE = 2.2  # req/s: 80 % of the 2.76 req/s the core setup sustains, roofline (see --find-capacity)

AZURE_CONV = str(SHARED / "traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv")
SHAREGPT = str(SHARED / "traces/sarathi_vidur_length_dists/sharegpt_8k_filtered_stats_llama2_tokenizer.csv")


def scenario_dict(name: str, n: int, step_model: str) -> dict:
    step = {"model": step_model}
    if name == "core":
        return {
            "name": "speed-core", "seed": 1, "stop": {"requests": n},
            "hardware": {"gpu": "a100-80g"}, "model": "llama-3-8b",
            "engine": {"scheduler": "vllm", "block_size": 16, "max_num_seqs": 256,
                       "max_num_batched_tokens": 8192, "max_model_len": 8192},
            "step_time": step,
            "workload": {"arrival": {"process": "poisson", "rate": CORE_RATE},
                         "lengths": {"file": SHAREGPT, "max_total": 8192}},
        }
    base = {
        "name": f"speed-{name}", "seed": 1, "stop": {"requests": n},
        "hardware": {"gpu": "a100-80g"}, "model": "llama-3-8b",
        "engine": {"scheduler": "vllm", "block_size": 16, "max_num_seqs": 128,
                   "max_num_batched_tokens": 4096, "max_model_len": 4096},
        "step_time": step,
        "workload": {"arrival": {"process": "poisson", "rate": 6.45},
                     "lengths": {"file": AZURE_CONV, "prompt_column": "ContextTokens",
                                 "output_column": "GeneratedTokens", "clip_total": 4096}},
    }
    if name == "b":  # the chunked policy (Sarathi/SGLang stall-free), chunk 512: Python engine
        base["engine"].update({"scheduler": "chunked", "chunked_prefill_size": 512})
    if name == "b_vllm":  # vLLM's chunked-prefill mode with a 512-token budget: compiled core
        base["engine"].update({"enable_chunked_prefill": True, "max_num_batched_tokens": 512})
    if name == "c":
        base["workload"]["arrival"]["rate"] = 10.0
    return base


def run_one(name: str, n: int, step_model: str) -> dict:
    """Run in this process; print one JSON line."""
    t0 = time.perf_counter()
    from servesim import scenario_from_dict
    from servesim.simulate import build, run_built

    sc = scenario_from_dict(scenario_dict(name, n, step_model), name)
    t_load = time.perf_counter() - t0
    b = build(sc)
    t_build = time.perf_counter() - t0 - t_load
    res = run_built(b)
    s = res.summary
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {
        "workload": name, "requests": n, "step_model": step_model,
        "load_s": round(t_load, 3), "build_s": round(t_build, 3), "run_s": round(s["wall_s"], 3),
        "req_per_wall_s": round(n / s["wall_s"]), "req_per_wall_s_total": round(n / (time.perf_counter() - t0)),
        "engine": b.replica.path,
        "iterations": s["engine"]["iterations"], "preemptions": s["requests"]["preemptions"],
        "sim_time_s": round(s["sim_time_s"], 1), "peak_rss_mb": round(rss_mb),
        "ttft_p99_s": s["latency_s"]["ttft"]["p99"],
    }
    print(json.dumps(out))
    return out


def find_capacity(step_model: str) -> None:
    """Saturate the core setup with a closed loop of many clients: its throughput is capacity."""
    from servesim import scenario_from_dict, simulate

    d = scenario_dict("core", 20000, step_model)
    d["workload"]["arrival"] = {"process": "closed", "clients": 512, "think_s": 0.0}
    d["stop"]["warmup_requests"] = 2000
    s = simulate(scenario_from_dict(d)).summary
    print(f"capacity {s['throughput']['req_per_s']:.3f} req/s; 80% = {0.8 * s['throughput']['req_per_s']:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--only", default="core,a,b,b_vllm,c")
    ap.add_argument("--step-model", default="roofline", choices=["roofline", "pack"])
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--find-capacity", action="store_true")
    args = ap.parse_args()
    if args.find_capacity:
        return find_capacity(args.step_model)
    if args.one:
        run_one(args.one, args.requests, args.step_model)
        return
    rows = []
    for name in args.only.split(","):
        proc = subprocess.run([sys.executable, __file__, "--one", name, "--requests", str(args.requests),
                               "--step-model", args.step_model], capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            raise SystemExit(f"workload {name} failed")
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    print(f"\n{time.strftime('%Y-%m-%d')} · {platform.processor() or platform.machine()} · "
          f"python {platform.python_version()} · step model {args.step_model}")
    print("| workload | engine | requests | run s | req/wall s | req/wall s incl. load | iterations | preemptions | peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['workload']} | {r['engine']} | {r['requests']:,} | {r['run_s']} | {r['req_per_wall_s']:,} | "
              f"{r['req_per_wall_s_total']:,} | {r['iterations']:,} | {r['preemptions']:,} | {r['peak_rss_mb']} |")


if __name__ == "__main__":
    main()
