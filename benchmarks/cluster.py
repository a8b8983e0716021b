"""Fleet benchmark: simulated requests per wall second, 24 replicas vs 1 at the same per-replica load.

Workload (a) of benchmarks/speed.py per replica: Azure 2023 conversation lengths clipped to 4,096
tokens, Poisson 6.45 req/s per replica, A100-80G, Llama-3-8B, vllm, block 16, max_num_seqs 128,
max_num_batched_tokens 4096, roofline step times, compiled engine. Rows:

  lone          one replica, the lone-replica path (no router)
  N x <router>  N replicas (1, 4, 24) at N x the rate, N x the requests, through the router
                (1 x: cluster.groups: [{replicas: 1}]); round robin and random route every
                request first and run each replica alone (engine/cluster.py), the load-reading
                routers run the event loop

The cost must grow no faster than the request count: ``us/req`` of the 24-replica rows against
the lone row (``x lone``). Build time (workload, KV, tables) is excluded; one warm-up run first.

Usage:  python benchmarks/cluster.py [--per-replica 10000] [--replicas 24] [--routers round-robin,least-tokens]
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = next((p / "shared" for p in REPO.parents if (p / "shared").is_dir()), REPO.parent / "shared")
AZURE_CONV = str(SHARED / "traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv")
RATE = 6.45


def scenario(replicas: int, per_replica: int, router: str | None, one_group: bool = False) -> dict:
    raw = {
        "name": "bench-cluster", "seed": 1, "stop": {"requests": per_replica * replicas},
        "hardware": {"gpu": "a100-80g"}, "model": "llama-3-8b",
        "engine": {"scheduler": "vllm", "block_size": 16, "max_num_seqs": 128, "max_num_batched_tokens": 4096,
                   "max_model_len": 4096},
        "step_time": {"model": "roofline"}, "sim": {"engine": "compiled"},
        "workload": {"arrival": {"process": "poisson", "rate": RATE * replicas},
                     "lengths": {"file": AZURE_CONV, "prompt_column": "ContextTokens",
                                 "output_column": "GeneratedTokens", "clip_total": 4096}},
    }
    if router is not None:
        raw["cluster"] = {"router": router}
        if one_group:
            raw["cluster"]["groups"] = [{"replicas": replicas}]
        else:
            raw["hardware"]["replicas"] = replicas
    return raw


def run(raw: dict) -> dict:
    from servesim import scenario_from_dict
    from servesim.simulate import build

    b = build(scenario_from_dict(raw))
    t0 = time.perf_counter()
    b.env.run()  # the simulation itself (the summary's post-processing is not timed)
    wall = time.perf_counter() - t0
    n = raw["stop"]["requests"]
    return {"requests": n, "wall": wall, "us_per_req": wall / n * 1e6, "req_per_s": n / wall}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-replica", type=int, default=10_000)
    ap.add_argument("--replicas", type=int, default=24)
    ap.add_argument("--routers", default="round-robin,least-tokens")
    a = ap.parse_args()
    run(scenario(1, 500, None))  # warm-up: compiled kernels loaded, entry points typed
    run(scenario(2, 500, "round-robin"))
    rows = [("lone", 1, run(scenario(1, a.per_replica, None)))]
    for router in a.routers.split(","):
        for n in sorted({1, 4, a.replicas}):
            raw = scenario(n, a.per_replica, router, one_group=n == 1)
            rows.append((f"{n} x {router}", n, run(raw)))
    base = rows[0][2]["us_per_req"]
    print(f"{time.strftime('%Y-%m-%d')} {platform.machine()} python {platform.python_version()}: "
          f"workload (a), {RATE} req/s per replica, {a.per_replica:,} requests per replica")
    print("| setup | replicas | requests | run s | req/wall s | us/request | x lone |")
    print("|---|---|---|---|---|---|---|")
    for name, n, r in rows:
        print(f"| {name} | {n} | {r['requests']:,} | {r['wall']:.2f} | {r['req_per_s']:,.0f} | "
              f"{r['us_per_req']:.1f} | {r['us_per_req'] / base:.2f} |")


if __name__ == "__main__":
    main()
