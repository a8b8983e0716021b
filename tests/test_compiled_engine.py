"""The compiled core must reproduce the Python engine exactly.

The Python engine (replica + vllm policy + paged KV) is the reference; the compiled core mirrors
it for that configuration. Random scenarios covering arrivals, closed loops, chunked prefill, KV
shortage with recompute preemption, duration stops, warm-up and CPU overhead run on both; the
per-request timestamps and blocked seconds must be equal, the summaries equal to float rounding
(only the order in which inter-token gaps are summed may differ).
"""

from __future__ import annotations


import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim import scenario_from_dict
from servesim.simulate import build
from tests.conftest import BASE, merge
from tests.test_fastpath_exact import TS_COLS, assert_summaries_equal, scenarios


def run(raw, engine, fast=True):
    from servesim.simulate import run_built

    raw = merge(raw, {"sim": {"engine": engine, "fast_path": fast, "check_invariants": False}})
    b = build(scenario_from_dict(raw))
    assert b.replica.name == engine  # the engine asked for is the one that ran
    return run_built(b)


def assert_same(a, b):
    fa, fb = a.requests, b.requests
    assert fa.status.tolist() == fb.status.tolist()
    assert fa.preemptions.tolist() == fb.preemptions.tolist()
    for col in TS_COLS + [c for c in fa.columns if c.startswith("blocked_")]:
        np.testing.assert_array_equal(fa[col].to_numpy(), fb[col].to_numpy(), err_msg=col)
    assert_summaries_equal(a.summary, b.summary)


@st.composite
def with_extras(draw):
    raw = draw(scenarios())
    if draw(st.booleans()):
        raw = merge(raw, {"engine": {"cpu_overhead_s": 0.002, "cpu_overhead_per_seq_s": 1e-4}})
    if draw(st.booleans()) and raw["stop"].get("requests", 0) > 3:
        raw = merge(raw, {"stop": {"warmup_requests": 2}})
    return raw


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(with_extras())
def test_compiled_equals_python(raw):
    assert_same(run(raw, "python"), run(raw, "compiled"))


def test_compiled_single_step_equals_fast():
    raw = merge(BASE, {"stop": {"requests": 300}, "step_time": {"model": "roofline"},
                       "workload": {"arrival": {"process": "poisson", "rate": 40.0},
                                    "prompt": {"dist": "lognormal", "mean": 300, "sigma": 1.0, "max": 4000},
                                    "output": {"dist": "uniform", "min": 1, "max": 300}}})
    assert_same(run(raw, "compiled", fast=False), run(raw, "compiled", fast=True))


def test_auto_picks_compiled_for_large_vllm_runs_and_python_otherwise():
    big = {"stop": {"requests": 60_000}}
    assert build(scenario_from_dict(merge(BASE, big))).replica.name == "compiled"
    assert build(scenario_from_dict(BASE)).replica.name == "python"  # small: not worth numba's start-up
    unsupported = merge(BASE, {**big, "sim": {"check_invariants": True}})
    assert build(scenario_from_dict(unsupported)).replica.name == "python"


def test_forcing_compiled_on_unsupported_config_is_a_clear_error():
    from servesim.errors import ScenarioError

    with pytest.raises(ScenarioError, match="does not support invariant checks"):
        build(scenario_from_dict(merge(BASE, {"sim": {"engine": "compiled", "check_invariants": True}})))


def test_kv_state_after_a_compiled_run_matches_the_python_engine():
    """Issue 17: after a compiled run only free_blocks was synced back; kv.holders was stale
    (a duration stop leaves requests holding blocks)."""
    from servesim.simulate import run_built

    raw = merge(BASE, {"stop": {"requests": 400, "duration_s": 3.0}, "step_time": {"model": "roofline"},
                       "workload": {"arrival": {"process": "poisson", "rate": 200.0},
                                    "output": {"dist": "fixed", "value": 200}}})
    kvs = []
    for engine in ("python", "compiled"):
        b = build(scenario_from_dict(merge(raw, {"sim": {"engine": engine}})))
        res = run_built(b)
        assert res.summary["requests"]["in_flight"] > 0
        kvs.append(b.replica.kv)
    py, comp = kvs
    assert sorted(comp.holders.ids.tolist()) == sorted(py.holders.ids.tolist()) != []
    assert comp.free_blocks == py.free_blocks
    comp.check()
