"""Sweep benchmark: many configurations x 10,000 requests on a local Dask cluster; points per
minute against the number of worker processes.

The design is a Latin hypercube over the quickstart scenario (one A100-80G, Llama-3-8B, vllm,
roofline step times; lognormal prompts of mean 1,000 tokens, 256 output tokens):

    workload.arrival.rate        0.5 .. 3.5 req/s (the setup saturates near 4)
    engine.max_num_seqs          16 .. 512, log scale, integers
    engine.block_size            8, 16, 32
    chunked prefill / budget     off + 8192, on + 2048, on + 512 (one zipped dimension)

one seed per point, ``--requests`` requests per run (10 % warm-up). ``sim.engine`` is main's
``auto`` unless ``--engine`` says otherwise (auto picks the compiled core from 50,000 requests on,
so 10,000-request runs use the Python engine).

Usage:  python benchmarks/sweep.py [--points 1000] [--requests 10000] [--workers 2] [--engine auto]
        python benchmarks/sweep.py --points 40 --workers 1,2          (scaling)
        python benchmarks/sweep.py --cpu-sample 50                     (CPU s per point, load-free)
Prints one markdown row per worker count; append them to benchmarks/RESULTS.md with the date,
the machine and the ``python -m timeit "sum(range(100000))"`` figure printed first.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def spec_dict(points: int, requests: int, engine: str) -> dict:
    return {
        "name": "bench-sweep",
        "base": str(REPO / "scenarios/quickstart.yaml"),
        "set": {"stop.requests": requests, "stop.warmup_requests": requests // 10, "sim.engine": engine},
        "axes": {
            "workload.arrival.rate": {"low": 0.5, "high": 3.5},
            "engine.max_num_seqs": {"low": 16, "high": 512, "scale": "log", "type": "int"},
            "engine.block_size": [8, 16, 32],
        },
        "zip": [{"engine.enable_chunked_prefill": [False, True, True],
                 "engine.max_num_batched_tokens": [8192, 2048, 512]}],
        "design": {"kind": "lhs", "samples": points, "seed": 1},
        "seeds": 1,
        "metrics": ["ttft_p99", "tpot_p99", "e2e_p99", "req_per_s", "goodput_req_per_s", "preemptions",
                    "iterations"],
    }


def timeit_figure() -> str:
    out = subprocess.run([sys.executable, "-m", "timeit", "sum(range(100000))"], capture_output=True, text=True)
    return out.stdout.strip()


def run(points: int, requests: int, workers: int, engine: str) -> dict:
    from servesim.sweep.executor import DaskExecutor
    from servesim.sweep.runner import run_sweep
    from servesim.sweep.spec import spec_from_dict

    t0 = time.perf_counter()
    sp = spec_from_dict(spec_dict(points, requests, engine), "bench-sweep", REPO)
    t_spec = time.perf_counter() - t0
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as out:
        t1 = time.perf_counter()
        with DaskExecutor(workers=workers) as ex:
            t_start = time.perf_counter() - t1
            t2 = time.perf_counter()
            res = run_sweep(sp, out, ex)
            t_sweep = time.perf_counter() - t2
        t_total = time.perf_counter() - t1
    rows = res.frame
    return {
        "points": len(sp.points), "runs": res.report.ran, "requests": requests, "workers": workers, "engine": engine,
        "spec_s": t_spec, "cluster_start_s": t_start, "sweep_s": t_sweep, "total_s": t_total,
        "points_per_min": 60 * res.report.ran / t_sweep, "cpu_s_per_run": float(rows["wall_s"].mean()),
        "load_before": load0, "load_after": os.getloadavg()[0],
        "errors": len(res.report.errors),
    }


def cpu_sample(points: int, requests: int, engine: str, n: int) -> dict:
    """CPU seconds per point of the design (``time.process_time`` around each task, in this
    process): a figure that other processes on the machine do not inflate, unlike wall time."""
    from servesim.sweep.runner import tasks_for
    from servesim.sweep.spec import spec_from_dict
    from servesim.sweep.task import run_task

    sp = spec_from_dict(spec_dict(points, requests, engine), "bench-sweep", REPO)
    tasks = tasks_for(sp.points, sp.seeds_of)
    step = max(1, len(tasks) // n)
    sample = tasks[::step][:n]
    run_task(sample[0])  # engine loaded and warm before timing
    cpu = []
    for t in sample:
        c0 = time.process_time()
        run_task(t)
        cpu.append(time.process_time() - c0)
    return {"n": len(sample), "cpu_s_per_point": sum(cpu) / len(cpu), "max_s": max(cpu)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--workers", default="2", help="worker counts, comma-separated (e.g. 1,2)")
    ap.add_argument("--engine", default="auto", choices=["auto", "python", "compiled"])
    ap.add_argument("--cpu-sample", type=int, default=0,
                    help="instead: CPU seconds per point over N points spread over the design, in this process")
    args = ap.parse_args()
    if args.cpu_sample:
        r = cpu_sample(args.points, args.requests, args.engine, args.cpu_sample)
        print(f"{time.strftime('%Y-%m-%d %H:%M')} · sim.engine {args.engine} · {r['n']} of {args.points} points x "
              f"{args.requests:,} requests: {r['cpu_s_per_point']:.3f} CPU s per point (max {r['max_s']:.2f}); "
              f"{args.points} points on 2 cores with nothing else running: "
              f">= {args.points * r['cpu_s_per_point'] / 2 / 60:.1f} min")
        return
    print(f"{time.strftime('%Y-%m-%d %H:%M')} · {platform.machine()} · {os.cpu_count()} cores · "
          f"python {platform.python_version()} · timeit sum(range(100000)): {timeit_figure()}", flush=True)
    print("| points x requests | sim.engine | workers | cluster start s | sweep s | points/min | "
          "mean run wall s | load avg before/after |")
    print("|---|---|---|---|---|---|---|---|")
    for w in [int(x) for x in args.workers.split(",")]:
        r = run(args.points, args.requests, w, args.engine)
        if r["errors"]:
            raise SystemExit(f"{r['errors']} runs failed")
        print(f"| {r['points']:,} x {r['requests']:,} | {r['engine']} | {w} | {r['cluster_start_s']:.1f} | "
              f"{r['sweep_s']:.0f} | {r['points_per_min']:.1f} | {r['cpu_s_per_run']:.2f} | "
              f"{r['load_before']:.1f} / {r['load_after']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
