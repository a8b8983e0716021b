"""Sharded fleet benchmark (issue 30, "one fleet across machines"): one process against the same
fleet sharded over Dask worker processes (``sim.workers``; servesim/engine/shard.py).

The fleet is benchmarks/fleet.py's (A100-80G, Llama-3-8B, vllm, compiled engine, lognormal
800/200 lengths, Poisson at ``--rate`` req/s per replica) behind ``--router`` with
``cluster.router_refresh_s`` = ``--refresh``: the router decides on load snapshots of that age
in every row, so every row gives the same requests.parquet (checked: the rows' digests).

Rows: ``one process`` (build + run, ``sim.workers: 1``), then ``k workers`` for each ``--workers``
(``simulate.build_sharded``: a LocalCluster of k single-threaded processes, started inside the
timed run: its start, the workers' builds of their replicas and the gathering of the rows all
count; the phases are printed: cluster start, workers' builds, the windows, the gathering, and
the workers' CPU seconds in builds and windows, the slowest one's and the sum: on a shared box
the wall time depends on what else runs, the slowest worker's CPU time is its wall on a core of
its own), the load average just after the row (its own processes included) and how the workers
started (``started``: forked from the preloaded fork server, servesim/shard_preload.py). Each row
runs in a process of its own, so its peak RSS is its own (the coordinator's; the workers' are not
counted).

Usage:  python benchmarks/shard.py [--replicas 16384] [--requests 100000] [--rate 1]
                                   [--refresh 0.1] [--router least-tokens] [--workers 1,4] [--no-one]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))


def scenario(replicas: int, requests: int, router: str, rate: float, refresh: float) -> dict:
    from fleet import scenario as fleet_scenario

    raw = fleet_scenario(replicas, requests, router, rate)
    raw["cluster"]["router_refresh_s"] = refresh
    return raw


def one(replicas: int, requests: int, router: str, rate: float, refresh: float, workers: int) -> dict:
    """One row, in this process: build, run, requests.parquet's digest, peak RSS."""
    sys.path.insert(0, str(REPO))
    from servesim import scenario_from_dict
    from servesim.simulate import build, build_sharded, run_built

    sc = scenario_from_dict(scenario(replicas, requests, router, rate, refresh))
    t0 = time.perf_counter()
    b = build_sharded(sc, sc.seed, workers=workers) if workers else build(sc)
    t1 = time.perf_counter()
    res = run_built(b)
    t2 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        digest = hashlib.sha256((res.write(d) / "requests.parquet").read_bytes()).hexdigest()[:16]
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    windows = getattr(b.replica, "windows", None)
    phases = dict(getattr(b.replica, "seconds", {}))
    cpu = getattr(b.replica, "worker_cpu", [])
    if cpu:  # the slowest worker's CPU seconds: its wall on a core of its own
        phases["cpu_max"] = max(c["build"] + c["windows"] for c in cpu)
        phases["cpu_sum"] = sum(c["build"] + c["windows"] for c in cpu)
        phases["cpu_build_max"] = max(c["build"] for c in cpu)
    starts = sorted({str(s) for s in getattr(b.replica, "worker_start", [])})
    return {"row": f"{workers} workers" if workers else "one process", "build_s": t1 - t0, "run_s": t2 - t1,
            "total_s": t2 - t0, "req_per_s": requests / (t2 - t0), "digest": digest, "windows": windows,
            "sim_s": res.summary.get("sim_time_s"),
            "rss_mb": rss_kb / 1024, "phases": {k: round(v, 1) for k, v in phases.items()},
            "load": round(os.getloadavg()[0], 2), "started": starts}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", type=int, default=16384)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=1.0, help="req/s per replica")
    ap.add_argument("--refresh", type=float, default=0.1, help="cluster.router_refresh_s")
    ap.add_argument("--router", default="least-tokens")
    ap.add_argument("--workers", default="1,4")
    ap.add_argument("--no-one", action="store_true", help="skip the one-process row")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # (a child: 0 = one process)
    a = ap.parse_args()
    if a.one is not None:
        print(json.dumps(one(a.replicas, a.requests, a.router, a.rate, a.refresh, a.one)))
        return
    rows = ([] if a.no_one else [0]) + [int(w) for w in a.workers.split(",")]
    print(f"# {a.replicas} replicas, {a.router}, refresh {a.refresh} s, {a.requests} requests at {a.rate} req/s "
          f"per replica; cpus {os.cpu_count()}, load average {os.getloadavg()[0]:.2f}")
    print(f"{'row':<12} {'build s':>8} {'run s':>8} {'total s':>8} {'req/s':>8} {'windows':>8} {'RSS MB':>8}  digest")
    for w in rows:
        cmd = [sys.executable, __file__, "--one", str(w)] + [f"--{k}={v}" for k, v in
                                                             (("replicas", a.replicas), ("requests", a.requests),
                                                              ("rate", a.rate), ("refresh", a.refresh),
                                                              ("router", a.router))]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, check=False)
        except subprocess.TimeoutExpired:
            print(f"{w or 'one':<12} timed out after {a.timeout:.0f} s")
            continue
        if out.returncode:
            last = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode
            print(f"{w or 'one':<12} failed: {last}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{r['row']:<12} {r['build_s']:8.1f} {r['run_s']:8.1f} {r['total_s']:8.1f} {r['req_per_s']:8.0f} "
              f"{r['windows'] if r['windows'] is not None else '-':>8} {r['rss_mb']:8.0f}  {r['digest']}  "
              f"{r['phases'] or ''}  load {r['load']}{'  started: ' + '; '.join(r['started']) if r['started'] else ''}",
              flush=True)
    print(f"# load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
