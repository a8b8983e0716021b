"""Where experiment A's offered load fits: the rate scale each 24-GPU fleet sustains within its
streams' SLOs (`servesim capacity`'s max-rate search, the same code), and the fleet size that
carries the full rate (replicas of the same kind).

Both use servesim's capacity machinery (servesim/sweep/capacity.py): a probe runs replications
and passes only when every SLO's 95 % interval is on the right side of its bound. The fleet-size
search doubles the replica count from the given fleet (known to fail) until a count passes, then
bisects to a relative precision, like the rate search (`servesim capacity --find min-replicas`
bisects to the exact integer, more probes than a table of this size needs).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from benchmarks.reference.execute import _finite, key_of
from benchmarks.reference.plan import Run


@dataclass(frozen=True)
class Budget:
    seeds: int = 3  # replications per probe to start with
    max_seeds: int = 6  # at most, while an SLO's interval straddles its bound
    tol: float = 0.15  # relative precision of the answer (rate and fleet size)
    fleet_duration_s: float = 60.0  # simulated seconds of each fleet-size probe
    fleet_limit: int = 4096  # replicas at most


def _path(out: Path, run: Run, kind: str) -> Path:
    return out / "capacity" / run.exp / f"{run.label}-{kind}.json"


def _load(out: Path, run: Run, kind: str, params: dict) -> dict | None:
    p = _path(out, run, kind)
    if not p.is_file():
        return None
    d = json.loads(p.read_text())
    return d if d.get("key") == key_of(run) and d.get("params") == params else None


def _save(out: Path, run: Run, kind: str, d: dict) -> dict:
    p = _path(out, run, kind)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(_finite(d), indent=1, sort_keys=True) + "\n")
    return d


def max_rate(run: Run, out: Path, budget: Budget, say: Callable[[str], None], force: bool = False) -> dict:
    """The largest rate scale of the whole workload meeting every stream's SLO on this fleet."""
    from servesim.sweep.capacity import Budget as CapBudget, find_max_rate, scenario_slos

    params = {"seeds": budget.seeds, "max_seeds": budget.max_seeds, "tol": budget.tol}
    if not force and (hit := _load(out, run, "max-rate", params)) is not None:
        say(f"  {run.label}: max-rate search stored")
        return hit
    sc = run.scenario
    slos = scenario_slos(sc)
    search = find_max_rate(sc, slos, CapBudget(budget.seeds, budget.max_seeds), tol=budget.tol,
                           progress=lambda m: say(f"  {run.label}: {m}"))
    return _save(out, run, "max-rate", {"key": key_of(run), "params": params, "label": run.label,
                                        "tags": run.tags, **search.to_dict()})


def fleet_size(run: Run, out: Path, budget: Budget, say: Callable[[str], None], force: bool = False) -> dict:
    """The fewest replicas of this fleet's kind that meet every SLO at the full rate (within
    ``budget.tol``), from probes of ``budget.fleet_duration_s`` simulated seconds.

    Doubling from the given fleet until a count passes, then bisection (geometric) between the
    last failing and the first passing count. A probe left open (an SLO's interval straddles its
    bound at the budget) is neither: bisection stops there, and the answer is the bracket of
    verified counts with the undecided ones named. Probes of an earlier search with the same
    configuration and budget are reused, not run again."""
    from servesim.sweep.capacity import Budget as CapBudget, Prober, scenario_slos

    params = {"seeds": budget.seeds, "max_seeds": budget.max_seeds, "tol": budget.tol,
              "duration_s": budget.fleet_duration_s}
    earlier = None if force else _load(out, run, "fleet-size", params)
    done = {p["replicas"]: p for p in (earlier or {}).get("path", [])}
    sc = run.scenario
    st = sc.stop
    dur = min(st.duration_s or budget.fleet_duration_s, budget.fleet_duration_s)
    warm = min(st.warmup_requests, int(0.25 * dur * _rate(sc)))  # at most the first quarter of a probe
    base = sc.override({"hardware.servers": None, "stop.duration_s": dur, "stop.warmup_requests": warm},
                       source="fleet size")
    slos = scenario_slos(sc)
    prober = Prober(lambda n: base.override({"hardware.replicas": int(n)}, source="fleet size"), slos,
                    CapBudget(budget.seeds, budget.max_seeds),
                    progress=lambda m: say(f"  {run.label}: replicas {m.removeprefix('probe ')}"))
    path: list[dict] = []

    def probe(n: int) -> str:
        if n in done:
            say(f"  {run.label}: replicas {n}: {done[n]['verdict']} (stored)")
            path.append(done[n])
            return done[n]["verdict"]
        p = prober(n)
        path.append({"replicas": n, "replications": p.n, "verdict": p.verdict,
                     "slos": {str(s): {**iv.to_dict(), "verdict": v} for s, iv, v in p.checks}})
        return p.verdict

    lo, hi, opens, refused = search_count(probe, sc.hardware.replicas, budget.tol, budget.fleet_limit)
    gpus = sc.tp * sc.pp
    return _save(out, run, "fleet-size", {
        "key": key_of(run), "params": params, "label": run.label, "tags": run.tags, "refused": refused,
        "answer_replicas": hi if refused is None else None, "first_failure_replicas": lo,
        "undecided_replicas": sorted(opens), "gpus_per_replica": gpus,
        "answer_gpus": hi * gpus if refused is None and hi else None, "path": path})


def search_count(probe: Callable[[int], str], start: int, tol: float, limit: int):
    """Fewest passing count: double from ``start`` (expected to fail) until one passes, then
    bisect geometrically while the bracket is wider than ``tol``. An open verdict is neither
    pass nor fail: while doubling the search goes on; while bisecting it stops there. Returns
    (last failing count, first passing count, open counts, reason for no answer or None)."""
    lo, hi, opens, refused = None, None, [], None
    n = start
    while hi is None:
        v = probe(n)
        if v == "pass":
            hi = n
        else:
            if v == "fail":
                lo = n
            else:
                opens.append(n)
            if n >= limit:
                return lo, None, opens, f"no count up to {limit} replicas meets every SLO"
            n = min(2 * n, limit)
    if lo is None and not opens:
        return lo, hi, opens, (f"the given fleet of {start} replicas already meets every SLO: "
                               f"the search starts above the answer")
    while lo is not None and hi / lo - 1 > tol and hi - lo > 1:
        mid = min(max(int(round(math.sqrt(lo * hi))), lo + 1), hi - 1)
        v = probe(mid)
        if v == "pass":
            hi = mid
        elif v == "fail":
            lo = mid
        else:  # the SLO is within the noise here: the answer is the bracket around it
            opens.append(mid)
            break
    return lo, hi, [o for o in opens if lo is None or o > lo], refused


def _rate(sc) -> float:
    from servesim.sweep.ratescale import base_rate

    return base_rate(sc) or 1.0
