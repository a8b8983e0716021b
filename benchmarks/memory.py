"""Memory benchmark: a 10-million-request run (workload (a) of speed.py) end to end -- workload
generation, simulation, summary, and writing requests.parquet / sketches / timeseries -- and its
peak RSS. Target: under 2 GB.

Usage: python benchmarks/memory.py [--requests 10000000] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import speed  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=10_000_000)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from servesim import scenario_from_dict
    from servesim.simulate import build, run_built

    t0 = time.perf_counter()
    sc = scenario_from_dict(speed.scenario_dict("a", args.requests, "roofline"), "memory")
    b = build(sc)
    t_build = time.perf_counter() - t0
    res = run_built(b)
    t_run = time.perf_counter() - t0 - t_build
    out = Path(args.out or tempfile.mkdtemp(prefix="servesim-mem-"))
    res.write(out)
    t_total = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    s = res.summary
    print(json.dumps({
        "requests": args.requests, "engine": b.replica.path, "build_s": round(t_build, 1),
        "run_s": round(t_run, 1), "total_s": round(t_total, 1),
        "req_per_wall_s": round(args.requests / t_run), "peak_rss_mb": round(rss),
        "itl_pairs_spilled": res.recorder.itl.spilled, "ttft_p999_s": s["latency_s"]["ttft"]["p999"],
        "itl_p99_s": s["latency_s"]["itl"]["p99"], "requests_parquet_mb": round((out / "requests.parquet").stat().st_size / 2**20),
    }))


if __name__ == "__main__":
    main()
