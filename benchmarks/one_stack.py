"""A lone replica vs the same scenario as a fleet of one, in one process (issue 35, "one stack").

Two workloads, compiled engine, ``simulate()`` wall seconds (build, run and summary: what a user
waits for), ``env.run()`` alone, and the CPU seconds of ``simulate()`` (less disturbed by other
processes on a shared machine):

  open    workload (a) of benchmarks/cluster.py: Azure 2023 conversation lengths clipped to
          4,096 tokens, Poisson 6.45 req/s, A100-80G, Llama-3-8B, vllm, roofline step times,
          20,000 requests
  closed  32 clients, think 0, uniform 16-256 prompt / 4-64 output tokens, constant 10 ms steps,
          5,000 requests (benchmarks/RESULTS.md, b0457fc)

Each as a lone replica (no ``cluster:``) and as a fleet of one (``cluster.groups: [{replicas:
1}]``), interleaved over ``--rounds`` after a warm-up of each; the minimum is the figure least
disturbed by a shared machine's other work. Run it on two checkouts
(``PYTHONPATH=<checkout> python benchmarks/one_stack.py``) to compare before and after.

Usage:  python benchmarks/one_stack.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

from cluster import scenario as open_scenario  # (benchmarks/cluster.py)


def closed_scenario(requests: int = 5000) -> dict:
    return {"name": "bench-closed", "seed": 1, "stop": {"requests": requests},
            "hardware": {"gpu": "a100-80g"}, "model": "llama-3-8b",
            "engine": {"scheduler": "vllm", "block_size": 16, "max_num_seqs": 64, "max_num_batched_tokens": 8192},
            "step_time": {"model": "constant", "seconds": 0.01}, "sim": {"engine": "compiled"},
            "workload": {"arrival": {"process": "closed", "clients": 32, "think_s": 0.0},
                         "prompt": {"dist": "uniform", "min": 16, "max": 256},
                         "output": {"dist": "uniform", "min": 4, "max": 64}}}


def fleet_of_one(raw: dict) -> dict:
    return {**raw, "cluster": {"groups": [{"replicas": 1}]}}


def once(raw: dict) -> tuple[float, float, float]:
    """(wall s of simulate(), wall s of env.run(), CPU s of simulate())."""
    from servesim import scenario_from_dict
    from servesim.simulate import build, run_built

    sc = scenario_from_dict(raw)
    c0 = time.process_time()
    t0 = time.perf_counter()
    b = build(sc)
    t1 = time.perf_counter()
    b.env.run()
    t2 = time.perf_counter()
    b.env = _Done()  # run_built's env.run(): already run
    run_built(b)
    t3 = time.perf_counter()
    return t3 - t0, t2 - t1, time.process_time() - c0


class _Done:
    def run(self, until=None):
        return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    cases = {"open lone": open_scenario(1, 20_000, None), "open fleet of one": fleet_of_one(open_scenario(1, 20_000, None)),
             "closed lone": closed_scenario(), "closed fleet of one": fleet_of_one(closed_scenario())}
    for raw in cases.values():
        once(raw)  # warm-up: kernels loaded, entry points typed
    times: dict[str, list] = {k: [] for k in cases}
    for _ in range(a.rounds):
        for name, raw in cases.items():
            times[name].append(once(raw))
    import servesim

    print(f"{time.strftime('%Y-%m-%d %H:%M')} {platform.machine()} python {platform.python_version()} "
          f"servesim from {os.path.dirname(servesim.__file__)}, load average {os.getloadavg()[0]:.1f}")
    print("| case | simulate() wall s: min, median | env.run() wall s: min, median | simulate() CPU s: min, median |")
    print("|---|---|---|---|")
    for name, ts in times.items():
        cols = [[x[i] for x in ts] for i in range(3)]
        print(f"| {name} | " + " | ".join(f"{min(c):.4f}, {statistics.median(c):.4f}" for c in cols) + " |")


if __name__ == "__main__":
    main()
