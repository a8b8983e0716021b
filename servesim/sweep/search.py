"""The two capacity searches over probes: the largest rate scale, the fewest replicas.

The max-rate search multiplies the scenario's rate (servesim/sweep/ratescale.py) by 2 (or 1/2)
until it has a passing and a failing scale, then bisects on the log scale until the two are
within ``tol`` of each other::

    x1 pass ─► x2 pass ─► x4 fail ─► x2.83 pass ─► x3.36 fail ─► ... ─► bracket ─► crossing x*

The answer is the crossing (servesim/sweep/crossing.py): where the binding SLO's metric meets its
bound, interpolated between the probes around it, with an interval. The bracket (highest verified
pass, lowest verified failure) stays in the result as the verified part.

Zero load: when the scenario's own rate fails, the next probe is at ``ZERO_LOAD`` (1/1000) of it,
where requests almost never meet one another. If the SLOs fail there too, no rate meets them and
the search refuses at once, printing the value at zero load, instead of halving a dozen times.
(It refuses only when that probe's engine was busy less than ``ZERO_LOAD_BUSY`` of the time: a
rate still loaded at 1/1000 is not zero load, and the halving goes on.)

The min-replicas search is the same on integers over ``hardware.replicas``: doubling from
``start`` until a count passes, then bisection down to the fewest. An open probe there has no
neighbour to settle it (counts are exact), so it refuses at once.

Budget: a prober raises BudgetSpent before a probe the budget does not allow; the search then
stops and answers with its bracket when it has one (at the precision reached, said so), or
refuses with what it established.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from servesim.errors import ServesimError
from servesim.metrics.intervals import Interval
from servesim.sweep.crossing import Crossing, binding_crossing, bracket
from servesim.sweep.probe import BudgetSpent, Probe
from servesim.sweep.slo import SLO

ZERO_LOAD = 1e-3  # rate scale of the zero-load probe
ZERO_LOAD_BUSY = 0.01  # a probe busier than this is not "zero load"


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
    crossing: Crossing | None = None  # the answer as a number (max-rate)
    note: str | None = None  # answered less precisely than --tol asked, and why (budget, noise)
    zero_load: Probe | None = None  # the zero-load probe, when one ran
    step_model: dict | None = None  # the step-time model and pack the probes ran (servesim/perf/select.py)
    step_models: list[str] = field(default_factory=list)  # each step-time model as the runs described it
    runs: int = 0  # replications run
    reused: int = 0  # replications read from the probe store

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
                    "measured_req_per_s": p.measured_rate, "replications": p.n, "reused": p.reused,
                    "verdict": p.verdict,
                    "slos": {str(s): {**iv.to_dict(), "verdict": v} for s, iv, v in p.checks}}

        return {"find": self.kind, "slos": [str(s) for s in self.slos], "answered": self.answered,
                "refused": self.refused, "tol": self.tol, "base_rate_req_per_s": self.base_rate,
                "rate_source": self.rate_source, "scaled_at_x1": self.scaled,
                "step_model": self.step_model, "step_models": list(self.step_models),
                "answer": None if self.best is None or self.refused else probe(self.best),
                "crossing": None if self.crossing is None or self.refused else self.crossing.to_dict(self.base_rate),
                "first_failure": None if self.bound is None else probe(self.bound),
                "precision_note": self.note,
                "zero_load": None if self.zero_load is None else probe(self.zero_load),
                "runs": self.runs, "reused_runs": self.reused,
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


def _is_zero_load(p: Probe) -> bool:
    busy = p.aux.get("busy_fraction")
    return busy is not None and math.isfinite(busy.estimate) and busy.estimate <= ZERO_LOAD_BUSY


def _zero_load_refusal(z: Probe, where: str, consequence: str) -> str | None:
    """The refusal when the zero-load probe ``z`` failed every way that counts: measured (not
    "nothing completed") and truly unloaded (engine busy <= ZERO_LOAD_BUSY); None otherwise."""
    failed = [(s, iv) for s, iv, v in z.checks if v == "fail"]
    if z.verdict != "fail" or not _is_zero_load(z) or not all(math.isfinite(iv.estimate) for _, iv in failed):
        return None
    fails = "; ".join(f"{s} measured {_measured(iv)}" for s, iv in failed)
    return (f"no answer: the SLOs are missed even at zero load ({where}, the engine busy "
            f"{z.aux['busy_fraction'].estimate:.2%} of the time): {fails}; {consequence}")


def search_max_rate(probe: Callable[[float], Probe], slos: list[SLO], *, tol: float = 0.05, grow: float = 2.0,
                    max_doublings: int = 12, max_probes: int = 40,
                    describe: Callable[[float], str] = lambda x: f"rate x{x:.4g}",
                    base: float | None = None, start: float = 1.0, zero_load: bool = True,
                    extend: Callable[[Probe, int], Probe] | None = None) -> Search:
    """Largest passing rate scale: bracket by doubling/halving from ``start``, then bisect (log
    scale) until a verified pass and a verified failure are within ``tol`` (relative) of each
    other; the answer is the crossing between them.

    A probe left open (an SLO's interval straddles its bound at the budget) is neither: the
    frontier is near it. Bisection then works on the two gaps around the open probes (highest
    pass .. lowest open, highest open .. lowest failure), halving the wider until the answer fits
    in ``tol``. When the open probes alone span more than ``tol``, or both gaps are down to a
    quarter of ``tol`` and the answer still does not fit, the SLO is undecided over a range of
    rates wider than the precision asked: the search refuses.

    ``extend(probe, n)``: the probe with replications added up to ``n`` (``Prober.extend``); when
    given, the two probes the crossing interpolates between are measured on the same seeds
    before it is computed (``_pair_up``)."""
    from servesim.sweep.slo import CapacityError

    if not 0 < tol < 1:
        raise CapacityError(f"--tol {tol}: must be between 0 and 1 (a relative precision, e.g. 0.05)")
    if not (math.isfinite(start) and start > 0):
        raise CapacityError(f"--start {start!r}: must be a rate (or scale) > 0")
    out = Search("max-rate", slos, base_rate=base, tol=tol)
    opens: list[Probe] = []
    eps = (1 + tol) ** 0.25

    def run(x: float) -> Probe:
        p = probe(x)
        out.path.append(p)
        if p.verdict == "pass" and (out.best is None or x > out.best.x):
            out.best = p
        elif p.verdict == "fail" and (out.bound is None or x < out.bound.x):
            out.bound = p
        elif p.verdict == "open":
            opens.append(p)
        return p

    def known() -> str:
        k = []
        if out.best is not None:
            k.append(f"{describe(out.best.x)} meets every SLO")
        if out.bound is not None:
            k.append(f"{describe(out.bound.x)} does not")
        return "; ".join(k) + "; " if k else ""

    advice = "raise --max-seeds, loosen --tol, or make runs longer (stop.requests or stop.duration_s)"
    try:
        first = run(start)
        if first.verdict == "fail" and zero_load and start * ZERO_LOAD < start / grow:
            # a probe of its own: in the path, never the bracket (halving from `start` finds that)
            z = out.zero_load = probe(start * ZERO_LOAD)
            out.path.append(z)
            out.refused = _zero_load_refusal(z, describe(z.x), "no rate meets them (loosen the SLO, or change "
                                                               "the engine, model or GPU)")
            if out.refused:
                return _finish(out, extend)
        doublings = 0
        while out.best is None or out.bound is None:
            xs = [p.x for p in out.path if p is not out.zero_load]
            if doublings == max_doublings:
                if out.bound is None and not opens:
                    out.refused = (f"no answer: every SLO is met even at {describe(max(xs))} (the largest scale "
                                   f"tried); nothing binds in this range")
                elif out.best is None and not opens:
                    fails = "; ".join(f"{s} measured {_measured(iv)}" for s, iv, v in out.bound.checks
                                      if v == "fail")
                    out.refused = (f"no answer: the SLOs are not met even at {describe(min(xs))} "
                                   f"(the smallest scale tried): {fails}")
                else:
                    out.refused = (f"no answer: {_open_reason(opens[-1], describe(opens[-1].x))}, and no rate "
                                   f"{'above' if out.bound is None else 'below'} it was decided within "
                                   f"{grow:g}^{max_doublings}; {known()}{advice}")
                return _finish(out, extend)
            doublings += 1
            run(max(xs) * grow if out.bound is None else min(xs) / grow)
        while out.bound.x / out.best.x - 1 > tol:
            if out.best.x >= out.bound.x:
                break
            if len(out.path) >= max_probes:
                out.refused = f"no answer after {max_probes} probes; {known()}{advice}"
                return _finish(out, extend)
            inside = [p.x for p in opens if out.best.x < p.x < out.bound.x]
            if not inside:
                run(math.sqrt(out.best.x * out.bound.x))
                continue
            lo_gap, hi_gap = min(inside) / out.best.x, out.bound.x / max(inside)
            # a pass below every open probe and a fail above them cannot be closer than the open range
            if max(lo_gap, hi_gap) <= eps or max(inside) / min(inside) >= 1 + tol:
                # no pass and failure fit within --tol: the SLO is within the noise over the open
                # probes. The answer is still the crossing, interpolated through them, with an
                # interval as wide as that noise makes it (servesim/sweep/crossing.py)
                worst = max((p for p in opens if out.best.x < p.x < out.bound.x), key=lambda p: p.x)
                out.note = (f"{_open_reason(worst, describe(worst.x))}; the SLO stays within the noise from "
                            f"{describe(min(inside))} to {describe(max(inside))}: the verified pass and failure "
                            f"are {out.bound.x / out.best.x - 1:.1%} apart, wider than --tol {tol:.1%}, and the "
                            f"crossing is interpolated through the undecided probes (its interval says how sure "
                            f"it is; {advice} to narrow it)")
                return _finish(out, extend)
            if lo_gap >= hi_gap:
                run(math.sqrt(out.best.x * min(inside)))
            else:
                run(math.sqrt(max(inside) * out.bound.x))
    except BudgetSpent as why:
        _budget_stop(out, str(why), known(), describe)
        return _finish(out, extend)
    if out.best.x >= out.bound.x:
        out.refused = (f"no answer: {describe(out.best.x)} meets every SLO but {describe(out.bound.x)}, a lower "
                       f"rate, does not: the SLO metric is not monotone in the rate at this noise level; "
                       f"raise --seeds or make runs longer")
    return _finish(out, extend)


def _budget_stop(out: Search, why: str, known: str, describe) -> None:
    if out.best is not None and out.bound is not None and out.best.x < out.bound.x:
        gap = out.bound.x / out.best.x - 1
        out.note = (f"{why}: answered at {gap:.1%} precision instead of --tol {out.tol:.1%}"
                           if gap > out.tol else None)
        return
    out.refused = f"no answer: {why}; {known or 'nothing was decided yet; '}raise --budget or loosen --tol"


def _pair_up(out: Search, extend: Callable[[Probe, int], Probe]) -> None:
    """Measure the two probes each SLO's crossing interpolates between on the same seeds.

    A probe stops adding replications once its interval clears the bound. Near the crossing
    that happens early only when its first seeds were extreme: a probe decided on 6 seeds next to
    one that ran to 24 carries that luck in its mean (optional stopping) and shares only 6 of its
    seeds with the other, so their difference, the crossing's slope, has the noise of 18 unpaired
    runs. The crossing interval, computed as if the two were paired, was then far too narrow: on
    M/M/4 (tests/test_capacity_answers.py) 10 of 130 searches ended on such a pair and 8 of those
    10 intervals missed the exact crossing, against 11 of the 120 that ended on two probes of 24
    seeds each (benchmarks/RESULTS.md, "capacity answers against closed forms"). So the probe with fewer
    replications is topped up to the other's count, on the same seeds (common random numbers:
    the pair's difference is then the configuration's, not the seeds'), and the pair is chosen
    again, until it is measured alike. Each top-up replaces the probe in the path (its verdict
    is then the one its interval gives with every replication)."""
    for _ in range(4 * len(out.slos) + 4):
        for s in out.slos:
            pair = bracket(s, out.path)
            if pair is not None and pair[0].n != pair[1].n:
                short, n = min(pair, key=lambda p: p.n), max(p.n for p in pair)
                break
        else:
            return
        try:
            longer = extend(short, n)
        except BudgetSpent as why:
            out.note = ((out.note + "; ") if out.note else "") + (
                f"{why}: the crossing's two probes were not topped up to the same replications, and its "
                f"interval may be too narrow")
            return
        if longer is short:
            return
        for name in ("best", "bound"):
            if getattr(out, name) is short:
                setattr(out, name, longer)
        out.path = [longer if p is short else p for p in out.path]


def _finish(out: Search, extend: Callable[[Probe, int], Probe] | None = None) -> Search:
    if out.kind == "max-rate" and out.answered:
        if extend is not None:
            _pair_up(out, extend)
        out.crossing = binding_crossing(out.slos, out.path)
    out.runs = sum(p.n - p.reused for p in out.path)
    out.reused = sum(p.reused for p in out.path)
    return out


def search_min_replicas(probe: Callable[[float], Probe], slos: list[SLO], *, start: int = 1, limit: int = 4096,
                        describe: Callable[[float], str] = lambda n: f"{int(n)} replicas",
                        zero_load: Callable[[], Probe] | None = None) -> Search:
    """Fewest replicas meeting every SLO: double from ``start`` until one passes (or, when
    ``start`` passes, halve until one fails or 1 passes), then bisect on the integers between the
    failure and the pass. A pass is never the answer until the count below it is known to fail.

    ``zero_load``: a probe of one replica at almost no load, run when the first count fails: when
    even that misses the SLOs no count meets them, and the search refuses at once."""
    out = Search("min-replicas", slos)

    def step(n: int) -> Probe | None:
        try:
            p = probe(n)
        except BudgetSpent as why:
            if out.best is not None and out.bound is not None:
                out.note = (f"{why}: {int(out.best.x)} replicas meet every SLO and {int(out.bound.x)} do "
                                   f"not; the fewest lies between them")
                out.refused = f"no answer: {out.note}; raise --budget"
            else:
                out.refused = f"no answer: {why}; raise --budget"
            return None
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
            return _finish(out)
        if p.verdict == "fail" and zero_load is not None and out.zero_load is None:
            try:
                z = out.zero_load = zero_load()
            except BudgetSpent as why:
                out.refused = f"no answer: {why}; raise --budget"
                return _finish(out)
            out.refused = _zero_load_refusal(z, f"one replica at {ZERO_LOAD:g} of the rate",
                                             "no replica count meets them")
            if out.refused:
                return _finish(out)
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
        return _finish(out)
    lo = int(out.bound.x) if out.bound is not None else 0
    hi = int(out.best.x)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        p = step(mid)
        if p is None:
            return _finish(out)
        if p.verdict == "pass":
            hi = mid
        else:
            lo = mid
    return _finish(out)
