"""A fleet's final folds in one compiled pass (metrics/fold.py, engine/fleet_finish.py) leave
every recorder with the bits ``Recorder._fold`` gives it, one engine at a time."""

from __future__ import annotations

import json

import numpy as np
import pytest

from servesim import scenario_from_dict
from servesim.engine import fleet_build, fleet_compiled, fleet_finish
from servesim.metrics.collect import Recorder
from servesim.metrics.fold import _pairwise, fold_recorders
from servesim.simulate import build, run_built
from tests.conftest import BASE, merge

CAP = 600


def _steps(rng, n: int, b: float):
    """``n`` steps: back to back (a start equal to the last end), after gaps, zero-long, longer
    than a bin, on bin edges; some ends out of order by an ulp (a cumulative sum's rounding)."""
    d = rng.exponential(b / 5, n) * np.where(rng.random(n) < 0.05, 30, 1)
    d[rng.random(n) < 0.02] = 0.0
    gaps = np.where(rng.random(n) < 0.3, rng.exponential(2 * b, n), 0.0)
    if rng.random() < 0.3:  # times on a grid of a quarter bin: edges fall on step boundaries
        d, gaps = np.round(d / (b / 4)) * (b / 4), np.round(gaps / (b / 4)) * (b / 4)
    if rng.random() < 0.5:  # exact: each start is the last end, or that plus a gap
        st, en = np.empty(n), np.empty(n)
        t = rng.uniform(0, 5 * b)
        for j in range(n):
            st[j] = t + gaps[j]
            en[j] = st[j] + d[j]
            t = en[j]
    else:  # rounded: starts from a cumulative sum, ends one ulp off at times
        st = np.cumsum(gaps + np.r_[0, d[:-1]]) + rng.uniform(0, 5 * b)
        en = st + d
    return st, en


def _buffers(rng, n: int, b: float, shift: float):
    start, end = np.zeros(CAP), np.zeros(CAP)
    vals, itlw = np.zeros((8, CAP)), np.zeros(CAP, dtype=np.int64)
    if n:
        st, en = _steps(rng, n, b)
        start[:n], end[:n] = st + shift, en + shift
        vals[:, :n] = rng.integers(0, 50, (8, n))
        itlw[:n] = rng.integers(-1, 5, n)
    return start, end, vals, itlw, n


def _state(r: Recorder):
    s = r.series
    return (r.iterations, r.busy_s, r.batch_seqs_sum, r.batch_tokens_sum, s.integral.tobytes(), s.peak.tobytes(),
            s.integral.shape, s.t_end, s.bin_s,
            [(np.asarray(v).tobytes(), np.asarray(w).tobytes()) for v, w in r.itl.parts()])


def test_pairwise_is_numpys_sum():
    rng = np.random.default_rng(3)
    for n in [*range(300), 1000, 4097, 8191, 8192, 8193, 20000, 100003]:
        a = rng.standard_normal(n) * 10 ** rng.uniform(-3, 3, n)
        assert _pairwise(a, 0, n) == float(a.sum()), n


@pytest.mark.parametrize("seed", range(4))
def test_batched_fold_equals_each_recorders_fold(seed):
    """Drawn buffers, two folds each (the second onto series already holding the first), with
    and without arrivals noted: every field of every recorder is the same, bit for bit."""
    rng = np.random.default_rng(seed)
    unsorted = 0
    for _ in range(60):
        k = int(rng.integers(1, 6))
        b = float(rng.choice([1.0, 0.5, 0.1, 0.3, 2.0]))
        ones, batch = [], []
        for _ in range(k):
            a, c = Recorder(b, CAP), Recorder(b, CAP)
            a.itl_from = c.itl_from = float(rng.uniform(0, 3))
            ones.append(a)
            batch.append(c)
        for shift in (0.0, 60.0):
            bufs = []
            for e in range(k):
                buf = _buffers(rng, int(rng.integers(0, 500)), b, shift)
                start, end, vals, itlw, n = buf
                if n and rng.random() < 0.8:
                    arr = np.sort(rng.uniform(start[0] - b, end[n - 1] + b, int(rng.integers(0, 3 * n + 1))))
                    ones[e].note_arrivals(arr)
                    batch[e].note_arrivals(arr)
                if n:
                    unsorted += bool(np.any(np.diff(end[:n]) < 0))
                    ones[e]._fold(start[:n], end[:n], vals[:, :n], itlw[:n])
                bufs.append(buf)
            fold_recorders(batch, bufs)
            for a, c in zip(ones, batch):
                assert _state(a) == _state(c)
    assert unsorted  # (the fallback to numpy's fold was drawn too)


FLEET = {"stop": {"requests": 1500}, "hardware": {"replicas": 12}, "cluster": {"router": "least-tokens"},
         "engine": {"max_num_seqs": 16},
         "metrics": {"timeseries_bin_s": 0.05},
         "workload": {"arrival": {"process": "poisson", "rate": 600.0},
                      "prompt": {"dist": "uniform", "min": 10, "max": 400},
                      "output": {"dist": "uniform", "min": 1, "max": 120}}}


def _run(raw: dict, monkeypatch, batched: bool, flush: bool):
    with monkeypatch.context() as m:
        m.setattr(fleet_finish, "FOLD_MIN_ENGINES", 2)  # (12 engines: batched whether or not the kernel is built)
        if flush:  # buffers of 512 rows: every engine flushes during the run (engine/fleet_compiled.py X_ENGINE)
            m.setattr(fleet_build, "SHARE_ROWS", 1)
        if not batched:
            for mod in (fleet_finish, fleet_compiled):
                m.setattr(mod, "batched", lambda engines: False)
        else:
            m.setattr(fleet_finish, "batched", lambda engines, _b=fleet_finish.batched: _b(engines) or pytest.fail(
                "the fleet's finish was not batched"))
        b = build(scenario_from_dict(raw))
        res = run_built(b)
    summary = {k: v for k, v in res.summary.items() if k != "wall_s"}
    return (json.dumps(summary, sort_keys=True, default=str), res.timeseries.to_csv(), res.requests.to_csv(),
            [_state(e.recorder) for e in b.replica.engines])


@pytest.mark.parametrize("extra", [{}, {"engine": {"num_scheduler_steps": 4}}, {"stop": {"duration_s": 1.5}}],
                         ids=["open", "multistep", "duration"])
@pytest.mark.parametrize("flush", [False, True], ids=["end", "flushes"])
def test_fleet_results_equal_with_the_batched_finish(extra, flush, monkeypatch):
    raw = merge(merge(BASE, FLEET), extra)
    assert _run(raw, monkeypatch, True, flush) == _run(raw, monkeypatch, False, flush)
