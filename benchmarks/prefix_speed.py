"""Prefix caching speed, side by side in one process: the kernels (compiled) against the same run
without prefix caching, and against the Python reference manager (what prefix caching ran on
before the kernels, kept frozen as tests/reference_kv: PrefixCacheKV bound into the uncompiled
engine).

  no-reuse     speed.py's workload (a) (Azure 2023 conversation lengths, no prefix chains) at
               ``--requests``: prefix caching off (compiled) vs on (compiled): the cache finds
               nothing, so the ratio is the kernels' own overhead
  mooncake     scenarios/traces/mooncake_conversation.yaml (prefix caching + an L2 tier of 512
               GiB, 3,000 Mooncake conversation requests): the reference object on the Python
               engine vs the kernels compiled; results must be identical

Each case runs once untimed first (loads the compiled engine), then ``--repeat`` times; the
median run time counts (build excluded). Usage:
    python benchmarks/prefix_speed.py [--requests 5000] [--repeat 3] [--skip-reference]
Append the printed table to benchmarks/RESULTS.md with the date and machine.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from speed import scenario_dict  # noqa: E402

from servesim import scenario_from_dict  # noqa: E402
from servesim.kv import factory  # noqa: E402
from servesim.scenario import load_scenario  # noqa: E402
from servesim.simulate import build, run_built  # noqa: E402
from tests.reference_kv.build import build_reference  # noqa: E402


def timed(make, reference: bool = False, repeat: int = 1):
    """(median run seconds, last result, engine path) of ``repeat`` runs of ``make()``."""
    times, res, path = [], None, ""
    for _ in range(repeat):
        factory.OBJECT_REFERENCE = build_reference if reference else None
        try:
            b = build(make())
        finally:
            factory.OBJECT_REFERENCE = None
        path = b.replica.path
        t = time.perf_counter()
        res = run_built(b)
        times.append(time.perf_counter() - t)
    return statistics.median(times), res, path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-reference", action="store_true", help="skip the slow reference-object run")
    a = ap.parse_args()
    rows = []

    def noreuse(prefix: bool, n: int = a.requests):
        d = scenario_dict("a", n, "roofline")
        d["engine"]["enable_prefix_caching"] = prefix
        d["sim"] = {"engine": "compiled"}
        return scenario_from_dict(d)

    timed(lambda: noreuse(True, 50))  # load the compiled engine
    off, r_off, p_off = timed(lambda: noreuse(False), repeat=a.repeat)
    on, r_on, p_on = timed(lambda: noreuse(True), repeat=a.repeat)
    same = r_off.requests.equals(r_on.requests)
    rows.append((f"(a) {a.requests:,} req, no prefix caching", p_off, off, ""))
    rows.append((f"(a) {a.requests:,} req, prefix caching, no reuse", p_on, on,
                 f"{off / on:.0%} of the speed without; results identical: {same}"))

    moon = REPO / "scenarios/traces/mooncake_conversation.yaml"
    comp, r_comp, p_comp = timed(lambda: load_scenario(moon, ["sim.engine=compiled"]), repeat=a.repeat)
    hit = r_comp.summary["kv"]["prefix_hit_rate"]["tokens"]
    rows.append(("mooncake example, kernels", p_comp, comp, f"token hit rate {hit:.3f}"))
    if not a.skip_reference:
        ref, r_ref, p_ref = timed(lambda: load_scenario(moon, ["sim.engine=python"]), reference=True)
        same = r_ref.requests.equals(r_comp.requests) and r_ref.summary["kv"] == r_comp.summary["kv"]
        rows.append(("mooncake example, reference object (before)", p_ref, ref,
                     f"kernels {ref / comp:.1f}x faster; results identical: {same}"))
    print(f"machine: {platform.machine()}, Python {platform.python_version()}; median of {a.repeat} runs "
          f"(the reference: one)")
    print("| case | engine | run s | note |\n|---|---|---|---|")
    for name, path, s, note in rows:
        print(f"| {name} | {path} | {s:.2f} | {note} |")


if __name__ == "__main__":
    main()
