"""Fleet-scale benchmark (issue 30): simulated requests per second and peak RSS against fleet size.

Each measurement runs in a process of its own (``--one``), so its peak RSS
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``) is that measurement's alone; the parent only
starts them and prints the table. Workload per replica, as in the issue: A100-80G, Llama-3-8B,
vllm, compiled engine, calibration pack, lognormal lengths (prompt mean 800, output mean 200),
Poisson at ``--rate`` req/s per replica (the fleet at N x that), ``--requests`` in all. Rows:

  lone           one replica, the lone-replica path (no router): the baseline, measured in the
                 same invocation as the fleet rows (the box is shared: compare ratios in one run)
  N x <router>   N replicas behind the router

``run s`` is the simulation itself (``env.run()``), ``CPU s`` its process CPU time (on a box shared
with other work, wall time counts their share of the cores too); build time (workload, tables, N
engines) is reported apart (``build s``). A measurement that runs past ``--timeout`` is reported as such.

Usage:  python benchmarks/fleet.py [--sizes 1,24,256,1024] [--routers round-robin,least-tokens]
                                   [--requests 20000] [--rate 8] [--timeout 300]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIZES = (1, 24, 256, 1024, 4096, 16384)
LOAD_READING = ("least-requests", "least-tokens", "priority", "affinity")
SAMPLED = ("least-requests", "least-tokens", "priority")  # routers that take cluster.router_sample
ROUTERS = ("round-robin", "random", "least-requests", "least-tokens", "affinity", "priority")


def scenario(replicas: int, requests: int, router: str | None, rate: float, sample: int = 0) -> dict:
    raw = {
        "name": "bench-fleet", "seed": 1, "stop": {"requests": requests},
        "hardware": {"gpu": "a100-80g"}, "model": "llama-3-8b",
        "engine": {"scheduler": "vllm"}, "sim": {"engine": "compiled"},
        "workload": {"arrival": {"process": "poisson", "rate": rate * replicas},
                     "prompt": {"dist": "lognormal", "mean": 800, "sigma": 0.8, "min": 1, "max": 6000},
                     "output": {"dist": "lognormal", "mean": 200, "sigma": 0.8, "min": 1, "max": 2000}},
    }
    if router is not None:
        raw["hardware"]["replicas"] = replicas
        raw["cluster"] = {"router": router}
        if replicas == 1:
            raw["cluster"]["groups"] = [{"replicas": 1}]
        if router == "affinity":  # keys: chat sessions of 4 turns (new input 300, output 200 per turn)
            w = raw["workload"]
            w["arrival"]["rate"] = rate * replicas / 4
            w["sessions"] = {"turns": {"dist": "fixed", "value": 4}, "think_s": 5.0,
                             "new_input": {"dist": "lognormal", "mean": 300, "sigma": 0.8, "min": 1, "max": 2000},
                             "output": w.pop("output")}
            del w["prompt"]
        if sample:
            raw["cluster"]["router_sample"] = sample
    return raw


def one(replicas: int, router: str | None, requests: int, rate: float, sample: int, scan: bool = False) -> dict:
    """One measurement, in this process: build, run, peak RSS."""
    sys.path.insert(0, str(REPO))
    from servesim import scenario_from_dict
    from servesim.simulate import build

    t0 = time.perf_counter()
    b = build(scenario_from_dict(scenario(replicas, requests, router, rate, sample)))
    if scan:
        b.replica.scan = True  # the routers read every replica's load on each arrival (before issue 30)
    t1, c1 = time.perf_counter(), time.process_time()
    b.env.run()
    t2, c2 = time.perf_counter(), time.process_time()
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # (Linux: KiB)
    return {"replicas": replicas, "router": router or "lone", "requests": requests, "build_s": t1 - t0,
            "run_s": t2 - t1, "cpu_s": c2 - c1, "req_per_s": requests / (t2 - t1), "rss_mb": rss_kb / 1024}


def measure(replicas: int, router: str | None, requests: int, rate: float, sample: int, timeout: float,
            scan: bool = False) -> dict:
    cmd = [sys.executable, __file__, "--one", str(replicas), router or "lone", str(requests), str(rate), str(sample),
           str(int(scan))]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"replicas": replicas, "router": router or "lone", "requests": requests, "error": f"> {timeout:.0f} s"}
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["?"])[-1]
        return {"replicas": replicas, "router": router or "lone", "requests": requests, "error": tail[:120]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        n, router, requests, rate, sample = sys.argv[2:7]
        scan = len(sys.argv) > 7 and sys.argv[7] == "1"
        r = one(int(n), None if router == "lone" else router, int(requests), float(rate), int(sample), scan)
        print(json.dumps(r))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--routers", default=",".join(ROUTERS))
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--rate", type=float, default=8.5, help="req/s per replica (capacity ~10.3: 85 %% load)")
    ap.add_argument("--sample", default="0", help="cluster.router_sample, or several comma-separated: a row for "
                    "each (0: exact routers), side by side in one run")
    ap.add_argument("--scan", action="store_true", help="also each load-reading row with the old scan of every replica")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per measurement")
    a = ap.parse_args()
    # warm-up, untimed: a fresh checkout compiles the kernels first (minutes on a loaded box)
    measure(1, None, 500, a.rate, 0, 3600)
    measure(2, "least-tokens", 500, a.rate, 0, 3600)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, python {platform.python_version()}; "
          f"{a.requests:,} requests per row, {a.rate} req/s per replica"
          + (f", router_sample {a.sample}" if a.sample != "0" else ""))
    print("| fleet | router | requests | build s | run s | CPU s | sim req/s | x lone | peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    base = None
    samples = [int(d) for d in a.sample.split(",")]
    rows = [(1, None, False, 0)] + [(int(n), r, s, d) for r in a.routers.split(",") for n in a.sizes.split(",")
                                    for s in ((False, True) if a.scan and r in LOAD_READING else (False,))
                                    for d in (samples if r in SAMPLED else (0,))]
    for n, router, scan, d in rows:
        r = measure(n, router, a.requests, a.rate, d, a.timeout, scan)
        name = r["router"] + (" (scan)" if scan else "") + (f" d={d}" if d else "")
        if "error" in r:
            print(f"| {n:,} | {name} | {a.requests:,} | - | - | - | {r['error']} | - | - |", flush=True)
            continue
        base = base or r["req_per_s"]
        print(f"| {n:,} | {name} | {a.requests:,} | {r['build_s']:.1f} | {r['run_s']:.2f} | {r['cpu_s']:.2f} | "
              f"{r['req_per_s']:,.0f} | {r['req_per_s'] / base:.2f} | {r['rss_mb']:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
