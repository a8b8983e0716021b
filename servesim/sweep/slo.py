"""Service-level objectives as a capacity search judges them: ``metric <= bound`` (or ``>=``),
decided on a confidence interval over replications, never on one run's value.

An SLO ``ttft_p99 <= 0.8``

    passes      when the whole interval is below 0.8,
    fails       when the whole interval is above it (or the metric has no value: nothing measured),
    is open     when the interval straddles 0.8: the probe adds replications until it is decided.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

from servesim.errors import ServesimError
from servesim.metrics.flat import check_metric_name
from servesim.metrics.intervals import Interval
from servesim.scenario import Scenario

Verdict = Literal["pass", "fail", "open"]


class CapacityError(ServesimError):
    """A capacity question that cannot be asked as given (bad SLO, unsupported search)."""


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

    def met_by(self, value: float) -> bool:
        """Whether a single value meets the objective (a point estimate, no interval)."""
        return value <= self.bound if self.upper else value >= self.bound

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
    slo = SLO(name, bound, upper=op != ">=")
    why = bound_problem(slo)
    if why:
        raise CapacityError(f"--slo {text!r}: {why}")
    return slo


FRACTION_METRICS = ("slo_attainment", "kv_peak_usage", "kv_mean_usage", "busy_fraction", "prefix_hit_rate")


def is_fraction(metric: str) -> bool:
    """A metric that is a share, within [0, 1] in every run."""
    base = metric.split("@", 1)[0]
    return base in FRACTION_METRICS or base.startswith("wait_share_")


def bound_problem(slo: SLO) -> str | None:
    """Why no run can decide ``slo`` (None when one can): every metric is >= 0, so a bound of 0 or
    less is never met as an upper bound and always met as a lower one; a share is at most 1, so a
    bound above 1 is the same. A search on such a bound ran 26 runs before saying "not met"."""
    if slo.bound <= 0:
        return (f"the bound {slo.bound:g} is {'never' if slo.upper else 'always'} met ({slo.metric} is never "
                f"negative); allowed: a bound above 0")
    if is_fraction(slo.metric) and slo.bound > 1:
        return (f"the bound {slo.bound:g} is {'always' if slo.upper else 'never'} met ({slo.metric} is a share, "
                f"0 to 1); allowed: a bound up to 1, e.g. {slo.metric.split('@')[0]}>=0.99")
    return None


def check_slos(sc: Scenario, slos: list[SLO]) -> None:
    """Before any probe runs: every bound decidable, every ``METRIC@LABEL`` naming a class this
    scenario reports (an unknown label read NaN in every probe, and the search blamed the
    warm-up for it)."""
    labels = sc.workload.class_labels()
    for s in slos:
        why = bound_problem(s)
        if why:
            raise CapacityError(f"SLO {s}: {why}")
        if "@" in s.metric:
            label = s.metric.split("@", 1)[1]
            if label not in labels:
                raise CapacityError(f"SLO {s}: {label!r} is not a class of this scenario (its classes: "
                                    f"{', '.join(labels)})")


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


def slo_lines(sc: Scenario) -> dict:
    """What a sweep's charts draw as SLO lines, kept with its rows (``slos.json``): the targets
    the base scenario's streams state, by metric name as the rows hold them (``ttft_p99@chat``,
    and ``ttft_p99`` too when one stream states it), and the scenario's per-request thresholds
    (``slo.ttft_s``, ``slo.tpot_s``: what goodput and attainment count)."""
    targets: dict[str, float] = {}
    for s in scenario_slos(sc):
        targets[s.metric] = s.bound
    specs = [sp for sp in sc.workload.stream_specs() if sp.slo is not None]
    if len(specs) == 1:
        for key, v in specs[0].slo.targets().items():
            targets.setdefault(key, float(v))
    return {"targets": targets, "per_request": {"ttft": float(sc.slo.ttft_s), "tpot": float(sc.slo.tpot_s)}}
