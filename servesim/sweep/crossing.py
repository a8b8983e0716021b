"""Where an SLO metric crosses its bound: the capacity as a number with an interval, not a bracket.

A max-rate search ends with a verified pass at scale ``x1`` and a verified failure at ``x2`` a
few percent above. Between them the metric (a mean or percentile over replications, each probe an
interval) moves from below the bound to above it. Linear interpolation of the metric in
``log x`` between the two probes nearest the bound gives the crossing

    log x* = log x1 + f (log x2 - log x1),        f = (b - m1) / (m2 - m1)

and its spread comes from the two probes' standard errors (se = half-width / t quantile). The
interpolated metric at x* is ``(1 - f) m1 + f m2``; the probes share their seeds (common random
numbers), so their errors are positively correlated and do not average out: its standard error is
taken at the perfectly correlated bound ``(1 - f) se1 + f se2`` (independent errors would give
less), and divided by the local slope ``(m2 - m1) / (log x2 - log x1)`` it is the standard error
of ``log x*``. Over a bracket of a few percent the curve is close to linear in log x, so
interpolation adds little beside the noise.

With several SLOs the binding one is the one crossing first. ``p_next`` is the probability that
the first failing probe's true metric still meets the bound (Student t on its interval): a
planner reads it as "how sure is it that one step up fails".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats

from servesim.metrics.intervals import Interval
from servesim.sweep.slo import SLO


@dataclass(frozen=True)
class Crossing:
    slo: SLO  # the binding SLO (crosses first)
    estimate: float  # x* (rate scale or replicas as a real number)
    lo: float
    hi: float
    confidence: float
    p_next_meets: float | None  # chance the first failing probe in fact meets this SLO

    def to_dict(self, scale: float | None = None) -> dict:
        k = scale if scale is not None else 1.0
        return {"slo": str(self.slo), "x": self.estimate, "x_lo": self.lo, "x_hi": self.hi,
                "confidence": self.confidence,
                "rate_req_per_s": None if scale is None else self.estimate * k,
                "rate_lo": None if scale is None else self.lo * k, "rate_hi": None if scale is None else self.hi * k,
                "p_next_step_meets": self.p_next_meets}


def _se(iv: Interval) -> float:
    if iv.n < 2 or not math.isfinite(iv.half_width):
        return math.nan
    t = float(stats.t.ppf(0.5 + iv.confidence / 2.0, iv.n - 1))
    return iv.half_width / t


def p_meets(slo: SLO, iv: Interval) -> float | None:
    """P(true metric meets the bound) from a probe's interval (Student t around the estimate)."""
    se = _se(iv)
    if not math.isfinite(iv.estimate) or not math.isfinite(se):
        return None
    if se == 0:
        return 1.0 if slo.met_by(iv.estimate) else 0.0
    z = (slo.bound - iv.estimate) / se if slo.upper else (iv.estimate - slo.bound) / se
    return float(stats.t.cdf(z, iv.n - 1))


def _pair(slo: SLO, points: list) -> tuple | None:
    """The two points the crossing interpolates between: the largest x whose estimate meets the
    bound and the smallest x above it whose estimate does not (None: no such pair). ``points``
    are tuples whose first two items are ``x`` and its interval."""
    pts = sorted((p for p in points if p[0] > 0 and math.isfinite(p[1].estimate)), key=lambda p: p[0])
    below = [p for p in pts if slo.met_by(p[1].estimate)]
    if not below:
        return None
    lo = max(below, key=lambda p: p[0])
    above = [p for p in pts if p[0] > lo[0] and not slo.met_by(p[1].estimate)]
    if not above:
        return None
    return lo, min(above, key=lambda p: p[0])


def bracket(slo: SLO, probes: list) -> tuple | None:
    """The two probes (objects with ``x`` and ``interval(slo)``) the crossing of ``slo`` uses."""
    pair = _pair(slo, [(p.x, p.interval(slo), p) for p in probes if p.interval(slo) is not None])
    return None if pair is None else (pair[0][2], pair[1][2])


def crossing_of(slo: SLO, points: list[tuple[float, Interval]]) -> Crossing | None:
    """The crossing of one SLO from probes ``(x, interval)``: interpolate between the largest x
    whose estimate meets the bound and the smallest x above it whose estimate does not."""
    pair = _pair(slo, points)
    if pair is None:
        return None
    (x1, iv1), (x2, iv2) = pair
    m1, m2, b = iv1.estimate, iv2.estimate, slo.bound
    if m2 == m1:
        return None
    l1, l2 = math.log(x1), math.log(x2)
    f = (b - m1) / (m2 - m1)
    se1, se2 = _se(iv1), _se(iv2)
    conf = iv1.confidence
    est = math.exp(l1 + f * (l2 - l1))
    if math.isfinite(se1) and math.isfinite(se2):
        w = min(max(f, 0.0), 1.0)
        se_level = (1 - w) * se1 + w * se2  # perfectly correlated errors: the wider bound
        slope = abs(m2 - m1) / (l2 - l1)
        n = min(iv1.n, iv2.n)
        hw = float(stats.t.ppf(0.5 + conf / 2.0, max(n - 1, 1))) * se_level / slope
        lo, hi = est * math.exp(-hw), est * math.exp(hw)
    else:
        lo, hi = math.nan, math.nan
    return Crossing(slo, est, lo, hi, conf, p_meets(slo, iv2))


def binding_crossing(slos: list[SLO], probes: list) -> Crossing | None:
    """The first SLO to cross (smallest x*), from a search's probes (objects with ``x`` and
    ``interval(slo)``)."""
    found = []
    for s in slos:
        pts = [(p.x, p.interval(s)) for p in probes if p.interval(s) is not None]
        c = crossing_of(s, pts)
        if c is not None:
            found.append(c)
    return min(found, key=lambda c: c.estimate) if found else None
