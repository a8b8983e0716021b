"""Stop conditions: with both ``stop.requests`` and ``stop.duration_s`` the run ends at whichever
limit comes first (issue 17: the clock ran on to the duration after the last request, so a run of
74 s reported sim_time 10000 and a busy share and KV means diluted 100x)."""

from __future__ import annotations

import math

import pytest

from servesim import scenario_from_dict, simulate
from tests.conftest import BASE, merge

ENGINES = ["python", "compiled"]


def run(stop, arrival=None, engine="python", **patch):
    raw = merge(BASE, {"sim": {"engine": engine}, **patch})
    raw["stop"] = stop
    if arrival is not None:
        raw["workload"]["arrival"] = arrival
    return simulate(scenario_from_dict(raw))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("arrival", [{"process": "poisson", "rate": 10.0}, {"process": "closed", "clients": 3}])
def test_request_limit_first_ends_when_drained(engine, arrival):
    only = run({"requests": 50}, arrival, engine)
    both = run({"requests": 50, "duration_s": 10_000.0}, arrival, engine)
    assert both.summary["sim_time_s"] == only.summary["sim_time_s"] < 10
    for key in ("engine", "kv", "latency_s", "throughput"):
        assert both.summary[key] == only.summary[key], key
    assert both.summary["requests"]["completed"] == 50


@pytest.mark.parametrize("engine", ENGINES)
def test_duration_first_still_stops_the_clock_there(engine):
    """Only 45 of 500 requests arrive before 5 s: the duration is the binding limit, and the idle
    time after the last finish up to 5 s belongs to the observed window."""
    res = run({"requests": 500, "duration_s": 5.0}, engine=engine)
    assert res.summary["requests"]["arrived"] < 500
    assert res.summary["sim_time_s"] == 5.0
    dur = run({"duration_s": 5.0}, engine=engine)
    assert dur.summary["sim_time_s"] == 5.0
    assert math.isclose(res.summary["engine"]["busy_fraction"], dur.summary["engine"]["busy_fraction"])


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("prefix", [False, True])
def test_requests_arriving_at_the_final_boundary_are_in_the_system(engine, prefix):
    """A duration stop at a boundary where a closed loop's request is rejected at arrival (too
    large for a 4-block pool): its client's next request (think 0) arrives at that same instant.
    It was left unseen (status pending) while the summary counted it in flight: 3 in flight
    against 1 by the requests' statuses. Found by the strategies' duration-cut knob."""
    import numpy as np

    from servesim.request import FINISHED, PENDING, REJECTED, RUNNING, WAITING

    raw = {"name": "edge", "seed": 1, "stop": {"duration_s": 0.1454237288135593, "requests": 40},
           "sim": {"engine": "python" if prefix else engine},
           "engine": {"scheduler": "vllm", "max_num_seqs": 3, "max_num_batched_tokens": 512, "max_model_len": 512,
                      "num_gpu_blocks_override": 4, "block_size": 16, "enable_prefix_caching": prefix},
           "workload": {"arrival": {"process": "closed", "clients": 3, "think_s": 0.0, "think_dist": "fixed"},
                        "prompt": {"dist": "fixed", "value": 61}, "output": {"dist": "uniform", "min": 1, "max": 15}}}
    res = simulate(scenario_from_dict(raw))
    t, r = res.table, res.summary["requests"]
    counts = np.bincount(t.status, minlength=5)
    assert r["rejected"] > 0 and res.summary["sim_time_s"] > 0
    assert (r["completed"], r["rejected"], r["in_flight"]) == (
        counts[FINISHED], counts[REJECTED], counts[WAITING] + counts[RUNNING])
    unseen = (t.status == PENDING) & ~np.isnan(t.arrival) & (t.arrival <= res.summary["sim_time_s"])
    assert not unseen.any()


@pytest.mark.xfail(strict=True, reason="known gap (closing note 2026-12-01): a fleet's closed-loop successors sent at "
                   "the final instant stay unrouted while the summary counts them in flight")
def test_fleet_requests_arriving_at_the_final_instant_are_in_the_system():
    """The fleet counterpart of the test above: two replicas behind a router, the fleet inbox makes
    the closed loop's successors. Fails today (14 of 100 duration cuts of this scenario)."""
    import numpy as np

    from servesim.request import FINISHED, REJECTED, RUNNING, WAITING

    raw = {"name": "edge-fleet", "seed": 1, "stop": {"duration_s": 0.02, "requests": 40},
           "hardware": {"replicas": 2}, "cluster": {"router": "round-robin"},
           "engine": {"scheduler": "vllm", "max_num_seqs": 1, "max_num_batched_tokens": 512, "max_model_len": 512,
                      "num_gpu_blocks_override": 4, "block_size": 16},
           "workload": {"arrival": {"process": "closed", "clients": 3, "think_s": 0.0, "think_dist": "fixed"},
                        "prompt": {"dist": "fixed", "value": 61}, "output": {"dist": "uniform", "min": 1, "max": 15}}}
    res = simulate(scenario_from_dict(raw))
    counts = np.bincount(res.table.status, minlength=5)
    r = res.summary["requests"]
    assert (r["completed"], r["rejected"], r["in_flight"]) == (
        counts[FINISHED], counts[REJECTED], counts[WAITING] + counts[RUNNING])
