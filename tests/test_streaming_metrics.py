"""Bounded-memory metrics: spilled weighted samples keep exact percentiles; sketches merge."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.metrics.sample import WeightedSample
from servesim.metrics.sketch import LogSketch
from servesim.metrics.stats import describe_weighted


@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(st.floats(0.0, 5.0, allow_nan=False), min_size=1, max_size=400),
    seed=st.integers(0, 1000),
    chunk=st.integers(1, 50),
)
def test_spilled_sample_gives_the_exact_in_memory_answer(values, seed, chunk):
    rng = np.random.default_rng(seed)
    v = np.array(values)
    w = rng.integers(0, 20, len(v))
    w[0] = max(w[0], 1)
    spilled = WeightedSample(mem_pairs=chunk)  # tiny limit: nearly every add spills to disk
    for i in range(0, len(v), 7):
        spilled.add(v[i : i + 7], w[i : i + 7])
    assert spilled.spilled or len(v) < chunk
    got, want = spilled.describe(), describe_weighted(v, w)
    assert got["count"] == want["count"]
    for k in ("p50", "p90", "p95", "p99", "p999", "max"):
        assert got[k] == want[k], k  # exact, not approximately
    assert np.isclose(got["mean"], want["mean"], rtol=1e-12)
    spilled.close()


def test_weighted_percentiles_equal_numpy_on_the_repeated_sample():
    rng = np.random.default_rng(1)
    v, w = rng.lognormal(0, 1, 300), rng.integers(1, 9, 300)
    got = describe_weighted(v, w)
    rep = np.repeat(v, w)
    assert got["p99"] == np.percentile(rep, 99) and got["p50"] == np.percentile(rep, 50)


def test_sketch_quantiles_within_relative_error_and_merge_like_pooling():
    rng = np.random.default_rng(7)
    a, b = rng.lognormal(-3, 1.0, 20000), rng.lognormal(-2, 0.5, 30000)
    sa, sb = LogSketch(0.01).add(a), LogSketch(0.01).add(b)
    pooled = np.concatenate([a, b])
    merged = LogSketch.from_dict(sa.to_dict()).merge(sb)
    direct = LogSketch(0.01).add(pooled)
    assert merged.count == direct.count == len(pooled)
    assert (merged.counts == direct.counts).all() and merged.offset == direct.offset
    for q in (0.5, 0.9, 0.99, 0.999):
        exact = np.quantile(pooled, q, method="lower")
        assert abs(merged.quantile(q) - exact) <= 0.0101 * exact


def test_sketch_counts_zeros_apart():
    s = LogSketch(0.02).add(np.array([0.0, 0.0, 0.0, 1.0]))
    assert s.zeros == 3 and s.quantile(0.5) == 0.0
    assert abs(s.quantile(1.0) - 1.0) <= 0.02 + 1e-12  # 1.0 sits on a bucket edge: error exactly rel_err


def test_time_series_bins_coarsen_exactly_when_a_run_outgrows_them():
    from servesim.metrics.collect import BinnedSeries

    rng = np.random.default_rng(3)
    ns = len(BinnedSeries.SIGNALS)
    ends = np.cumsum(rng.uniform(0.01, 0.7, 4000))
    starts = np.concatenate([[0.0], ends[:-1]]) + rng.uniform(0, 0.005, 4000)  # small idle gaps
    vals = rng.integers(0, 50, (ns, 4000)).astype(float)
    fine, coarse = BinnedSeries(1.0), BinnedSeries(1.0, max_bins=64)
    for i in range(0, 4000, 100):
        fine.add(starts[i : i + 100], ends[i : i + 100], vals[:, i : i + 100])
        coarse.add(starts[i : i + 100], ends[i : i + 100], vals[:, i : i + 100])
    factor = int(round(coarse.bin_s / fine.bin_s))
    assert factor > 1 and coarse.nbins() <= 64
    nb = fine.nbins()
    pad = (-nb) % factor
    f_int = np.concatenate([fine.integral[:, :nb], np.zeros((ns, pad))], axis=1)
    f_peak = np.concatenate([fine.peak[:, :nb], np.zeros((ns, pad))], axis=1)
    m = (nb + pad) // factor
    np.testing.assert_allclose(coarse.integral[:, :m], f_int.reshape(ns, m, factor).sum(axis=2), rtol=1e-9)
    np.testing.assert_array_equal(coarse.peak[:, :m], f_peak.reshape(ns, m, factor).max(axis=2))
    np.testing.assert_allclose(coarse.integral.sum(), (vals * (ends - starts)).sum(), rtol=1e-9)
