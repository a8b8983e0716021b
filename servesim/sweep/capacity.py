"""Capacity answers: the largest rate (or the fewest replicas) that meets every SLO, with
replications behind each step so the answer is not a lucky seed.

A *probe* runs one configuration for seeds ``seed, seed+1, ...`` (the same seeds at every probe:
common random numbers, so two probes differ by their configuration, not their luck) and puts a
t interval (servesim/metrics/intervals.py) around each SLO metric. An SLO ``ttft_p99 <= 0.8``

    passes      when the whole interval is below 0.8,
    fails       when the whole interval is above it (or the metric has no value: nothing measured),
    is open     when the interval straddles 0.8: the probe adds replications (``seeds`` at a time)
                until it is decided or ``max_seeds`` are spent.

A probe passes when every SLO passes, fails when any fails. The max-rate search multiplies the
scenario's rate (one function: servesim/sweep/ratescale.py) by 2 (or 1/2) until it has a passing and
a failing scale, then bisects on the log scale until the two are within ``tol`` of each other::

    x1 pass ─► x2 pass ─► x4 fail ─► x2.83 pass ─► x3.36 fail ─► ... ─► answer: highest pass

The answer is the highest rate *verified* to pass; the margin is how far the first verified
failure lies above it and how much room each SLO's interval leaves at the answer. When a probe is
still open with its budget spent, the search stops and refuses to answer: the SLO is within the
noise of the budget at that rate, and it says so, with what it did establish.

The min-replicas search is the same on integers over ``hardware.replicas`` (the one-group fleet
form, docs/cluster.md) at the scenario's fleet-wide rate: doubling from 1 until a count passes,
then bisection down to the fewest. An open probe there has no neighbour to settle it (counts are
exact), so it refuses at once.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable, Literal

from servesim.errors import ServesimError
from servesim.metrics.flat import check_metric_name, flat_metrics
from servesim.metrics.intervals import DEFAULT_CONFIDENCE, Interval, intervals
from servesim.perf.select import provenance
from servesim.scenario import Scenario
from servesim.sweep.executor import SerialExecutor
from servesim.sweep.ratescale import request_rate, scale_rate, scaled_rates
from servesim.sweep.runner import Progress, raise_errors, run_tasks
from servesim.sweep.spec import Point, scenario_key
from servesim.sweep.task import Task

Verdict = Literal["pass", "fail", "open"]


class CapacityError(ServesimError):
    """A capacity question that cannot be asked as given (bad SLO, unsupported search)."""


# ---------------------------------------------------------------------------------------- SLOs
@dataclass(frozen=True)
class SLO:
    """``metric <= bound`` (``upper``) or ``metric >= bound``."""

    metric: str
    bound: float
    upper: bool = True

    def __str__(self) -> str:
        return f"{self.metric} {'<=' if self.upper else '>='} {self.bound:g}"

    def judge(self, iv: Interval) -> Verdict:
        if not math.isfinite(iv.estimate):
            return "fail"  # nothing measured: a rate that completes no request meets no SLO
        if not math.isfinite(iv.half_width):
            return "open"
        if self.upper:
            return "pass" if iv.hi <= self.bound else "fail" if iv.lo > self.bound else "open"
        return "pass" if iv.lo >= self.bound else "fail" if iv.hi < self.bound else "open"

    def headroom(self, iv: Interval) -> float:
        """Room left at the interval's unfavourable end, as a share of the bound (negative: over)."""
        if not math.isfinite(iv.estimate):
            return math.nan
        end = iv.hi if self.upper else iv.lo
        if not math.isfinite(end):
            end = iv.estimate
        return (self.bound - end) / abs(self.bound) if self.upper else (end - self.bound) / abs(self.bound)


_SLO_RE = re.compile(r"^\s*([A-Za-z0-9_]+(?:@[A-Za-z0-9_][A-Za-z0-9_.:+-]*)?)\s*(<=|>=|=)\s*([^\s]+)\s*$")


def parse_slo(text: str) -> SLO:
    """``ttft_p99=0.8`` or ``ttft_p99<=0.8`` (at most), ``slo_attainment>=0.99`` (at least); per
    class ``ttft_p99@chat=0.5``."""
    m = _SLO_RE.match(text)
    if not m:
        raise CapacityError(f"--slo {text!r}: expected METRIC=VALUE (at most) or METRIC>=VALUE, e.g. ttft_p99=0.8")
    name, op, value = m.groups()
    why = check_metric_name(name)
    if why:
        raise CapacityError(f"--slo {text!r}: {why}")
    try:
        bound = float(value)
    except ValueError:
        raise CapacityError(f"--slo {text!r}: {value!r} is not a number") from None
    if not math.isfinite(bound):
        raise CapacityError(f"--slo {text!r}: the bound must be a finite number")
    return SLO(name, bound, upper=op != ">=")


def scenario_slos(sc: Scenario) -> list[SLO]:
    """The SLOs the scenario's streams state (``slo: {ttft_p99: 0.8}`` on a stream of class
    ``chat``), as per-class SLOs (``ttft_p99@chat <= 0.8``): the targets ``by_class`` reports."""
    out: list[SLO] = []
    seen: set[str] = set()
    for sp in sc.workload.stream_specs():
        if sp.slo is None or sp.label is None or sp.label in seen:
            continue
        seen.add(sp.label)
        out += [SLO(f"{key}@{sp.label}", float(v)) for key, v in sp.slo.targets().items()]
    return out


def merge_slos(given: list[SLO], from_scenario: list[SLO]) -> list[SLO]:
    """The command line's SLOs, then the scenario's on metrics the command line does not bound."""
    named = {s.metric for s in given}
    return given + [s for s in from_scenario if s.metric not in named]


# -------------------------------------------------------------------------------------- probes
@dataclass
class Probe:
    x: float  # rate scale, or replica count
    scenario: Scenario
    n: int  # replications run
    checks: list[tuple[SLO, Interval, Verdict]]
    arrived: list[float] = field(default_factory=list)  # requests per second that arrived, each run

    @property
    def measured_rate(self) -> float | None:
        """Mean over the runs of the request rate that arrived (None: not measured)."""
        vals = [v for v in self.arrived if math.isfinite(v)]
        return sum(vals) / len(vals) if vals else None

    @property
    def verdict(self) -> Verdict:
        vs = [v for _, _, v in self.checks]
        return "fail" if "fail" in vs else "pass" if all(v == "pass" for v in vs) else "open"


@dataclass
class Budget:
    seeds: int = 5  # replications of a probe to begin with (and to add while one is open)
    max_seeds: int = 30
    confidence: float = DEFAULT_CONFIDENCE

    def check(self) -> None:
        if self.seeds < 2:
            raise CapacityError(f"--seeds {self.seeds}: intervals need at least 2 replications per probe")
        if self.max_seeds < self.seeds:
            raise CapacityError(f"--max-seeds {self.max_seeds}: must be at least --seeds {self.seeds}")
        if not 0.5 <= self.confidence < 1:
            raise CapacityError(f"--confidence {self.confidence}: must be in [0.5, 1)")


class Prober:
    """Runs a probe: replications of ``make(x)`` until every SLO is decided or the budget is
    spent (an SLO already failed decides the probe: no more runs)."""

    def __init__(self, make: Callable[[float], Scenario], slos: list[SLO], budget: Budget, executor=None,
                 progress: Callable[[str], None] | None = None, run_progress: Progress | None = None):
        self.make, self.slos, self.budget = make, slos, budget
        self.executor = executor or SerialExecutor()
        self.progress = progress
        self.run_progress = run_progress
        self.runs = 0
        self._digests: dict[str, str] = {}  # the files the probes read, hashed once a search

    def __call__(self, x: float) -> Probe:
        sc = self.make(x)
        key = scenario_key(sc, self._digests)
        point = Point(0, {}, sc, key)
        rows: list[dict] = []
        arrived: list[float] = []
        n = 0
        while True:
            add = self.budget.seeds if n == 0 else min(self.budget.seeds, self.budget.max_seeds - n)
            tasks = [Task(key, sc.seed + r, r, sc) for r in range(n, n + add)]
            got: dict[int, dict] = {}
            rep = run_tasks([point], tasks, self.executor, metrics=(), progress=self.run_progress,
                            on_result=lambda t, out: got.__setitem__(t.seed, out))
            raise_errors(rep)
            names = tuple(dict.fromkeys(s.metric for s in self.slos))
            rows += [flat_metrics(got[t.seed]["summary"], names) for t in tasks]
            arrived += [float(got[t.seed].get("arrived_req_per_s", math.nan)) for t in tasks]
            n += add
            self.runs += add
            ivs = intervals(rows, self.budget.confidence)
            checks = [(s, ivs[s.metric], s.judge(ivs[s.metric])) for s in self.slos]
            probe = Probe(x, sc, n, checks, list(arrived))
            if probe.verdict != "open" or n >= self.budget.max_seeds:
                if self.progress:
                    self.progress(f"probe {x:.4g}: {probe.verdict} after {n} replications")
                return probe


# ------------------------------------------------------------------------------------ searches
@dataclass
class Search:
    kind: str  # "max-rate" | "min-replicas"
    slos: list[SLO]
    path: list[Probe] = field(default_factory=list)
    best: Probe | None = None  # highest passing scale / fewest passing replicas
    bound: Probe | None = None  # lowest failing scale / most failing replicas next to it
    refused: str | None = None
    base_rate: float | None = None  # req/s at scale 1, when the scenario states it exactly (max-rate)
    tol: float = 0.0
    scaled: str | None = None  # what scale 1 is, in its own units ("10 session starts/s"), when not req/s
    step_model: dict | None = None  # the step-time model and pack the probes ran (servesim/perf/select.py)

    @property
    def answered(self) -> bool:
        return self.refused is None and self.best is not None

    def rate(self, p: Probe | None) -> float | None:
        """Requests per second at probe ``p``: the scenario's request rate times the scale when
        the scenario states one exactly, else the request rate measured in the probe's runs (a
        sessions workload's rate starts sessions, a closed loop's follows from latency), else
        None. Never a session rate or an open-loop part reported as the request rate."""
        if p is None:
            return None
        return self.base_rate * p.x if self.base_rate is not None else p.measured_rate

    @property
    def rate_source(self) -> str | None:
        """How ``rate`` was obtained: "configured", "measured", or None (max-rate only)."""
        if self.kind != "max-rate":
            return None
        return "configured" if self.base_rate is not None else "measured"

    def margins(self) -> list[tuple[SLO, Interval, float]]:
        if self.best is None:
            return []
        return [(s, iv, s.headroom(iv)) for s, iv, _ in self.best.checks]

    def to_dict(self) -> dict:
        def probe(p: Probe) -> dict:
            return {"x": p.x, "rate_req_per_s": self.rate(p) if self.kind == "max-rate" else None,
                    "measured_req_per_s": p.measured_rate, "replications": p.n, "verdict": p.verdict,
                    "slos": {str(s): {**iv.to_dict(), "verdict": v} for s, iv, v in p.checks}}

        return {"find": self.kind, "slos": [str(s) for s in self.slos], "answered": self.answered,
                "refused": self.refused, "tol": self.tol, "base_rate_req_per_s": self.base_rate,
                "rate_source": self.rate_source, "scaled_at_x1": self.scaled, "step_model": self.step_model,
                "answer": None if self.best is None or self.refused else probe(self.best),
                "first_failure": None if self.bound is None else probe(self.bound),
                "path": [probe(p) for p in self.path]}


def _measured(iv: Interval) -> str:
    if math.isfinite(iv.estimate):
        return f"{iv.estimate:.4g}"
    return ("nothing (no request completed after the warm-up: stop.warmup_requests covers the whole run, "
            "or nothing finished)")


def _open_reason(p: Probe, what: str) -> str:
    s, iv, _ = next(c for c in p.checks if c[2] == "open")
    return (f"at {what} the {s.metric} interval {iv.estimate:.4g} ± {iv.half_width:.2g} "
            f"({iv.confidence:.0%}) straddles the SLO {s} after {p.n} replications, the budget (--max-seeds)")


def search_max_rate(probe: Callable[[float], Probe], slos: list[SLO], *, tol: float = 0.05, grow: float = 2.0,
                    max_doublings: int = 12, max_probes: int = 40,
                    describe: Callable[[float], str] = lambda x: f"rate x{x:.4g}",
                    base: float | None = None) -> Search:
    """Largest passing rate scale: bracket by doubling/halving from 1, then bisect (log scale)
    until a verified pass and a verified failure are within ``tol`` (relative) of each other.

    A probe left open (an SLO's interval straddles its bound at the budget) is neither: the
    frontier is near it. Bisection then works on the two gaps around the open probes (highest
    pass .. lowest open, highest open .. lowest failure), halving the wider until the answer fits
    in ``tol``. When the open probes alone span more than ``tol``, or both gaps are down to a
    quarter of ``tol`` and the answer still does not fit, the SLO is undecided over a range of
    rates wider than the precision asked: the search refuses."""
    if not 0 < tol < 1:
        raise CapacityError(f"--tol {tol}: must be between 0 and 1 (a relative precision, e.g. 0.05)")
    out = Search("max-rate", slos, base_rate=base, tol=tol)
    opens: list[Probe] = []
    eps = (1 + tol) ** 0.25

    def run(x: float) -> None:
        p = probe(x)
        out.path.append(p)
        if p.verdict == "pass" and (out.best is None or x > out.best.x):
            out.best = p
        elif p.verdict == "fail" and (out.bound is None or x < out.bound.x):
            out.bound = p
        elif p.verdict == "open":
            opens.append(p)

    def known() -> str:
        k = []
        if out.best is not None:
            k.append(f"{describe(out.best.x)} meets every SLO")
        if out.bound is not None:
            k.append(f"{describe(out.bound.x)} does not")
        return "; ".join(k) + "; " if k else ""

    advice = "raise --max-seeds, loosen --tol, or make runs longer (stop.requests or stop.duration_s)"
    run(1.0)
    doublings = 0
    while out.best is None or out.bound is None:
        xs = [p.x for p in out.path]
        if doublings == max_doublings:
            if out.bound is None and not opens:
                out.refused = (f"no answer: every SLO is met even at {describe(max(xs))} (the largest scale "
                               f"tried); nothing binds in this range")
            elif out.best is None and not opens:
                fails = "; ".join(f"{s} measured {_measured(iv)}" for s, iv, v in out.bound.checks if v == "fail")
                out.refused = (f"no answer: the SLOs are not met even at {describe(min(xs))} "
                               f"(the smallest scale tried): {fails}")
            else:
                out.refused = (f"no answer: {_open_reason(opens[-1], describe(opens[-1].x))}, and no rate "
                               f"{'above' if out.bound is None else 'below'} it was decided within "
                               f"{grow:g}^{max_doublings}; {known()}{advice}")
            return out
        doublings += 1
        run(max(xs) * grow if out.bound is None else min(xs) / grow)
    while out.bound.x / out.best.x - 1 > tol:
        if out.best.x >= out.bound.x:
            break
        if len(out.path) >= max_probes:
            out.refused = f"no answer after {max_probes} probes; {known()}{advice}"
            return out
        inside = [p.x for p in opens if out.best.x < p.x < out.bound.x]
        if not inside:
            run(math.sqrt(out.best.x * out.bound.x))
            continue
        lo_gap, hi_gap = min(inside) / out.best.x, out.bound.x / max(inside)
        # a pass below every open probe and a fail above them cannot be closer than the open range
        if max(lo_gap, hi_gap) <= eps or max(inside) / min(inside) >= 1 + tol:
            worst = max((p for p in opens if out.best.x < p.x < out.bound.x), key=lambda p: p.x)
            out.refused = (f"no answer: {_open_reason(worst, describe(worst.x))}; the SLO stays within the noise "
                           f"from {describe(min(inside))} to {describe(max(inside))}, a range too wide for an "
                           f"answer within --tol {tol:.1%}; {known()}({out.bound.x / out.best.x - 1:.1%} apart: "
                           f"--tol {math.ceil(100 * (out.bound.x / out.best.x - 1)) / 100:.2f} accepts that); {advice}")
            return out
        if lo_gap >= hi_gap:
            run(math.sqrt(out.best.x * min(inside)))
        else:
            run(math.sqrt(max(inside) * out.bound.x))
    if out.best.x >= out.bound.x:
        out.refused = (f"no answer: {describe(out.best.x)} meets every SLO but {describe(out.bound.x)}, a lower "
                       f"rate, does not: the SLO metric is not monotone in the rate at this noise level; "
                       f"raise --seeds or make runs longer")
    return out


def search_min_replicas(probe: Callable[[float], Probe], slos: list[SLO], *, start: int = 1, limit: int = 4096,
                        describe: Callable[[float], str] = lambda n: f"{int(n)} replicas") -> Search:
    """Fewest replicas meeting every SLO: double from ``start`` until one passes (or, when
    ``start`` passes, halve until one fails or 1 passes), then bisect on the integers between the
    failure and the pass. A pass is never the answer until the count below it is known to fail."""
    out = Search("min-replicas", slos)

    def step(n: int) -> Probe | None:
        try:
            p = probe(n)
        except ServesimError as exc:  # e.g. n replicas do not fit hardware.servers
            out.refused = f"no answer: {describe(n)} cannot be simulated: {exc}"
            return None
        out.path.append(p)
        if p.verdict == "open":
            out.refused = (f"no answer: {_open_reason(p, describe(n))}; raise --max-seeds or make runs longer")
            return None
        if p.verdict == "pass":
            out.best = p
        else:
            out.bound = p
        return p

    n = max(1, min(int(start), limit))
    while True:
        p = step(n)
        if p is None:
            return out
        if p.verdict == "pass":
            if out.bound is not None or n == 1:
                break
            n = max(1, n // 2)  # passed with no failure known below: look lower first
        elif out.best is not None or n >= limit:
            break
        else:
            n = min(n * 2, limit)
    if out.best is None:
        out.refused = (f"no answer: the SLOs are not met even with {describe(n)} "
                       f"(hardware.replicas allows at most {limit})")
        return out
    lo = int(out.bound.x) if out.bound is not None else 0
    hi = int(out.best.x)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        p = step(mid)
        if p is None:
            return out
        if p.verdict == "pass":
            hi = mid
        else:
            lo = mid
    return out


# ---------------------------------------------------------------------------------- the verbs
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
                  progress: Callable[[str], None] | None = None) -> Search:
    budget.check()
    preflight(sc, "max-rate", tol)
    base = request_rate(sc)  # None: sessions, closed loops, traces: the runs measure the request rate
    prober = Prober(lambda x: scale_rate(sc, x), slos, budget, executor, progress)

    def describe(x: float) -> str:  # the configured numbers, each in its unit: never sessions as req/s
        if base is not None:
            return f"{base * x:.4g} req/s (x{x:.4g})"
        return f"rate scale x{x:.4g} ({scaled_rates(sc, x)})"

    out = search_max_rate(prober, slos, tol=tol, describe=describe, base=base)
    out.scaled = None if base is not None else scaled_rates(sc)
    out.step_model = provenance(sc)
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
                      progress: Callable[[str], None] | None = None) -> Search:
    """``start``: the first count probed (e.g. a lower bound from one replica's capacity); the
    answer does not depend on it, only the number of probes does."""
    budget.check()
    preflight(sc, "min-replicas")
    if isinstance(start, bool) or not isinstance(start, int) or start < 1:
        raise CapacityError(f"start {start!r}: give a whole number of replicas >= 1")
    prober = Prober(lambda n: sc.override({"hardware.replicas": int(n)}, source="--find min-replicas"),
                    slos, budget, executor, progress)
    out = search_min_replicas(prober, slos, start=start)
    out.step_model = provenance(sc)
    return out
