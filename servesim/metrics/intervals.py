"""Confidence intervals over independent replications.

Why a t interval across replications (the method of independent replications), not a bootstrap:

* Requests of one run are not independent: queues carry congestion from one request to the next,
  so a bootstrap that resamples requests within a run treats a few long busy periods as thousands
  of independent observations and gives intervals far too narrow for P99 and P99.9.
* Replications (same scenario, seeds ``seed, seed+1, ...``) *are* independent and identically
  distributed, so each run's P99 is one iid draw of the estimator, and its mean over ``n`` runs has
  the Student-t interval ``mean +/- t_{n-1, (1+c)/2} * s / sqrt(n)``. Per-run percentiles average
  many requests, so their distribution is close to normal and the interval is near its nominal
  coverage from five or so replications (tests/test_intervals.py measures it).
* A bootstrap over replications would need many more of them: with 5-10 runs it under-covers
  (it cannot see beyond the observed spread); the t interval accounts for the small count.

What the interval covers: the expected value of the per-run estimate at this run length. A P99.9
from a 2,000-request run is biased upwards against the infinite-horizon P99.9 (it rests on two
samples); more requests per run, not more runs, shrink that bias. Docs: docs/sweeps.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

DEFAULT_CONFIDENCE = 0.95
METHOD = "t interval over independent replications"


@dataclass(frozen=True)
class Interval:
    """``estimate +/- half_width`` at ``confidence``; ``half_width`` is NaN with fewer than two
    finite values (no spread to measure)."""

    estimate: float
    half_width: float
    n: int
    confidence: float = DEFAULT_CONFIDENCE

    @property
    def lo(self) -> float:
        return self.estimate - self.half_width

    @property
    def hi(self) -> float:
        return self.estimate + self.half_width

    def to_dict(self) -> dict:
        f = lambda x: None if not math.isfinite(x) else float(x)  # noqa: E731 (JSON has no NaN)
        return {"estimate": f(self.estimate), "half_width": f(self.half_width), "lo": f(self.lo),
                "hi": f(self.hi), "n": self.n, "confidence": self.confidence}


def t_interval(values, confidence: float = DEFAULT_CONFIDENCE) -> Interval:
    """Student-t interval for the mean of iid ``values`` (NaNs, i.e. runs without the metric,
    left out and counted out of ``n``)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence {confidence!r} must be between 0 and 1")
    x = np.asarray(values, dtype=np.float64)
    x = x[np.isfinite(x)]
    n = len(x)
    if n == 0:
        return Interval(math.nan, math.nan, 0, confidence)
    mean = float(x.mean())
    if n == 1:
        return Interval(mean, math.nan, 1, confidence)
    sd = float(x.std(ddof=1))
    hw = float(stats.t.ppf(0.5 + confidence / 2.0, n - 1)) * sd / math.sqrt(n)
    return Interval(mean, hw, n, confidence)


def intervals(rows: list[dict[str, float]], confidence: float = DEFAULT_CONFIDENCE) -> dict[str, Interval]:
    """One interval per metric name over rows of flat metrics (one row per replication)."""
    names = list(dict.fromkeys(k for r in rows for k in r))
    return {k: t_interval([r.get(k, math.nan) for r in rows], confidence) for k in names}


def mean_summary(summaries: list[dict]) -> dict:
    """The summaries' shape with every number the mean over replications (counts included, as
    floats; a number the same in every run stays that number), strings and other leaves from the
    first; a leaf missing or None in some runs is the mean of the others (None if none has it).

    SLO verdicts (``slo.met.<target>.met``, ``slo.all_met`` of each class and stream) are not
    taken from any one run: each is judged again on the mean value beside it (``value <=
    target``), and ``met_share`` / ``all_met_share`` say in what share of the runs (of those with
    a verdict) it was met. ``intervals`` holds each value's confidence interval.

    A class (or stream, or class's blockage entry) that some runs do not have -- no request of a
    rare class arrived in that seed -- counts as absent = zero in those runs: its counts, rates
    and waiting seconds are 0 there, so they average over every run (they add up to the run's
    totals); its latencies and shares, which an absent class has none of, average over the runs
    that have them."""
    out = _mean(absent_groups_as_zero(summaries))
    _rejudge_slos(out, summaries)
    return out


GROUPED = ("by_class", "by_stream", "blockage")
ZERO_WHEN_ABSENT = ("requests", "throughput", "waiting_s", "count")


def absent_groups_as_zero(summaries: list) -> list:
    """The summaries with every group entry of ``GROUPED`` that a run lacks filled in as an
    empty group: the leaves under ``ZERO_WHEN_ABSENT`` keys 0, other numbers and verdicts None,
    names and lists as in a run that has the group."""
    if not all(isinstance(s, dict) for s in summaries):
        return summaries
    out = [dict(s) for s in summaries]
    for section in GROUPED:
        have = [s.get(section) for s in out]
        if not all(isinstance(h, dict) for h in have):
            continue
        names = list(dict.fromkeys(k for h in have for k in h))
        for s, h in zip(out, have):
            missing = [k for k in names if k not in h]
            if missing:
                template = {k: next(x[k] for x in have if k in x) for k in missing}
                s[section] = {**h, **{k: _empty_like(template[k], False) for k in missing}}
    return out


def _empty_like(x, zero: bool):
    if isinstance(x, dict):
        return {k: _empty_like(v, zero or k in ZERO_WHEN_ABSENT) for k, v in x.items()}
    if isinstance(x, bool) or x is None:
        return None
    if isinstance(x, (int, float)):
        return 0 if zero else None
    return x


def _mean(summaries: list):
    first = summaries[0]
    if isinstance(first, dict):
        keys = list(dict.fromkeys(k for s in summaries if isinstance(s, dict) for k in s))
        return {k: _mean([s[k] for s in summaries if isinstance(s, dict) and k in s]) for k in keys}
    nums = [s for s in summaries if isinstance(s, (int, float)) and not isinstance(s, bool)]
    if nums and len(nums) == len([s for s in summaries if s is not None]):
        if all(x == nums[0] for x in nums):  # a target, a limit: exactly itself, not a rounded mean
            return float(nums[0])
        return float(np.mean(nums))
    for s in summaries:
        if s is not None:
            return s
    return None


def _share(verdicts: list) -> float | None:
    """Share of True among the runs' verdicts that are not None (None if none is)."""
    v = [x for x in verdicts if isinstance(x, bool)]
    return float(np.mean(v)) if v else None


def _rejudge_slos(mean: dict, runs: list) -> None:
    """In place: every SLO block of ``mean`` (a dict with ``met`` and ``all_met``) judged on its
    mean values, with the share of ``runs`` that met each target (see :func:`mean_summary`)."""
    runs = [r for r in runs if isinstance(r, dict)]
    if isinstance(mean.get("met"), dict) and "all_met" in mean:
        verdicts = []
        for key, m in mean["met"].items():
            if not isinstance(m, dict) or "target" not in m:
                continue
            value, target = m.get("value"), m.get("target")
            m["met"] = None if value is None or target is None else bool(value <= target)
            m["met_share"] = _share([((r["met"].get(key) or {}).get("met") if isinstance(r.get("met"), dict) else None)
                                     for r in runs])
            verdicts.append(m["met"])
        if verdicts:
            mean["all_met"] = None if any(v is None for v in verdicts) else all(verdicts)
        mean["all_met_share"] = _share([r.get("all_met") for r in runs])
    for k, v in mean.items():
        if isinstance(v, dict):
            _rejudge_slos(v, [r[k] for r in runs if isinstance(r.get(k), dict)])
