"""The KV managers inside whole simulations: identity when prefix caching cannot matter, hits and
their TTFT effect on multi-turn sessions, fast path = single step for every allocator, scenario
validation of the KV fields, and the fragmentation recorder."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim import ServesimError, scenario_from_dict
from servesim.kv.report import kv_report
from tests.test_fastpath_exact import assert_summaries_equal
from servesim.simulate import build, run_built, simulate
from servesim.simulate import scenario_workload
from tests.conftest import BASE, merge

TS_COLS = ["first_scheduled_s", "first_token_s", "finish_s", "ttft_s", "e2e_s", "queue_s"]

SESSIONS = merge(BASE, {
    "stop": {"requests": 120},
    "engine": {"block_size": 8, "num_gpu_blocks_override": 90, "max_model_len": 512, "max_num_seqs": 16,
               "max_num_batched_tokens": 512},
    "workload": {"arrival": {"process": "poisson", "rate": 4.0},
                 "sessions": {"turns": {"dist": "fixed", "value": 3}, "think_s": 0.3, "think_dist": "fixed",
                              "new_input": {"dist": "fixed", "value": 40}, "output": {"dist": "fixed", "value": 12},
                              "system_prompt_tokens": 64, "block_tokens": 16}},
    "sim": {"check_invariants": True},
})
del SESSIONS["workload"]["prompt"], SESSIONS["workload"]["output"]


def sc(raw, **patch):
    return scenario_from_dict(merge(raw, patch), "test")


def same_results(a, b):
    fa, fb = a.requests, b.requests
    for col in TS_COLS:
        x, y = fa[col].to_numpy(), fb[col].to_numpy()
        assert np.array_equal(np.isnan(x), np.isnan(y)) and np.allclose(x, y, rtol=1e-12, equal_nan=True), col
    assert a.summary["requests"] == b.summary["requests"]


def test_prefix_caching_on_an_unhashed_workload_is_plain_paged():
    raw = merge(BASE, {"stop": {"requests": 150}, "engine": {"block_size": 4, "num_gpu_blocks_override": 40,
                                                               "max_model_len": 160, "max_num_batched_tokens": 320},
                       "workload": {"arrival": {"process": "poisson", "rate": 40.0},
                                    "prompt": {"dist": "uniform", "min": 1, "max": 100},
                                    "output": {"dist": "uniform", "min": 1, "max": 50}},
                       "sim": {"check_invariants": True}})
    plain = simulate(sc(raw))
    cached = simulate(sc(raw, engine={"enable_prefix_caching": True}))
    assert plain.summary["requests"]["preemptions"] > 0  # the pool is under pressure
    same_results(plain, cached)


def test_caching_off_ignores_hashes():
    s = sc(SESSIONS)
    wl = scenario_workload(s, s.seed)
    assert wl.has_prefixes
    bare = dataclasses.replace(wl, prefix_offsets=None, prefix_hashes=None, prefix_block_tokens=0)
    same_results(simulate(s, workload=wl), simulate(s, workload=bare))


def run_with_kv(scenario):
    b = build(scenario)
    res = run_built(b)
    return res, b.kv


def test_sessions_hit_the_cache_and_cut_ttft():
    """Roofline step times: a prefill's cost grows with its tokens, so skipping cached ones shows."""
    roof = merge(SESSIONS, {"step_time": {"model": "roofline"}})
    off, _ = run_with_kv(sc(roof))
    on, kv = run_with_kv(sc(roof, engine={"enable_prefix_caching": True}))
    assert kv.prefix_caching and kv.state.prefix  # the kernels' pool (kv/pcache.py)
    ttft = np.full(len(kv.held), np.nan)
    fr = on.requests
    ttft[fr.id.to_numpy()] = fr.ttft_s.to_numpy()
    rep = kv_report(kv, ttft)
    # turns 2 and 3 reuse the system prompt and history; turn 1 at least the system prompt
    assert rep["prefix_hit_rate"]["tokens"] > 0.4
    assert rep["tiers"]["L1"]["hit_rate"] == rep["prefix_hit_rate"]["blocks"]
    eff = rep["ttft_effect"]
    assert eff["with_hit"]["requests"] > 0
    prefilled_off = float((off.requests.prompt_tokens).sum())
    assert kv.hit_tokens.sum() < prefilled_off
    assert on.summary["latency_s"]["ttft"]["mean"] < off.summary["latency_s"]["ttft"]["mean"]


# --------------------------------------------------------------------------- fast path
@st.composite
def kv_scenarios(draw):
    kind = draw(st.sampled_from(["paged", "prefix", "prefix-priority", "static", "elastic"]))
    bs = draw(st.sampled_from([1, 4, 16]))
    chunked = draw(st.booleans())
    engine = {"block_size": bs, "max_num_seqs": draw(st.integers(1, 8)), "max_model_len": 256,
              "max_num_batched_tokens": draw(st.integers(64, 256)) if chunked else 256,
              "enable_chunked_prefill": chunked}
    if kind.startswith("prefix"):
        engine.update(enable_prefix_caching=True,
                      prefix_cache_eviction="priority" if kind.endswith("priority") else "lru")
    elif kind == "static":
        engine.update(kv_allocator="static", kv={"static": {"reserve": draw(st.sampled_from(["request", "max_model_len"])),
                                                            "fit": draw(st.sampled_from(["first", "best"]))}})
    elif kind == "elastic":
        engine.update(kv_allocator="elastic", kv={"elastic": {"base_tokens": draw(st.sampled_from([16, 64])),
                                                              "growth_tokens": draw(st.sampled_from([8, 32]))}})
    need = -(-256 // bs) if kind in ("static",) else -(-256 // bs) + (64 // bs if kind == "elastic" else 0)
    engine["num_gpu_blocks_override"] = need + draw(st.integers(0, 2 * need))
    raw = merge(SESSIONS, {"seed": draw(st.integers(0, 10_000)), "stop": {"requests": draw(st.integers(10, 40))},
                           "engine": engine})
    raw["workload"]["sessions"] = merge(raw["workload"]["sessions"], {
        "new_input": {"dist": "uniform", "min": 1, "max": 60}, "output": {"dist": "uniform", "min": 1, "max": 30},
        "max_context_tokens": 250, "system_prompt_tokens": draw(st.sampled_from([0, 16, 40]))})
    raw["workload"]["arrival"] = {"process": "poisson", "rate": draw(st.floats(2.0, 30.0))}
    return raw


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kv_scenarios())
def test_fast_path_equals_single_step_for_every_allocator(raw):
    fast, kf = run_with_kv(sc(raw, sim={"fast_path": True}))
    slow, ks = run_with_kv(sc(raw, sim={"fast_path": False}))
    same_results(fast, slow)
    assert_summaries_equal(fast.summary, slow.summary)
    if kf.prefix_caching:
        assert kf.eviction_log is None and kf.evictions == ks.evictions
        assert (kf.hit_tokens == ks.hit_tokens).all() and (kf.state.cache_blk == ks.state.cache_blk).all()


# ------------------------------------------------------------------------- scenario fields
@pytest.mark.parametrize("patch,needles", [
    ({"engine": {"kv_allocator": "buddy"}}, ["engine.kv_allocator", "'buddy'", "paged"]),
    ({"engine": {"kv_allocator": "static", "enable_prefix_caching": True}},
     ["enable_prefix_caching", "kv_allocator: paged", "'static'"]),
    ({"kv_tiers": [{"kind": "cpu", "capacity_gib": 64}]}, ["kv_tiers", "enable_prefix_caching"]),
    ({"engine": {"enable_prefix_caching": True}, "kv_tiers": [{"kind": "cpu", "capacity_gib": -1}]},
     ["kv_tiers[0].capacity_gib", "-1", "greater than 0"]),
    ({"engine": {"enable_prefix_caching": True}, "kv_tiers": [{"kind": "tape", "capacity_gib": 1}]},
     ["kv_tiers[0].kind", "'tape'", "cpu"]),
    ({"engine": {"kv": {"protect_share": [1.5]}}}, ["engine.kv.protect_share[0]", "1.5", "less than or equal to 1"]),
    ({"engine": {"kv": {"elastic": {"base_tokens": 0}}}}, ["engine.kv.elastic.base_tokens", "0", "between 1"]),
    ({"engine": {"kv": {"preload": {"window_s": 0}}}}, ["engine.kv.preload.window_s", "greater than 0"]),
    ({"engine": {"kv": {"static": {"fit": "worst"}}}}, ["engine.kv.static.fit", "'worst'", "first"]),
    ({"engine": {"prefix_cache_eviction": "fifo"}}, ["engine.prefix_cache_eviction", "'fifo'", "lru"]),
])
def test_bad_kv_fields_get_one_line(patch, needles):
    with pytest.raises(ServesimError) as e:
        scenario_from_dict(merge(BASE, patch), "bad.yaml")
    msg = str(e.value)
    assert "\n" not in msg
    for n in needles:
        assert n in msg, (n, msg)


def test_tiers_and_preload_build_from_a_scenario():
    s = sc(SESSIONS, engine={"enable_prefix_caching": True, "prefix_cache_eviction": "priority",
                             "kv": {"protect_share": [0.5, 0.1], "preload": {"min_hits": 3, "window_s": 5}}},
           kv_tiers=[{"kind": "cpu", "capacity_gib": 1}, {"kind": "remote", "capacity_gib": 4, "name": "redis"}])
    b = build(s)
    kv = b.kv
    assert [t.name for t in kv.tiers.tiers] == ["L2", "redis"]
    block = b.memory.kv_bytes_per_token * 8
    assert kv.tiers.tiers[0].capacity == (1 << 30) // block
    assert kv.tiers.tiers[0].link.bw == 25e9 and kv.tiers.tiers[1].link.latency == 1e-3
    assert kv.state.protect[:2].tolist() == [45, 9] and kv.state.hot_min == 3


# ----------------------------------------------------------------------------- frag recorder
def test_fragmentation_time_weighted_mean_and_peak():
    """The engine recorder integrates the KV slot signals exactly; shares are of the whole pool."""
    from servesim.metrics.collect import Recorder
    from servesim.metrics.summary import kv_summary, timeseries_frame

    rec = Recorder(timeseries_bin_s=1.0)
    # pool of 10 blocks x 10 slots; frag = (internal, reserved, external) slots per step
    rec.steps(0.0, np.array([0.5, 1.5]), np.array([4, 6]), 1, 0, 1, 0, 0,
              (np.array([10, 10]), np.array([0, 0]), np.array([0, 0])))  # 0.5 s at 40 %, 1 s at 60 %
    rec.steps(3.0, np.array([4.0]), 8, 1, 0, 1, 0, 0, (10, 20, 0))  # idle 1.5..3 counts as 0
    s = kv_summary(rec, num_blocks=10, block_size=10, sim_time=4.0)
    assert s["utilization"]["mean"] == pytest.approx((0.5 * 0.4 + 1.0 * 0.6 + 1.0 * 0.8) / 4)
    assert s["utilization"]["peak"] == pytest.approx(0.8)
    assert s["internal_fragmentation"]["mean"] == pytest.approx((0.5 * 0.1 + 1.0 * 0.1 + 1.0 * 0.1) / 4)
    assert s["reservation_waste"]["peak"] == pytest.approx(0.2)
    cols = timeseries_frame(rec, num_blocks=10, block_size=10)
    assert cols["kv_utilization_mean"].tolist() == pytest.approx([0.5, 0.3, 0.0, 0.8])
    assert cols["kv_utilization_peak"].tolist() == pytest.approx([0.6, 0.6, 0.0, 0.8])