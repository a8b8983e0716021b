"""Capacity answers: the largest rate (or the fewest replicas) that meets every SLO, with
replications behind each step so the answer is not a lucky seed.

The pieces, one module each:

    servesim/sweep/slo.py       an SLO and how an interval is judged against it (pass/fail/open)
    servesim/sweep/probe.py     a probe: replications of one configuration until every SLO is
                                decided (sequential testing); the budget; the probe store
    servesim/sweep/search.py    the max-rate and min-replicas searches over probes, the
                                zero-load refusal, budget stops
    servesim/sweep/crossing.py  the answer as a number: where the binding SLO crosses its bound,
                                with an interval and the chance the next step up still meets it

This module holds the two verbs (``find_max_rate``, ``find_min_replicas``) and the refusals
that need no run (``preflight``); it re-exports the names above for callers of the library.
"""

from __future__ import annotations

from typing import Callable

from servesim.errors import ServesimError
from servesim.perf.select import provenance
from servesim.scenario import Scenario
from servesim.sweep.crossing import Crossing
from servesim.sweep.probe import Budget, BudgetSpent, Probe, Prober, ProbeStore, parse_budget
from servesim.sweep.ratescale import request_rate, scale_rate, scaled_rates
from servesim.sweep.runner import Progress
from servesim.sweep.search import ZERO_LOAD, Search, search_max_rate, search_min_replicas
from servesim.sweep.slo import SLO, CapacityError, Verdict, check_slos, merge_slos, parse_slo, scenario_slos

__all__ = ["SLO", "Budget", "BudgetSpent", "CapacityError", "Crossing", "Probe", "Prober", "ProbeStore", "Search",
           "Verdict", "check_slos", "find_max_rate", "find_min_replicas", "merge_slos", "parse_budget", "parse_slo",
           "preflight", "scenario_slos", "search_max_rate", "search_min_replicas"]


def preflight(sc: Scenario, find: str, tol: float = 0.05) -> None:
    """Raise what a search would refuse before its first run: a bad tolerance, a workload without
    a rate to scale, a replica search over cluster.groups or of a replica that cannot be built."""
    if not 0 < tol < 1:
        raise CapacityError(f"--tol {tol}: must be between 0 and 1 (a relative precision, e.g. 0.05)")
    if find == "max-rate":
        scale_rate(sc, 1.0)
        return
    if sc.cluster.groups is not None:
        raise CapacityError("--find min-replicas varies hardware.replicas, the one-group fleet form; this "
                            "scenario lists cluster.groups (search a group's replicas with a sweep over "
                            "cluster.groups instead)")
    why = first_count_unbuildable(sc)
    if why is not None:
        raise CapacityError(f"--find min-replicas: one replica of this scenario cannot be simulated: {why}")


def find_max_rate(sc: Scenario, slos: list[SLO], budget: Budget, *, tol: float = 0.05, executor=None,
                  progress: Callable[[str], None] | None = None, start: float | None = None,
                  store: ProbeStore | None = None, run_progress: Progress | None = None) -> Search:
    """``start``: the first rate probed, in req/s when the scenario states its request rate
    exactly, else as a rate scale (1 = the scenario's rate)."""
    budget.check()
    check_slos(sc, slos)
    preflight(sc, "max-rate", tol)
    base = request_rate(sc)  # None: sessions, closed loops, traces: the runs measure the request rate

    def describe(x: float) -> str:  # the configured numbers, each in its unit: never sessions as req/s
        if base is not None:
            return f"{base * x:.4g} req/s (x{x:.4g})"
        return f"rate scale x{x:.4g} ({scaled_rates(sc, x)})"

    x0 = 1.0
    if start is not None:
        x0 = start / base if base is not None else start
    prober = Prober(lambda x: scale_rate(sc, x), slos, budget, executor, progress, run_progress=run_progress,
                    store=store, describe=describe)
    out = search_max_rate(prober, slos, tol=tol, describe=describe, base=base, start=x0,
                          extend=prober.extend)
    out.scaled = None if base is not None else scaled_rates(sc)
    out.step_model = provenance(sc)
    out.step_models = sorted(prober.step_models)
    return out


def first_count_unbuildable(sc: Scenario) -> str | None:
    """Why one replica of ``sc``, the search's first probe, cannot be built (None when it can):
    a scenario no count can run is refused before any worker starts. Larger counts the servers
    cannot hold are not refused here: the answer may be below them (the search stops at the
    first count that does not fit, with the placement's reason)."""
    from servesim.simulate import build

    try:
        build(sc.override({"hardware.replicas": 1}, source="--find min-replicas"), cold="python")
    except ServesimError as exc:
        return str(exc)
    return None


def find_min_replicas(sc: Scenario, slos: list[SLO], budget: Budget, *, start: int = 1, executor=None,
                      progress: Callable[[str], None] | None = None, store: ProbeStore | None = None,
                      run_progress: Progress | None = None, limit: int = 4096) -> Search:
    """``start``: the first count probed (e.g. a lower bound from one replica's capacity); the
    answer does not depend on it, only the number of probes does. ``limit``: the most replicas
    tried (the plan stops an option at the count that would cost more than its best answer)."""
    budget.check()
    check_slos(sc, slos)
    preflight(sc, "min-replicas")
    if isinstance(start, bool) or not isinstance(start, int) or start < 1:
        raise CapacityError(f"start {start!r}: give a whole number of replicas >= 1")

    def make(n: float) -> Scenario:
        if n < 1:  # the zero-load probe: one replica at ZERO_LOAD of the fleet's rate
            return scale_rate(sc.override({"hardware.replicas": 1}, source="--find min-replicas"), ZERO_LOAD)
        return sc.override({"hardware.replicas": int(n)}, source="--find min-replicas")

    describe = (lambda n: f"{int(n)} replicas" if n >= 1 else f"1 replica at x{ZERO_LOAD:g} of the rate")
    prober = Prober(make, slos, budget, executor, progress, run_progress=run_progress, store=store,
                    describe=describe)
    zero = (lambda: prober(ZERO_LOAD)) if sc.workload.has_open_loop() else None
    out = search_min_replicas(prober, slos, start=start, zero_load=zero, limit=limit)
    out.step_model = provenance(sc)
    out.step_models = sorted(prober.step_models)
    return out
