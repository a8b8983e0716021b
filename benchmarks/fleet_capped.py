"""``fleet.py --one``'s measurement with ``engine.max_num_seqs`` capped, so that replicas queue
(the regime where the least-tokens read's running count of waiting-queue tokens matters: issue
30, benchmarks/RESULTS.md "the waiting-queue tokens as a running count"). Prints one JSON line.

    python benchmarks/fleet_capped.py REPLICAS ROUTER|lone REQUESTS RATE MAX_NUM_SEQS
    python benchmarks/fleet_capped.py 1024 least-tokens 200000 8.5 32
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleet import scenario  # noqa: E402

from servesim import scenario_from_dict  # noqa: E402
from servesim.simulate import build  # noqa: E402


def main() -> None:
    n, router, requests, rate, seqs = (int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4]),
                                       int(sys.argv[5]))
    raw = scenario(n, requests, None if router == "lone" else router, rate)
    raw["engine"]["max_num_seqs"] = seqs
    t0 = time.perf_counter()
    b = build(scenario_from_dict(raw))
    t1 = time.perf_counter()
    b.env.run()
    t2 = time.perf_counter()
    print(json.dumps({"replicas": n, "router": router, "requests": requests, "max_num_seqs": seqs,
                      "build_s": t1 - t0, "run_s": t2 - t1,
                      "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


if __name__ == "__main__":
    main()
