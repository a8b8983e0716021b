"""Replica failures (cluster.faults; FleetHandle.fail / repair; Fleet.fail_replica)."""

from __future__ import annotations

import numpy as np
import pytest

from servesim import scenario_from_dict, simulate
from servesim.errors import ScenarioError
from tests.conftest import BASE, merge

FLEET = merge(BASE, {
    "stop": {"requests": 400},
    "hardware": {"replicas": 3},
    "engine": {"max_num_seqs": 4},
    "step_time": {"model": "constant", "seconds": 0.02},
    "workload": {"arrival": {"process": "poisson", "rate": 40.0},
                 "output": {"dist": "uniform", "min": 10, "max": 60}},
    "cluster": {"router": "least-requests"},
})
SCHEDULE = {"cluster": {"faults": {"schedule": [{"replica": 1, "at_s": 2.0, "down_s": 2.0}]}}}


def test_a_failed_replicas_requests_are_retried_elsewhere_and_none_is_lost():
    plain = simulate(scenario_from_dict(FLEET))
    res = simulate(scenario_from_dict(merge(FLEET, SCHEDULE)))
    r = res.requests
    f = res.summary["faults"]
    assert (r.status == "finished").all() and len(r) == 400  # no request lost
    assert f["failures"] == 1 and f["repairs"] == 1 and f["lost"] == 0 and f["retried"] > 0
    assert f["down_s"] == pytest.approx(2.0)
    # latencies still count from each request's first arrival
    np.testing.assert_array_equal(r.arrival_s.to_numpy(), plain.requests.arrival_s.to_numpy())
    # replica 1 finished only what it ended before the failure, and served again after repair
    on1 = r[r.replica == 1]
    assert ((on1.finish_s <= 2.0) | (on1.arrival_s > 4.0)).all()
    assert (on1.arrival_s > 4.0).any()
    # the retried requests ran again from scratch: slower than in the undisturbed run
    moved = (plain.requests.replica == 1) & (plain.requests.finish_s > 2.0) & (plain.requests.arrival_s <= 2.0)
    assert moved.sum() >= f["retried"] > 0
    assert r.e2e_s[moved].mean() > plain.requests.e2e_s[moved].mean()


def test_lost_requests_are_counted_and_marked():
    res = simulate(scenario_from_dict(merge(FLEET, merge(SCHEDULE, {"cluster": {"faults": {"on_failure": "lost"}}}))))
    r = res.requests
    f = res.summary["faults"]
    lost = r[r.reject_reason == "replica_failed"]
    assert f["lost"] == len(lost) > 0 and f["retried"] == 0
    assert (lost.replica == 1).all() and (lost.arrival_s <= 2.0).all()
    assert (r.status == "finished").sum() == 400 - len(lost)


def test_random_failures_are_seeded_and_repaired():
    raw = merge(FLEET, {"stop": {"requests": 1200}, "cluster": {"faults": {"mtbf_s": 6.0, "mttr_s": 1.0}}})
    a = simulate(scenario_from_dict(raw))
    b = simulate(scenario_from_dict(raw))
    assert a.summary["faults"] == b.summary["faults"]
    assert a.summary["faults"]["failures"] >= 2
    assert (a.requests.status == "finished").all()
    np.testing.assert_array_equal(a.requests.finish_s.to_numpy(), b.requests.finish_s.to_numpy())
    other = simulate(scenario_from_dict(raw), seed=2)
    assert other.summary["faults"] != a.summary["faults"] or not np.array_equal(
        other.requests.finish_s.to_numpy(), a.requests.finish_s.to_numpy())


def test_closed_loop_clients_go_on_after_a_loss():
    raw = merge(merge(FLEET, {"workload": {"arrival": {"process": "closed", "clients": 8, "think_s": 0.05}}}),
                merge(SCHEDULE, {"cluster": {"faults": {"on_failure": "lost"}}}))
    res = simulate(scenario_from_dict(raw))
    r = res.requests
    assert len(r) == 400 and res.summary["faults"]["lost"] > 0
    assert ((r.status == "finished") | (r.reject_reason == "replica_failed")).all()


def test_faults_need_a_fleet():
    with pytest.raises(ScenarioError, match="cluster.faults: needs a fleet"):
        simulate(scenario_from_dict(merge(BASE, {"cluster": {"faults": {"mtbf_s": 10}}})))
    with pytest.raises(ScenarioError, match="replica 7 is not one of 0..2"):
        simulate(scenario_from_dict(merge(FLEET, {"cluster": {"faults": {"schedule": [{"replica": 7, "at_s": 1}]}}})))
    with pytest.raises(ScenarioError, match="mtbf_s"):
        scenario_from_dict(merge(FLEET, {"cluster": {"faults": {"mttr_s": 5}}}))


def test_the_failures_example_runs_without_losing_a_request():
    from servesim import load_scenario
    from tests.conftest import REPO

    sc = load_scenario(REPO / "scenarios" / "examples" / "failures.yaml",
                       ["stop.duration_s=600", "cluster.faults.mtbf_s=300", "cluster.faults.mttr_s=60"])
    res = simulate(sc)
    f = res.summary["faults"]
    assert f["failures"] >= 1 and f["lost"] == 0
    assert not (res.requests.reject_reason == "replica_failed").any()


def test_failures_compiled_equal_uncompiled():
    """A restarted replica is rebuilt the same way on both engines: every result equal, the
    cluster, processes, scaling and faults blocks included."""
    from tests.test_cluster_identity import assert_identical

    raw = merge(merge(FLEET, SCHEDULE), {"stop": {"requests": 200}})
    a = simulate(scenario_from_dict(merge(raw, {"sim": {"engine": "compiled"}})))
    b = simulate(scenario_from_dict(merge(raw, {"sim": {"engine": "python"}})))
    assert_identical(a, b, fleet_keys=())
    assert a.summary["faults"]["retried"] > 0


def test_a_failed_replica_loses_its_prefix_cache():
    raw = merge(FLEET, {"stop": {"requests": 300}, "engine": {"enable_prefix_caching": True}})
    raw["workload"] = {"arrival": {"process": "poisson", "rate": 15.0},
                       "sessions": {"turns": {"dist": "fixed", "value": 3}, "think_s": 0.2,
                                    "new_input": {"dist": "fixed", "value": 64},
                                    "output": {"dist": "fixed", "value": 16}}}
    plain = simulate(scenario_from_dict(raw))
    seen = {}

    def look(env, fleet):
        yield env.timeout(1.9)
        seen["before"] = fleet.kv_used()[1]
        yield env.timeout(0.1)  # (at 2.0, after the failure: the schedule's process runs first)
        seen["after"] = fleet.kv_used()[1]

    failed = simulate(scenario_from_dict(merge(raw, SCHEDULE)), processes=[look])
    assert seen["before"] > 0 and seen["after"] == 0  # its KV (and prefix cache) went with it
    assert (failed.requests.status == "finished").all() and failed.summary["faults"]["retried"] > 0
    # every lookup counts, the failed replica's before its failure too: more lookups (the retried
    # requests look again) and its cache lost (the turns it held lose their history there)
    pc, pp = failed.summary["kv"]["prefix_cache"], plain.summary["kv"]["prefix_cache"]
    assert pc["query_tokens"] > pp["query_tokens"]
    assert pc["query_tokens"] >= int(failed.requests.prompt_tokens.sum())
