"""ServeGen arrivals from per-client window fits: counts, burstiness, slicing, determinism."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from servesim.errors import TraceError
from servesim.workload.servegen import read_client_fits, servegen_arrivals, servegen_rate
from servesim.config.traces import ServeGenArrivalConfig

FIX = Path(__file__).parent / "fixtures" / "traces"


def cfg(**kw) -> ServeGenArrivalConfig:
    base = dict(process="servegen", dir="servegen")
    base.update(kw)
    return ServeGenArrivalConfig(**base)


def test_read_client_fits():
    f = read_client_fits(FIX / "servegen" / "chunk-1-trace.csv")
    assert f.client == "1" and f.window_s == 600.0
    np.testing.assert_array_equal(f.pattern, [0, 1, 1, 2])
    np.testing.assert_allclose(f.rate, [0, 1, 5, 0.5])


def test_window_counts_are_exact_for_integral_rates():
    a = servegen_arrivals(cfg(), FIX, np.random.default_rng(0), duration_s=2400)
    counts = np.histogram(a, bins=[0, 600, 1200, 1800, 2400])[0]
    # rates x 600 s: client 1 (0, 600, 3000, 300) + client 2 (1200, 0, 600, 0)
    np.testing.assert_array_equal(counts, [1200, 600, 3600, 300])
    assert np.all(np.diff(a) >= 0) and a[0] >= 0
    np.testing.assert_allclose(servegen_rate(cfg(), FIX)[:, 1], [2, 1, 6, 0.5])


def test_slice_start_rate_scale_and_n_max_prefix():
    c = cfg(clients=[1], start_s=900, rate_scale=0.5)
    a = servegen_arrivals(c, FIX, np.random.default_rng(3), duration_s=900)
    # half of window 600 (300 req/600 s -> 150 in [900,1200)) + window 1200 at 2.5 req/s for 600 s
    assert abs(np.count_nonzero(a < 300) - 150) <= 40
    assert np.count_nonzero(a >= 300) == 1500
    b = servegen_arrivals(c, FIX, np.random.default_rng(3), n_max=100)
    np.testing.assert_array_equal(b, a[:100])


def test_stochastic_rounding_keeps_small_rates(tmp_path):
    # 0.0125 req/s x 600 s = 7.5 requests a window: floor would give 7, round 8
    rows = "\n".join(f"{600 * i},0.0125,1.0,Gamma,1.0,1.0" for i in range(400))
    (tmp_path / "chunk-9-trace.csv").write_text(rows + "\n")
    a = servegen_arrivals(cfg(dir=str(tmp_path)), None, np.random.default_rng(1), duration_s=400 * 600)
    counts = np.histogram(a, bins=np.arange(0, 401) * 600.0)[0]
    assert set(counts.tolist()) == {7, 8}
    assert abs(counts.mean() - 7.5) < 0.1  # binomial sd of the mean 0.025


def test_burstiness_follows_the_fit():
    """Gamma(shape 0.25) gaps have CV 2; the rescaling keeps it (Gamma shape 1: CV 1)."""
    cvs = {0.25: [], 1.0: []}
    for seed in range(10):
        a = servegen_arrivals(cfg(clients=[1]), FIX, np.random.default_rng(seed), duration_s=1800)
        for shape, (lo, hi) in ((1.0, (600, 1200)), (0.25, (1200, 1800))):
            g = np.diff(a[(a >= lo) & (a < hi)])
            cvs[shape].append(g.std() / g.mean())
    assert abs(np.mean(cvs[1.0]) - 1.0) < 0.1
    assert abs(np.mean(cvs[0.25]) - 2.0) < 0.2


def test_errors(tmp_path):
    with pytest.raises(TraceError, match="no client '77'"):
        servegen_arrivals(cfg(clients=[77]), FIX, np.random.default_rng(0), n_max=5)
    with pytest.raises(TraceError, match="need a bound"):
        servegen_arrivals(cfg(), FIX, np.random.default_rng(0))
    with pytest.raises(TraceError, match="past the end of the data"):
        servegen_arrivals(cfg(start_s=10_000), FIX, np.random.default_rng(0), n_max=5)
    bad = tmp_path / "chunk-3-trace.csv"
    bad.write_text("0,1.0,1.0,Gamma,1.0,1.0\n600,1.0,1.0,Pareto,1.0,1.0\n")
    with pytest.raises(TraceError) as e:
        read_client_fits(bad)
    assert str(e.value) == f"{bad}:2: column pattern: 'Pareto' is not Gamma, Weibull or empty"
    with pytest.raises(ValidationError, match="clients \\[\\] selects nothing"):
        cfg(clients=[])
    with pytest.raises(ValidationError, match=r"rate_scale\n  Input should be greater than 0"):
        cfg(rate_scale=-1)
