"""A fleet is the lone replica, routed: exactness of the fleet loop (servesim/engine/cluster.py, fleet_events.py).

1. A fleet of one replica (``cluster.groups: [{replicas: 1}]``) routed request by request
   (``fleet_build.SOLO = False``; a fleet of one otherwise keeps its arrivals in its engine's own
   inbox, as a lone replica does) gives exactly the lone replica's results -- every request's timestamps, blocked seconds and preemptions, and every summary
   value -- on random scenarios over every policy x KV allocator x open / closed loops (think
   times, several closed-loop streams with ramp-up, the arrival cap), warm-up, durations,
   multi-step and prefix caching. The router path (routed inbox, decode runs cut at routed
   arrivals, the fleet's closed loops) thus changes nothing a lone replica would do.
2. Compiled = uncompiled for fleets of several replicas (any router but affinity, pipeline
   replicas), as for one replica (tests/test_compiled_engine.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim import scenario_from_dict
from servesim.engine import fleet_build
from servesim.simulate import build, run_built
from servesim.testing.strategies import router_names
from tests.conftest import BASE, merge
from tests.test_compiled_engine import scenarios
from tests.test_fastpath_exact import TS_COLS

ONE = {"cluster": {"groups": [{"replicas": 1}]}}


def run(raw, engine=None, fleet=False):
    """``fleet``: as a fleet of one replica, routed (not solo)."""
    if engine is not None:
        raw = merge(raw, {"sim": {"engine": engine}})
    if fleet:
        raw = merge(raw, ONE)
    fleet_build.SOLO = not fleet
    try:
        b = build(scenario_from_dict(raw))
    finally:
        fleet_build.SOLO = True
    if fleet:
        assert not b.replica.solo
    if engine is not None:
        assert b.replica.path == engine
    return run_built(b)


def assert_identical(a, b, *, fleet_keys=("cluster",)):
    fa, fb = a.requests, b.requests
    assert fa.status.tolist() == fb.status.tolist()
    assert fa.preemptions.tolist() == fb.preemptions.tolist()
    for col in TS_COLS + [c for c in fa.columns if c.startswith("blocked_")]:
        np.testing.assert_array_equal(fa[col].to_numpy(), fb[col].to_numpy(), err_msg=col)
    sa, sb = dict(a.summary), dict(b.summary)
    for s in (sa, sb):
        for k in ("wall_s", "resolved_scenario") + tuple(fleet_keys):
            s.pop(k, None)
    assert sa == sb, [k for k in sa if sa[k] != sb.get(k)]


def test_a_fleet_of_one_runs_solo_and_reports_its_cluster():
    b = build(scenario_from_dict(merge(BASE, ONE)))
    assert b.fleet is not None and len(b.fleet.engines) == 1 and b.replica.solo
    res = run_built(b)
    assert res.summary["cluster"]["replicas"] == 1
    assert (res.requests["replica"] == 0).all()


def test_a_lone_replica_is_a_fleet_of_one():
    """One build path: a scenario without ``cluster:`` is a solo fleet of one engine (no
    cluster block, no replica column), whose results are the routed fleet of one's (above)."""
    from servesim.engine.cluster import Fleet

    b = build(scenario_from_dict(BASE))
    assert isinstance(b.replica, Fleet) and b.replica.solo and len(b.replica.engines) == 1 and b.fleet is None
    res = run_built(b)
    assert "cluster" not in res.summary and "replica" not in res.requests.columns
    assert res.summary["requests"]["completed"] == BASE["stop"]["requests"]


def test_a_lone_replica_keeps_the_cluster_delays():
    """Found defect: cluster.network_delay_s and router_overhead_s were dropped without a
    cluster: groups section (a lone replica ran as a plain engine); TTFT and E2E include them."""
    delays = {"cluster": {"network_delay_s": 0.05, "router_overhead_s": 0.05}}
    lone = run(merge(BASE, delays))
    group = run(merge(merge(BASE, delays), ONE))
    plain = run(BASE)
    assert_identical(lone, group)
    d = lone.requests.ttft_s - plain.requests.ttft_s
    assert d.min() >= 0.15 - 1e-9  # in: router + network; out: network (0.05 each way at least)


def test_a_group_merges_engine_sections_at_every_depth():
    """Found defect: a group's engine.kv.static {fit: best} reset the scenario's
    kv.static.reserve to its default (a one-level merge); only engine.options is replaced whole."""
    top = merge(BASE, {"engine": {"kv_allocator": "static", "kv": {"static": {"reserve": "request"}},
                                  "options": {}}})
    grouped = merge(top, {"cluster": {"groups": [{"replicas": 1, "engine": {"kv": {"static": {"fit": "best"}}}}]}})
    g = scenario_from_dict(grouped).replica_groups[0].scenario
    assert (g.engine.kv.static.reserve, g.engine.kv.static.fit) == ("request", "best")
    lone = merge(top, {"engine": {"kv": {"static": {"fit": "best"}}}})
    assert_identical(run(lone), run(grouped))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_fleet_of_one_equals_lone_replica_compiled(raw):
    assert_identical(run(raw, "compiled"), run(raw, "compiled", fleet=True))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_fleet_of_one_equals_lone_replica_python(raw):
    assert_identical(run(raw, "python"), run(raw, "python", fleet=True))


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_fleet_of_one_equals_lone_replica_many(raw):
    assert_identical(run(raw, "compiled"), run(raw, "compiled", fleet=True))


def _streams(requests=300, warmup=0):
    raw = merge(BASE, {"stop": {"requests": requests, "warmup_requests": warmup}, "engine": {"max_num_seqs": 16},
                       "step_time": {"model": "roofline"}})
    lengths = {"prompt": {"dist": "uniform", "min": 8, "max": 200}, "output": {"dist": "uniform", "min": 2, "max": 60}}
    raw["workload"] = {"streams": [
        {"name": "agents", "class": "P1", "arrival": {"process": "closed", "clients": 3, "think_s": 0.0}, **lengths},
        {"name": "batch", "class": "P3", "arrival": {"process": "closed", "clients": 5, "ramp_up_s": 0.5,
                                                      "think_s": 0.02}, **lengths},
        {"name": "web", "class": "P0", "arrival": {"process": "poisson", "rate": 30.0}, **lengths}]}
    return raw


@pytest.mark.parametrize("case", ["streams", "streams-duration", "multi-step", "prefix-sessions", "priority-aging",
                                  "static-micro"])
def test_fleet_of_one_named_cases(case):
    if case.startswith("streams"):
        raw = _streams()
        if case == "streams-duration":
            raw = merge(raw, {"stop": {"duration_s": 2.0}})
    elif case == "multi-step":
        raw = merge(BASE, {"stop": {"requests": 300}, "engine": {"num_scheduler_steps": 4, "max_num_seqs": 16},
                           "step_time": {"model": "roofline"},
                           "workload": {"arrival": {"process": "poisson", "rate": 40.0},
                                        "output": {"dist": "uniform", "min": 1, "max": 50}}})
    elif case == "prefix-sessions":
        raw = merge(BASE, {"stop": {"requests": 200}, "engine": {"enable_prefix_caching": True, "max_num_seqs": 16},
                           "step_time": {"model": "roofline"}})
        raw["workload"] = {"arrival": {"process": "poisson", "rate": 5.0},
                           "sessions": {"turns": {"dist": "geometric", "mean": 3, "max": 6},
                                        "think_s": 0.5, "new_input": {"dist": "fixed", "value": 40},
                                        "output": {"dist": "fixed", "value": 20}, "system_prompt_tokens": 64}}
    elif case == "priority-aging":
        raw = merge(BASE, {"stop": {"requests": 400, "warmup_requests": 20},
                           "engine": {"scheduler": "priority", "max_num_seqs": 8, "num_gpu_blocks_override": 40,
                                      "options": {"aging_s": 0.05}},
                           "workload": {"arrival": {"process": "gamma", "rate": 80.0, "cv": 3.0},
                                        "prompt": {"dist": "uniform", "min": 1, "max": 100},
                                        "output": {"dist": "uniform", "min": 1, "max": 40},
                                        "classes": {"weights": [1, 1, 1, 1, 1]}}})
    else:
        raw = merge(BASE, {"stop": {"requests": 300}, "engine": {"scheduler": "static-fifo", "max_batch_size": 6,
                                                                 "options": {"micro_batch_size": 2}},
                           "workload": {"arrival": {"process": "closed", "clients": 9, "think_s": 0.0}}})
    assert_identical(run(raw), run(raw, fleet=True))


# ------------------------------------------------------------------------ compiled = python
@st.composite
def fleets(draw):
    raw = draw(scenarios())
    groups = [{"replicas": draw(st.integers(1, 3))}]
    if draw(st.booleans()):
        # a static batch larger than the slots is refused (issue 26): the group's slots stay >= it
        lo = raw["engine"].get("max_batch_size", 1)
        groups.append({"replicas": draw(st.integers(1, 2)),
                       "engine": {"pipeline_parallel_size": 2, "max_num_seqs": draw(st.integers(min(lo, 8), 8))}})
    router = draw(st.sampled_from(router_names()))
    delay = draw(st.sampled_from([0.0, 0.003]))
    raw["engine"]["num_gpu_blocks_override"] = 2 * raw["engine"]["num_gpu_blocks_override"]  # (pp 2 halves it)
    return merge(raw, {"cluster": {"router": router, "groups": groups, "network_delay_s": delay,
                                   "router_overhead_s": delay / 3}})


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets())
def test_fleet_compiled_equals_python(raw):
    a, b = run(raw, "python"), run(raw, "compiled")
    assert_identical(a, b, fleet_keys=())
    np.testing.assert_array_equal(a.requests["replica"].to_numpy(), b.requests["replica"].to_numpy())


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets())
def test_fleet_compiled_equals_python_many(raw):
    test_fleet_compiled_equals_python.hypothesis.inner_test(raw)


# --------------------------------------------------------- routing first = the event loop
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets(), st.sampled_from(["compiled", "python"]))
def test_prerouted_fleet_equals_the_event_loop(raw, engine):
    """Open loop and a router that reads no load: routing every request first and running each
    replica alone gives what the event loop gives."""
    import servesim.engine.fleet_build as fb

    raw = merge(raw, {"cluster": {"router": "round-robin" if raw["seed"] % 2 else "random"}})
    raw["cluster"]["groups"] = [{"replicas": g["replicas"]} for g in raw["cluster"]["groups"]]
    a_b = build(scenario_from_dict(merge(raw, {"sim": {"engine": engine}})))
    fb.PREROUTE = False
    try:
        e_b = build(scenario_from_dict(merge(raw, {"sim": {"engine": engine}})))
    finally:
        fb.PREROUTE = True
    closed = raw["workload"]["arrival"]["process"] == "closed"
    assert a_b.replica.prerouted == (not closed) and not e_b.replica.prerouted
    a, e = run_built(a_b), run_built(e_b)
    assert_identical(a, e, fleet_keys=())
    np.testing.assert_array_equal(a.requests["replica"].to_numpy(), e.requests["replica"].to_numpy())


def _rows_as_dicts(summary: dict) -> dict:
    """``summary`` with its cluster's per-replica list as a dict by position (compared per field)."""
    cluster = dict(summary["cluster"], per_replica=dict(enumerate(summary["cluster"]["per_replica"])))
    return dict(summary, cluster=cluster)


def test_large_fleets_get_smaller_buffers_and_the_same_results():
    """A fleet engine's scratch and recorder buffers are sized to its share of the requests, and
    shrink past 256 engines (the fleet's address space stays bounded); that only cuts fast-path
    runs and flushes more often."""
    from servesim import scenario_from_dict
    from servesim.engine.fleet_build import fleet_buffers
    from servesim.sched.state import MAX_RUN_STEPS, STEP_BUFFER
    from servesim.simulate import build, run_built
    from tests.test_fastpath_exact import assert_summaries_equal

    assert fleet_buffers(256) == (MAX_RUN_STEPS, STEP_BUFFER)
    assert fleet_buffers(300) == (STEP_BUFFER // 4, STEP_BUFFER // 2)
    assert fleet_buffers(10**6) == (1024, 2048)
    # sized to the engine's share of the run's requests (32 rows a request, at least 512), a lone engine never
    assert fleet_buffers(1, 10) == (MAX_RUN_STEPS, STEP_BUFFER)
    assert fleet_buffers(24, 20_000) == (MAX_RUN_STEPS, STEP_BUFFER)  # 834 requests each: 32,768 rows
    assert fleet_buffers(1024, 20_000) == (512, 1024)  # 20 each: 640 -> 1,024
    assert fleet_buffers(16384, 20_000) == (256, 512)
    assert fleet_buffers(300, 3000) == (256, 512)  # the run below
    raw = {"name": "big", "seed": 3, "stop": {"requests": 3000}, "hardware": {"gpu": "a100-80g", "replicas": 300},
           "model": "llama-3-8b", "engine": {"scheduler": "vllm"}, "step_time": {"model": "roofline"},
           "workload": {"arrival": {"process": "poisson", "rate": 2000.0},
                        "prompt": {"dist": "uniform", "min": 50, "max": 500},
                        "output": {"dist": "uniform", "min": 100, "max": 3000}},
           "cluster": {"router": "least-tokens"}}
    sc = scenario_from_dict(raw, "big")
    scaled = run_built(build(sc))  # fleet_buffers(300, 3000): 512 rows
    full = run_built(build(sc, buffers=(MAX_RUN_STEPS, STEP_BUFFER)))
    tiny = run_built(build(sc, buffers=(64, 128)))  # runs cut and buffers flushed all the time
    # (per-replica rows compared field by field: their KV means and busy shares are time averages)
    assert_summaries_equal(_rows_as_dicts(scaled.summary), _rows_as_dicts(full.summary))
    # every request's timestamps are the same; time averages are summed in other chunks, so they
    # may move in the last bits
    cols = ["arrival_s", "first_token_s", "finish_s", "preemptions"]
    assert tiny.requests[cols].equals(full.requests[cols])
    assert tiny.summary["kv"]["mean_usage"] == pytest.approx(full.summary["kv"]["mean_usage"], rel=1e-12)
    assert tiny.summary["engine"]["busy_fraction"] == pytest.approx(full.summary["engine"]["busy_fraction"], rel=1e-12)
