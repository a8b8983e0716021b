"""The fast path (many decode iterations per event) must give exactly the single-step results.

Hypothesis draws small scenarios that exercise every event the fast path must stop at: arrivals,
completions, block boundaries that exhaust the pool (preemption), chunked prefill, a duration stop,
closed-loop clients. Each runs twice, fast path on and off; per-request timestamps must agree to
float rounding and the summaries must agree everywhere except wall time.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.simulate import simulate
from tests.conftest import BASE, merge

TS_COLS = ["arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s", "queue_s"]


@st.composite
def scenarios(draw):
    block = draw(st.sampled_from([1, 2, 4, 16]))
    blocks = draw(st.integers(8, 60))
    chunked = draw(st.booleans())
    budget = draw(st.integers(16, 96)) if chunked else 128
    max_model_len = 96
    closed = draw(st.booleans())
    if closed:
        arrival = {"process": "closed", "clients": draw(st.integers(1, 6)),
                   "think_s": draw(st.sampled_from([0.0, 0.013, 0.05]))}
    else:
        arrival = {"process": draw(st.sampled_from(["poisson", "gamma", "constant"])),
                   "rate": draw(st.floats(5.0, 120.0))}
        if arrival["process"] == "gamma":
            arrival["cv"] = draw(st.floats(0.5, 3.0))
    stop = {"requests": draw(st.integers(5, 40))}
    if draw(st.booleans()):
        stop["duration_s"] = draw(st.floats(0.2, 3.0))
    step = draw(st.sampled_from([{"model": "constant", "seconds": 0.01}, {"model": "roofline"}]))
    raw = merge(BASE, {
        "seed": draw(st.integers(0, 10_000)),
        "stop": stop,
        "engine": {"block_size": block, "num_gpu_blocks_override": max(blocks, math.ceil(max_model_len / block)),
                   "max_num_seqs": draw(st.integers(1, 8)), "max_num_batched_tokens": budget,
                   "enable_chunked_prefill": chunked, "max_model_len": max_model_len},
        "step_time": step,
        "workload": {"arrival": arrival,
                     "prompt": {"dist": "uniform", "min": 1, "max": 60},
                     "output": {"dist": "uniform", "min": 1, "max": 40}},
        "sim": {"check_invariants": True},
    })
    return raw


def run(raw, fast):
    from servesim import scenario_from_dict

    return simulate(scenario_from_dict(merge(raw, {"sim": {"fast_path": fast}})))


def assert_summaries_equal(a, b, path="summary"):
    """Equal results; wall-clock time and the resolved scenario's hash aside (the runs compared
    differ in sim settings, which are part of the configuration but never of the results)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            if k not in ("wall_s", "resolved_scenario"):
                assert_summaries_equal(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, float) and b is not None:
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), (path, a, b)
    else:
        assert a == b, (path, a, b)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_fast_path_equals_single_step(raw):
    fast, slow = run(raw, True), run(raw, False)
    f, s = fast.requests, slow.requests
    assert f.status.tolist() == s.status.tolist()
    assert f.preemptions.tolist() == s.preemptions.tolist()
    for col in TS_COLS:
        np.testing.assert_allclose(f[col].to_numpy(), s[col].to_numpy(), rtol=1e-12, atol=1e-12, err_msg=col)
    for col in [c for c in f.columns if c.startswith("blocked_")]:
        np.testing.assert_allclose(f[col].to_numpy(), s[col].to_numpy(), rtol=1e-9, atol=1e-9, err_msg=col)
    assert_summaries_equal(fast.summary, slow.summary)
    assert fast.summary["engine"]["iterations"] == slow.summary["engine"]["iterations"]
