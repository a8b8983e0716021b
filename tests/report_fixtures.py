"""Small runs and a small sweep folder for the report tests (written once per test session)."""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

import numpy as np

from tests.conftest import BASE, merge

# two classes, a pool small enough to queue, a warm-up: every run chart has something to draw
TWO_CLASSES = merge(BASE, {
    "name": "two-classes",
    "stop": {"requests": 240, "warmup_requests": 20},
    "engine": {"max_num_seqs": 6, "max_num_batched_tokens": 256, "enable_chunked_prefill": True},
    "step_time": {"model": "constant", "seconds": 0.01},
    "workload": {"arrival": {"process": "poisson", "rate": 40.0},
                 "prompt": {"dist": "uniform", "min": 16, "max": 400},
                 "output": {"dist": "uniform", "min": 2, "max": 40},
                 "classes": {"weights": [0.3, 0.7]}},
})

TIERS = merge({k: v for k, v in BASE.items() if k != "workload"}, {
    "name": "tiers",
    "stop": {"requests": 200},
    "engine": {"enable_prefix_caching": True, "num_gpu_blocks_override": 60, "max_num_seqs": 16},
    "kv_tiers": [{"kind": "cpu", "capacity_gib": 1}],
    "workload": {"arrival": {"process": "poisson", "rate": 2.0},
                 "sessions": {"turns": {"dist": "fixed", "value": 4}, "think_s": 0.5,
                              "new_input": {"dist": "fixed", "value": 64}, "output": {"dist": "fixed", "value": 8},
                              "system_prompt_tokens": 64, "max_context_tokens": 2048, "block_tokens": 16}},
})


def write_run(raw: dict, folder: Path, seed: int | None = None):
    """Simulate ``raw`` and write its run folder; returns the Result."""
    from servesim import scenario_from_dict, simulate

    res = simulate(scenario_from_dict(raw, "test"), seed=seed)
    res.write(folder)
    return res


def write_sweep(root: Path, seeds=(1, 2, 3)) -> dict:
    """A sweep folder in the documented format (docs/sweeps.md): a 4 x 3 x 2 grid, three seeds,
    rows split over two parts that overlap (a task stored twice: the reader keeps one), a failed
    row, a 25th design point equal to the first (same key: it shares the first's rows), an
    invalid.csv of one point.

    ``ttft_p99`` is a known function of the axes plus seed noise; returns the expected means."""
    import pandas as pd

    (root / "rows").mkdir(parents=True, exist_ok=True)
    rates, seqs, chunk = [1.0, 2.0, 4.0, 8.0], [32, 128, 256], [False, True]
    points = []
    for i, (r, s, c) in enumerate(itertools.product(rates, seqs, chunk)):
        key = hashlib.sha1(f"{r}-{s}-{c}".encode()).hexdigest()[:16]
        points.append({"point": i, "key": key, "workload.arrival.rate": r, "engine.max_num_seqs": s,
                       "engine.enable_chunked_prefill": c})
    # a design point drawn twice (as a random design may): same scenario, same key, run once
    pd.DataFrame(points + [{**points[0], "point": len(points)}]).to_parquet(root / "points.parquet", index=False)
    rng = np.random.default_rng(0)
    rows, expect = [], {}
    for p in points:
        r, s = p["workload.arrival.rate"], p["engine.max_num_seqs"]
        vals = []
        for rep, seed in enumerate(seeds):
            ttft = 0.1 * r * r / np.sqrt(s / 32) * (1 + 0.1 * rng.standard_normal())
            vals.append(ttft)
            rows.append({"point": p["point"], "key": p["key"], "seed": seed, "replication": rep,
                         "workload.arrival.rate": r, "engine.max_num_seqs": s,
                         "engine.enable_chunked_prefill": p["engine.enable_chunked_prefill"],
                         "ttft_p99": ttft, "req_per_s": r * (1 - 0.02 * rng.random()),
                         "goodput_req_per_s": r * float(np.exp(-ttft)), "wall_s": 0.1, "error": None})
        expect[p["point"]] = vals
    expect[len(points)] = expect[0]
    frame = pd.DataFrame(rows)
    failed = frame.iloc[[0]].assign(seed=99, error="trace file missing on a worker", ttft_p99=np.nan)
    frame.iloc[:50].to_parquet(root / "rows" / "part-1.parquet", index=False)
    pd.concat([frame.iloc[40:], failed]).to_parquet(root / "rows" / "part-2.parquet", index=False)
    (root / "spec.yaml").write_text("name: synthetic\nbase: ../quickstart.yaml\n")
    (root / "invalid.csv").write_text("point,reason\n99,engine.max_num_batched_tokens too small\n")
    return expect


def inject_cluster(folder: Path, replicas: list[dict], extra: dict | None = None) -> None:
    """Add a ``cluster`` block to a run's summary.json (as multi-replica runs will write it)."""
    p = folder / "summary.json"
    s = json.loads(p.read_text())
    s["cluster"] = {"replicas": replicas, **(extra or {})}
    p.write_text(json.dumps(s))
