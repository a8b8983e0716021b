"""Where an SLO metric crosses its bound: the capacity as a number with an interval, not a bracket.

A max-rate search ends with a verified pass at scale ``x1`` and a verified failure at ``x2`` a
few percent above. Between them the metric (a mean or percentile over replications, each probe an
interval) moves from below the bound to above it. Linear interpolation of the metric in
``log x`` between the two probes nearest the bound gives the crossing

    log x* = log x1 + f (log x2 - log x1),        f = (b - m1) / (m2 - m1)

and its spread is the spread of the interpolated metric ``(1 - f) m1 + f m2`` at x*, divided by
the local slope ``(m2 - m1) / (log x2 - log x1)``. The probes share their seeds (common random
numbers): a search measures the two on the same seeds (servesim/sweep/search.py, ``_pair_up``),
and then each seed's own interpolated value ``(1 - f) a_i + f b_i`` gives the level's standard
error with the correlation as it is, and bootstrap-t quantiles of it carry the skew of the
metric across seeds (``_paired``). Without per-seed values (or on different seeds) the standard
error is taken at the perfectly correlated bound ``(1 - f) se1 + f se2`` (se = half-width / t
quantile; independent errors would give less) with t quantiles. Over a bracket of a few percent
the curve is close to linear in log x, so interpolation adds little beside the noise.

With several SLOs the binding one is the one crossing first. ``p_next`` is the probability that
the first failing probe's true metric still meets the bound (Student t on its interval): a
planner reads it as "how sure is it that one step up fails".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
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


def crossing_of(slo: SLO, points: list[tuple]) -> Crossing | None:
    """The crossing of one SLO from probes ``(x, interval)`` or ``(x, interval, values)``
    (``values``: each replication's metric, seeds in order): interpolate between the largest x
    whose estimate meets the bound and the smallest x above it whose estimate does not. When
    both have ``values`` on the same seeds the interval is the paired one (``_paired``)."""
    pair = _pair(slo, points)
    if pair is None:
        return None
    (x1, iv1, *v1), (x2, iv2, *v2) = pair
    m1, m2, b = iv1.estimate, iv2.estimate, slo.bound
    if m2 == m1:
        return None
    l1, l2 = math.log(x1), math.log(x2)
    f = (b - m1) / (m2 - m1)
    conf = iv1.confidence
    est = math.exp(l1 + f * (l2 - l1))
    slope = (m2 - m1) / (l2 - l1)
    paired = _paired(v1[0] if v1 else None, v2[0] if v2 else None, f, conf)
    if paired is not None:
        se, q_lo, q_hi = paired
        ends = est * math.exp(q_lo * se / slope), est * math.exp(q_hi * se / slope)
        return Crossing(slo, est, min(ends), max(ends), conf, p_meets(slo, iv2))
    se1, se2 = _se(iv1), _se(iv2)
    if math.isfinite(se1) and math.isfinite(se2):
        w = min(max(f, 0.0), 1.0)
        se_level = (1 - w) * se1 + w * se2  # perfectly correlated errors: the wider bound
        n = min(iv1.n, iv2.n)
        hw = float(stats.t.ppf(0.5 + conf / 2.0, max(n - 1, 1))) * se_level / abs(slope)
        lo, hi = est * math.exp(-hw), est * math.exp(hw)
    else:
        lo, hi = math.nan, math.nan
    return Crossing(slo, est, lo, hi, conf, p_meets(slo, iv2))


BOOT_MIN_N = 10  # fewer replications: too few distinct resamples for a bootstrap; t quantiles
BOOT_RESAMPLES = 4000


def _paired(a, b, f: float, conf: float) -> tuple[float, float, float] | None:
    """The interpolated level's standard error and the quantiles of its studentised error, from
    the two probes' values on the same seeds; None when they are not on the same seeds.

    Seed by seed, ``g_i = (1 - f) a_i + f b_i`` is one replication's metric interpolated at the
    crossing; their mean is the bound (by the choice of f) and their spread is the level's,
    with the probes' correlation as it is (no bound assumed). The quantiles are the bootstrap-t
    ones (resample the g_i, studentise each resample's mean): a run's mean wait or tail is
    right-skewed across seeds, and a sample whose mean came out low has a low spread too, so the
    symmetric t quantiles cover less than their level on that side. On M/M/4 (queue_mean,
    4,000-request runs, skew 0.5-0.6 across seeds) the t interval over 24 replications covered
    the exact mean in 118 of 129 searches, 8 of the 11 misses with the mean low; with bootstrap-t
    quantiles the crossing interval covered 113 of 120 against 109 (benchmarks/RESULTS.md). The
    resampling is seeded: the same probes give the same interval."""
    if a is None or b is None or len(a) != len(b):
        return None
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    keep = np.isfinite(x) & np.isfinite(y)
    n = int(keep.sum())
    if n < 2:
        return None
    g = (1.0 - f) * x[keep] + f * y[keep]
    se = float(g.std(ddof=1)) / math.sqrt(n)
    t = float(stats.t.ppf(0.5 + conf / 2.0, n - 1))
    if n < BOOT_MIN_N or se == 0:
        return se, -t, t
    rs = g[np.random.default_rng(0).integers(0, n, (BOOT_RESAMPLES, n))]
    sd = rs.std(axis=1, ddof=1)
    ok = sd > 0
    z = (rs.mean(axis=1)[ok] - g.mean()) / (sd[ok] / math.sqrt(n))
    lo_q, hi_q = np.quantile(z, [0.5 - conf / 2.0, 0.5 + conf / 2.0])
    # the true level is the mean minus the studentised error: its upper end is mean - lo_q se
    return se, float(lo_q), float(hi_q)


def binding_crossing(slos: list[SLO], probes: list) -> Crossing | None:
    """The first SLO to cross (smallest x*), from a search's probes (objects with ``x`` and
    ``interval(slo)``)."""
    found = []
    for s in slos:
        pts = [(p.x, p.interval(s), _values(p, s.metric)) for p in probes if p.interval(s) is not None]
        c = crossing_of(s, pts)
        if c is not None:
            found.append(c)
    return min(found, key=lambda c: c.estimate) if found else None


def _values(p, metric: str) -> list[float] | None:
    """A probe's replications of ``metric`` in seed order (None: the probe does not keep them)."""
    rows = getattr(p, "rows", None)
    if not rows or len(rows) != getattr(p, "n", -1):
        return None
    return [float(r.get(metric, math.nan)) for r in rows]
