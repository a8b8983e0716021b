"""Cache-aware routing (issue 31, fleets): prefix hit rate and TTFT of the ``cache-aware`` router
against ``least-tokens`` and ``affinity`` on workloads with prefix reuse, one fleet each.

Workloads (``--only``):

  sessions   scenarios/traces/chat_sessions.yaml (multi-turn chat: 512-token system prompt +
             history + new input) with prefix caching on, on ``--replicas`` replicas at
             ``--replicas`` x its session rate (the lone replica's load per replica)
  mooncake   scenarios/traces/mooncake_conversation.yaml (Mooncake FAST'25 conversation trace,
             512-token hash blocks) on ``--replicas`` replicas at ``--replicas`` x its
             rate_scale, GPU-only cache (kv_tiers: []) and with its 512 GiB L2 tier

Arms: least-requests, least-tokens, affinity (its ``auto`` key: sessions, else the first prefix block),
cache-aware (sgl-router's defaults), cache-aware with ``load: tokens`` (its absolute
threshold then in tokens: 16,384). Every arm is the same
workload (seed 1). Columns: prefix hit rate over prompt tokens looked up (``kv.prefix_hit_rate``),
TTFT mean / P50 / P99, the cache-aware router's decisions, the busiest replica's requests over
the mean, and the wall seconds of the run (build excluded).

``--scale 16,128``: the router's cost instead -- the sessions workload on N replicas (N x the
session rate, ``--requests`` or 20,000), least-tokens, cache-aware reading every replica, and
cache-aware with ``router_sample: 2``: run seconds and microseconds per request.

Usage:  python benchmarks/prefix_router.py [--only sessions,mooncake] [--replicas 4] [--requests N]
        python benchmarks/prefix_router.py --scale 16,128 [--requests N]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARMS = (("least-requests", {}), ("least-tokens", {}), ("affinity", {}), ("cache-aware", {}), ("cache-aware", {"load": "tokens", "balance_abs_threshold": 16384}))


def workloads(replicas: int, requests: int | None) -> dict[str, list[tuple[str, list[str]]]]:
    """name -> [(variant label, scenario file + --set overrides)]."""
    fleet = [f"hardware.replicas={replicas}"]
    out = {
        "sessions": [("", ["scenarios/traces/chat_sessions.yaml", *fleet, "engine.enable_prefix_caching=true",
                           f"workload.arrival.rate={0.5 * replicas}", f"stop.requests={requests or 5000}"])],
        "mooncake": [],
    }
    base = ["scenarios/traces/mooncake_conversation.yaml", *fleet, f"workload.trace.rate_scale={0.2 * replicas}",
            f"stop.requests={requests or 3000}"]
    out["mooncake"] = [("GPU only", base + ["kv_tiers=[]"]), ("L2 512 GiB", base)]
    return out


def run_arm(spec: list[str], router: str, knobs: dict, sample: int = 0) -> dict:
    from servesim.scenario import load_scenario
    from servesim.simulate import build, run_built

    sets = spec[1:] + [f"cluster.router={router}"] + [f"cluster.cache_aware.{k}={v}" for k, v in knobs.items()]
    if sample:
        sets.append(f"cluster.router_sample={sample}")
    sc = load_scenario(REPO / spec[0], sets)
    b = build(sc)
    t0 = time.perf_counter()
    res = run_built(b)
    wall = time.perf_counter() - t0
    s = res.summary
    ttft = s["latency_s"]["ttft"]
    c = s["cluster"]
    return {"hit": s["kv"]["prefix_hit_rate"]["tokens"], "ttft": ttft, "ca": c.get("cache_aware"),
            "imb": c["balance"]["requests"]["max_over_mean"], "wall": wall, "n": s["requests"]["completed"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="sessions,mooncake")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--scale", default="")
    a = ap.parse_args()
    sys.path.insert(0, str(REPO))
    os.chdir(REPO)
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()}, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    if a.scale:
        n_req = a.requests or 20000
        print("\n| replicas | router | prefix hit (tokens) | TTFT mean s | run s | us / request |")
        print("|---|---|---|---|---|---|")
        for n in (int(x) for x in a.scale.split(",")):
            spec = workloads(n, n_req)["sessions"][0][1]
            for router, sample in (("least-tokens", 0), ("cache-aware", 0), ("cache-aware", 2)):
                r = run_arm(spec, router, {}, sample)
                arm = router + (f", router_sample: {sample}" if sample else "")
                print(f"| {n} | {arm} | {r['hit']:.1%} | {r['ttft']['mean']:.3f} | {r['wall']:.2f} "
                      f"| {r['wall'] / n_req * 1e6:.0f} |", flush=True)
        return
    for name, variants in workloads(a.replicas, a.requests).items():
        if name not in a.only.split(","):
            continue
        for label, spec in variants:
            print(f"\n{name} {label}: {a.replicas} replicas, {' '.join(spec)}\n")
            print("| router | prefix hit (tokens) | TTFT mean s | P50 s | P99 s | cache-routed / below / unbalanced "
                  "| max/mean requests | run s |")
            print("|---|---|---|---|---|---|---|---|")
            for router, knobs in ARMS:
                r = run_arm(spec, router, knobs)
                t, ca = r["ttft"], r["ca"]
                dec = f"{ca['cache_routed']:,} / {ca['below_threshold']:,} / {ca['unbalanced']:,}" if ca else "-"
                arm = router + "".join(f", {k}: {v}" for k, v in knobs.items())
                print(f"| {arm} | {r['hit']:.1%} | {t['mean']:.3f} | {t['p50']:.3f} | {t['p99']:.3f} | {dec} "
                      f"| {r['imb']:.2f} | {r['wall']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
