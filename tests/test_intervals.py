"""Confidence intervals over replications: the formula, and its coverage measured, not assumed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from servesim.metrics.intervals import intervals, mean_summary, t_interval
from servesim.simulate import simulate
from tests.conftest import scenario


def test_t_interval_formula():
    x = [1.0, 2.0, 3.0, 4.0]
    iv = t_interval(x, 0.95)
    # mean 2.5, s = 1.2910, t_{3, 0.975} = 3.18245
    assert iv.estimate == pytest.approx(2.5)
    assert iv.half_width == pytest.approx(3.182446305 * 1.290994449 / 2.0, rel=1e-8)
    assert (iv.lo, iv.hi, iv.n) == (pytest.approx(2.5 - iv.half_width), pytest.approx(2.5 + iv.half_width), 4)


def test_t_interval_edges():
    assert math.isnan(t_interval([3.0]).half_width) and t_interval([3.0]).estimate == 3.0
    assert t_interval([]).n == 0 and math.isnan(t_interval([]).estimate)
    iv = t_interval([1.0, float("nan"), 3.0])  # a run without the metric is left out, and counted out
    assert iv.n == 2 and iv.estimate == 2.0
    assert t_interval([2.0, 2.0, 2.0]).half_width == 0.0
    with pytest.raises(ValueError):
        t_interval([1, 2], 1.5)


def test_intervals_per_metric_and_json_safe():
    rows = [{"a": 1.0, "b": float("nan")}, {"a": 3.0, "b": 2.0}]
    ivs = intervals(rows)
    assert ivs["a"].estimate == 2.0 and ivs["b"].n == 1
    assert ivs["b"].to_dict()["half_width"] is None  # JSON has no NaN


def test_mean_summary_shape():
    s = mean_summary([{"x": 1, "y": {"z": 2.0, "w": None}, "name": "a"},
                      {"x": 3, "y": {"z": 4.0, "w": 5.0}, "name": "a", "extra": 1}])
    assert s == {"x": 2.0, "y": {"z": 3.0, "w": 5.0}, "name": "a", "extra": 1.0}


def _coverage(sample_run, truth: float, reps: int, n: int, rng_seed: int) -> float:
    rng = np.random.default_rng(rng_seed)
    hits = 0
    for _ in range(reps):
        iv = t_interval([sample_run(rng) for _ in range(n)], 0.95)
        hits += iv.lo <= truth <= iv.hi
    return hits / reps


def test_coverage_of_p99_over_replications_fast():
    """Each 'run' is the P99 of 2,000 heavy-tailed (lognormal) latencies; the target is the mean
    of that estimator (what the interval claims to cover), from 5,000 runs. Five replications per
    interval, 400 intervals: coverage within sampling error of 95 % (sd 1.1 %)."""
    run = lambda rng: float(np.percentile(rng.lognormal(0.0, 1.0, 2000), 99))  # noqa: E731
    truth = float(np.mean([run(np.random.default_rng(10_000 + i)) for i in range(5_000)]))
    cov = _coverage(run, truth, 400, 5, 1)
    assert 0.92 <= cov <= 0.98, cov


@pytest.mark.slow
def test_coverage_of_simulated_ttft_p99():
    """The same with the simulator: P99 TTFT of a loaded replica (busy periods make requests of a
    run dependent: the reason replications, not requests, are resampled). The target is the mean
    over 300 seeds; 100 intervals of 5 replications each from other seeds."""
    sc = scenario(stop={"requests": 1500, "warmup_requests": 100}, engine={"max_num_seqs": 2},
                  workload={"arrival": {"process": "poisson", "rate": 60.0}})
    vals = np.array([simulate(sc, seed=s).summary["latency_s"]["ttft"]["p99"] for s in range(800)])
    truth = vals[:300].mean()
    rest = vals[300:].reshape(100, 5)
    hits = sum(t_interval(r).lo <= truth <= t_interval(r).hi for r in rest)
    # 100 intervals at 95 %: binomial sd 2.2 %; the target itself has sampling error too
    assert 88 <= hits <= 100, hits
