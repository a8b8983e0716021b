"""Compiled = uncompiled, by construction, and held so: one source (servesim/jit.py), two runs.

The engine's kernels run compiled (numba) or as plain Python (``jit.pure``); nothing is restated,
so the two can only differ if numba and Python disagree on an operation. Random scenarios over
every policy (and its modes: chunking, swap, multi-step, aging, class budgets, micro-batches) x
every compiled KV allocator (paged, static, elastic) x arrivals (open, closed, durations, warm-up,
CPU overheads), with invariant checks on, run both ways: per-request timestamps, blocked seconds,
preemptions and the summary must be identical. One long run flushes the recorder's buffers.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim import scenario_from_dict
from servesim.errors import ScenarioError
from servesim.simulate import build, run_built
from tests.conftest import BASE, merge
from tests.test_fastpath_exact import TS_COLS
from tests.test_sched_properties import policies


def run(raw, engine, fast=True, buffers=None):
    raw = merge(raw, {"sim": {"engine": engine, "fast_path": fast}})
    b = build(scenario_from_dict(raw), buffers=buffers)
    assert b.replica.path == engine  # the engine asked for is the one that ran
    return run_built(b)


def assert_identical(a, b):
    fa, fb = a.requests, b.requests
    assert fa.status.tolist() == fb.status.tolist()
    assert fa.preemptions.tolist() == fb.preemptions.tolist()
    for col in TS_COLS + [c for c in fa.columns if c.startswith("blocked_")]:
        np.testing.assert_array_equal(fa[col].to_numpy(), fb[col].to_numpy(), err_msg=col)
    sa, sb = dict(a.summary), dict(b.summary)
    for s in (sa, sb):
        s.pop("wall_s", None)
        s.pop("resolved_scenario", None)
    assert sa == sb


@st.composite
def scenarios(draw):
    eng = draw(policies())
    block = draw(st.sampled_from([1, 2, 4, 16]))
    eng.update({"block_size": block, "max_num_seqs": draw(st.integers(1, 8)), "max_model_len": 96,
                "num_gpu_blocks_override": max(draw(st.integers(8, 60)), math.ceil(96 / block)),
                "cpu_overhead_s": draw(st.sampled_from([0.0, 0.002])),
                "cpu_overhead_per_seq_s": draw(st.sampled_from([0.0, 1e-4]))})
    if "max_batch_size" in eng:  # a static batch larger than the slots is refused
        eng["max_batch_size"] = min(eng["max_batch_size"], eng["max_num_seqs"])
    kv = draw(st.sampled_from(["paged", "static", "elastic"]))
    eng["kv_allocator"] = kv
    if kv == "static":
        eng["kv"] = {"static": {"reserve": draw(st.sampled_from(["max_model_len", "request"])),
                                "fit": draw(st.sampled_from(["first", "best"]))}}
    if kv == "elastic":
        eng["kv"] = {"elastic": {"base_tokens": draw(st.sampled_from([8, 32])),
                                 "growth_tokens": draw(st.sampled_from([4, 16]))}}
    if draw(st.booleans()):
        arrival = {"process": "closed", "clients": draw(st.integers(1, 6)),
                   "think_s": draw(st.sampled_from([0.0, 0.013])),
                   "think_dist": draw(st.sampled_from(["fixed", "exponential"]))}
    else:
        arrival = {"process": draw(st.sampled_from(["poisson", "gamma"])), "rate": draw(st.floats(5.0, 150.0))}
        if eng["scheduler"] == "vllm" and draw(st.booleans()):  # (open loops only: scenario.py)
            eng["options"] = {**(eng.get("options") or {}), "async_output": True}
    stop = {"requests": draw(st.integers(5, 40))}
    if draw(st.booleans()):
        stop["duration_s"] = draw(st.floats(0.2, 3.0))
    if draw(st.booleans()):
        stop["warmup_requests"] = 2
    weights = draw(st.lists(st.sampled_from([0.0, 1.0, 2.0]), min_size=1, max_size=5).filter(lambda w: sum(w) > 0))
    return merge(BASE, {
        "seed": draw(st.integers(0, 10_000)), "stop": stop, "engine": eng,
        "step_time": draw(st.sampled_from([{"model": "constant", "seconds": 0.01}, {"model": "roofline"}])),
        "workload": {"arrival": arrival, "prompt": {"dist": "uniform", "min": 1, "max": 60},
                     "output": {"dist": "uniform", "min": 1, "max": 40}, "classes": {"weights": weights}},
        "sim": {"check_invariants": True},
    })


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_compiled_equals_python(raw):
    assert_identical(run(raw, "python"), run(raw, "compiled"))


@pytest.mark.parametrize("scheduler", ["vllm", "chunked", "priority", "static-fifo"])
def test_small_buffers_flush_and_cut_runs_identically(scheduler):
    """Decode runs capped at 7 steps and a recorder buffer of 40 rows: many flushes and cut runs,
    the same results as the default buffers (up to float rounding of the binned sums)."""
    raw = merge(BASE, {"stop": {"requests": 300}, "step_time": {"model": "roofline"},
                       "engine": {"scheduler": scheduler, "max_num_seqs": 32},
                       "workload": {"arrival": {"process": "poisson", "rate": 60.0},
                                    "prompt": {"dist": "lognormal", "mean": 200, "sigma": 1.0, "max": 2000},
                                    "output": {"dist": "uniform", "min": 1, "max": 200}}})
    small = (7, 40)
    a, b = run(raw, "python", buffers=small), run(raw, "compiled", buffers=small)
    assert a.summary["engine"]["iterations"] > 10 * small[1]
    assert_identical(a, b)
    big = run(raw, "compiled")
    for col in TS_COLS:
        np.testing.assert_allclose(big.requests[col].to_numpy(), b.requests[col].to_numpy(), rtol=1e-12, atol=1e-12)


def test_compiled_single_step_equals_fast():
    raw = merge(BASE, {"stop": {"requests": 300}, "step_time": {"model": "roofline"},
                       "workload": {"arrival": {"process": "poisson", "rate": 40.0},
                                    "prompt": {"dist": "lognormal", "mean": 300, "sigma": 1.0, "max": 4000},
                                    "output": {"dist": "uniform", "min": 1, "max": 300}}})
    a, b = run(raw, "compiled", fast=False), run(raw, "compiled", fast=True)
    assert a.summary["engine"]["iterations"] == b.summary["engine"]["iterations"]
    for col in TS_COLS:
        np.testing.assert_allclose(a.requests[col].to_numpy(), b.requests[col].to_numpy(), rtol=1e-12, atol=1e-12)


def test_every_built_in_policy_compiles():
    for sched in ["vllm", "chunked", "priority", "static-fifo"]:
        for kv in ["paged", "static", "elastic"]:
            eng = {"scheduler": sched, "kv_allocator": kv}
            if sched == "static-fifo":  # its default batch of 16 exceeds BASE's 8 slots (refused)
                eng["max_batch_size"] = 8
            raw = merge(BASE, {"engine": eng})
            assert build(scenario_from_dict(raw)).replica.path == "compiled", (sched, kv)


def test_python_path_says_why():
    b = build(scenario_from_dict(BASE), on_iteration=lambda *a: None)
    assert b.replica.path == "python" and "iteration hook" in b.replica.why


def test_forcing_compiled_where_it_cannot_run_is_a_clear_error():
    with pytest.raises(ScenarioError, match="needs the Python engine.*iteration hook"):
        build(scenario_from_dict(merge(BASE, {"sim": {"engine": "compiled"}})), on_iteration=lambda *a: None)


def test_kv_state_after_a_compiled_run_matches_the_python_engine():
    """Issue 17: after a compiled run only free_blocks was synced back; kv.holders was stale
    (a duration stop leaves requests holding blocks). The pool is now the kernels' state itself,
    so both engines leave the same state, and its invariants hold."""
    from servesim.jit import pure
    from servesim.kv.kernels import kv_check
    from servesim.simulate import run_built

    raw = merge(BASE, {"stop": {"requests": 400, "duration_s": 3.0}, "step_time": {"model": "roofline"},
                       "workload": {"arrival": {"process": "poisson", "rate": 200.0},
                                    "output": {"dist": "fixed", "value": 200}}})
    kvs = []
    for engine in ("python", "compiled"):
        b = build(scenario_from_dict(merge(raw, {"sim": {"engine": engine}})))
        res = run_built(b)
        assert res.summary["requests"]["in_flight"] > 0
        kvs.append((b.kv, b.table.computed))
    (py, _), (comp, computed) = kvs
    assert (comp.held > 0).any() and (comp.held == py.held).all()
    assert int(comp.s[0].free) == int(py.s[0].free)
    holders = np.flatnonzero(comp.held > 0).astype(np.int64)
    assert pure(kv_check)(comp, computed, holders, len(holders)) == 0


def test_the_state_and_conf_structrefs_keep_their_unowned_arrays_alive():
    """engine/kernel.py holds the state's and the step tables' arrays unowned (no reference count
    updates in the hot loop); the StructRefs themselves must keep them alive: with every Python
    reference to the arrays dropped and the memory churned, the kernel-side arrays still read the
    values they were built with (a broken owner field would read freed memory here)."""
    import gc

    from numba import njit

    from servesim.engine import kernel as K

    @njit
    def state_arrays(s):  # (copies: the kernel-side arrays, read through the StructRef)
        return s.prompt.copy(), s.output.copy(), s.g_hi.copy()

    @njit
    def conf_arrays(c):
        return c.tab.pk_lin.copy(), c.tab.pk_dec_table.copy()

    assert K.OWNER == "g_hi"
    raw = merge(BASE, {"sim": {"engine": "compiled"}, "step_time": {"model": "pack"}})
    b = build(scenario_from_dict(raw))
    eng = b.replica.engines[0]
    assert b.replica.path == "compiled"
    st0 = eng.st
    arrays = {f: getattr(st0, f).copy() for f in st0._fields if isinstance(getattr(st0, f), np.ndarray)}
    want_st = [arrays[f].copy() for f in ("prompt", "output", "g_hi")]
    kst = K.borrowed_state(st0._replace(**arrays))
    tab = eng.tab._replace(**{f: v.copy() for f, v in eng.tab._asdict().items() if isinstance(v, np.ndarray)})
    want_tab = [tab.pk_lin.copy(), tab.pk_dec_table.copy()]
    assert all(w.size for w in want_tab)
    conf = K.make_conf_borrowed(eng.cfg, tab, np.asarray(K._Owner(np.zeros(0, dtype=np.uint8), tab)))
    shapes = [(a.shape, a.dtype) for a in [*arrays.values(), *tab] if isinstance(a, np.ndarray)]
    del arrays, tab
    gc.collect()
    # blocks of the freed arrays' sizes, filled: freed memory would be handed out again here
    churn = [np.full(shape, -7, dtype=dt) for shape, dt in shapes for _ in range(20)]
    for got, want in zip(state_arrays(kst), want_st):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(conf_arrays(conf), want_tab):
        np.testing.assert_array_equal(got, want)
    del churn
