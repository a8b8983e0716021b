"""The numbers behind the report charts (servesim/report/curves.py): tail grid, curves that hit
the summary's percentiles exactly, exact coarsening of time bins, wait shares, Pareto fronts,
t intervals."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.metrics.sketch import LogSketch
from servesim.metrics.stats import weighted_percentiles
from servesim.report import curves


def test_nines_places_the_marked_percentiles_a_decade_apart():
    assert curves.nines(0.9) == pytest.approx(1.0)
    assert curves.nines(0.99) == pytest.approx(2.0)
    assert curves.nines(0.999) == pytest.approx(3.0)
    assert curves.nines(0.5) == pytest.approx(math.log10(2))


@pytest.mark.parametrize("n", [1, 2, 10, 300, 1000, 123_456])
def test_grid_covers_the_sample_and_every_mark(n):
    g = curves.nines_grid(n)
    assert np.all(np.diff(g) > 0)
    if n >= 2:
        assert g[0] == 0.0 and g[-1] == pytest.approx(max(math.log10(n), 3.0))
        for pct in curves.MARKS.values():  # every marked percentile is a grid point
            at = float(curves.nines(pct / 100))
            assert np.isclose(g, at).any()
            assert curves.reached(n, at) == (n * (1 - pct / 100) >= 1 - 1e-9)


def test_sample_curve_hits_numpy_percentiles_at_the_marks():
    rng = np.random.default_rng(5)
    x = rng.lognormal(0, 1.2, 5000)
    x[::97] = np.nan
    g, v = curves.sample_curve(x)
    clean = x[~np.isnan(x)]
    for pct in curves.MARKS.values():
        i = int(np.argmin(np.abs(g - curves.nines(pct / 100))))
        assert v[i] == np.percentile(clean, pct)  # exactly: the summary's definition
    assert np.all(np.diff(v) >= 0)
    assert v[0] == clean.min()


def test_sketch_curve_within_relative_error_of_the_weighted_sample():
    rng = np.random.default_rng(2)
    vals = rng.gamma(2.0, 0.01, 4000)
    w = rng.integers(1, 50, 4000)
    sk = LogSketch(0.01).add(vals, w)
    g, v = curves.sketch_curve(sk)
    q = 100 * (1 - 10.0 ** (-g))
    # the sketch reports the lower rank value; the exact curve interpolates: compare with the
    # bracketing order statistics of the weighted sample
    order = np.argsort(vals)
    sv, cw = vals[order], np.cumsum(w[order])
    n = cw[-1]
    for qi, vi in zip(q, v):
        rank = qi / 100 * (n - 1)
        lo = sv[np.searchsorted(cw, math.floor(rank), side="right")]
        hi = sv[np.searchsorted(cw, min(math.ceil(rank), n - 1), side="right")]
        assert lo * (1 - 0.0101) <= vi <= hi * (1 + 0.0101)
    exact = weighted_percentiles(vals, w, [99.0])[0]
    i = int(np.argmin(np.abs(g - 2.0)))
    assert abs(v[i] / exact - 1) < 0.05


def _bins(n=1000, seed=0):
    rng = np.random.default_rng(seed)
    t = np.arange(n) * 0.5
    return pd.DataFrame({"t_s": t, "kv_blocks_mean": rng.uniform(0, 100, n), "kv_blocks_peak": rng.uniform(100, 200, n),
                         "waiting_mean": np.where(rng.random(n) < 0.1, np.nan, rng.uniform(0, 5, n))})


@pytest.mark.parametrize("n,max_points", [(1000, 300), (1001, 100), (10, 100), (7, 3)])
def test_coarsen_is_exact_for_time_weighted_means(n, max_points):
    ts = _bins(n)
    end = float(ts["t_s"].iloc[-1]) + 0.2  # the last bin covers 0.2 s of its 0.5
    out = curves.coarsen(ts, end, max_points)
    assert len(out) <= max(max_points, 1) or len(ts) <= max_points
    if len(ts) <= max_points:
        assert out.equals(ts)
        return
    k = int(math.ceil(n / max_points))
    width = np.minimum(0.5, end - ts["t_s"].to_numpy())
    for j in range(len(out)):
        sl = slice(j * k, min((j + 1) * k, n))
        w = width[sl]
        m = ts["kv_blocks_mean"].to_numpy()[sl]
        assert out["kv_blocks_mean"].iloc[j] == pytest.approx(np.dot(m, w) / w.sum(), rel=1e-12)
        assert out["kv_blocks_peak"].iloc[j] == ts["kv_blocks_peak"].to_numpy()[sl].max()
    # integral preserved: sum of mean x width over the run
    total = np.dot(ts["kv_blocks_mean"], width)
    new_w = np.array([width[j * k: (j + 1) * k].sum() for j in range(len(out))])
    assert np.dot(out["kv_blocks_mean"], new_w) == pytest.approx(total, rel=1e-12)


def _brute_front(x, y, xb, yb):
    sx = 1 if xb == "min" else -1
    sy = 1 if yb == "min" else -1
    a, b = sx * np.asarray(x), sy * np.asarray(y)
    out = []
    for i in range(len(a)):
        if np.isnan(a[i]) or np.isnan(b[i]):
            out.append(False)
            continue
        dom = any((a[j] <= a[i] and b[j] <= b[i] and (a[j] < a[i] or b[j] < b[i]))
                  for j in range(len(a)) if j != i and not (np.isnan(a[j]) or np.isnan(b[j])))
        out.append(not dom)
    return np.array(out)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=1, max_size=25),
       st.sampled_from(["min", "max"]), st.sampled_from(["min", "max"]), st.integers(0, 3))
def test_pareto_front_matches_the_definition(pts, xb, yb, nans):
    x = np.array([p[0] for p in pts], dtype=float)
    y = np.array([p[1] for p in pts], dtype=float)
    x[: min(nans, len(x) - 1)] = np.nan
    front = curves.pareto_front(x, y, xb, yb)
    assert front.tolist() == _brute_front(x, y, xb, yb).tolist()
    assert front.any() == bool((~np.isnan(x) & ~np.isnan(y)).any())


def test_t_interval_is_the_student_t_interval():
    from scipy import stats

    x = np.array([1.0, 1.4, 0.8, 1.1, np.nan])
    m, lo, hi, n = curves.t_interval(x)
    v = x[:4]
    half = stats.t.ppf(0.975, 3) * v.std(ddof=1) / 2
    assert (m, n) == (pytest.approx(v.mean()), 4)
    assert lo == pytest.approx(v.mean() - half) and hi == pytest.approx(v.mean() + half)
    assert curves.t_interval(np.array([2.5])) == (2.5, 2.5, 2.5, 1)
    m, lo, hi, n = curves.t_interval(np.array([np.nan]))
    assert n == 0 and math.isnan(m)
