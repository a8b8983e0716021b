"""The autoscaler (servesim/engine/autoscale.py) and replica accounting (summary.scaling)."""

from __future__ import annotations

import numpy as np
import pytest

from servesim import load_scenario, scenario_from_dict, simulate
from servesim.errors import ScenarioError
from tests.conftest import BASE, REPO, merge
from tests.test_cluster_identity import assert_identical

PEAK = merge(BASE, {
    "stop": {"requests": 1500},
    "hardware": {"replicas": 6},
    "engine": {"max_num_seqs": 4},
    "step_time": {"model": "constant", "seconds": 0.02},
    "workload": {"arrival": {"process": "poisson", "rate": 40.0},
                 "output": {"dist": "uniform", "min": 4, "max": 40}},
    "rate_schedule": {"steps": [{"at_s": 0, "factor": 0.5}, {"at_s": 10, "factor": 2.0}, {"at_s": 25, "factor": 0.3}]},
    "cluster": {"router": "least-requests",
                "autoscale": {"metric": "outstanding", "target": 3, "min_replicas": 1, "interval_s": 1.0,
                              "scale_up_delay_s": 2.0, "cooldown_s": 2.0}},
})


def integral(timeline, end):
    t = np.array([p[0] for p in timeline] + [end])
    k = np.array([p[1] for p in timeline], dtype=float)
    return float(np.sum(k * np.diff(t)))


def test_autoscaling_through_a_peak_loses_no_request_and_accounts_its_replicas():
    res = simulate(scenario_from_dict(PEAK))
    s = res.summary["scaling"]
    assert (res.requests.status == "finished").all() and len(res.requests) == 1500  # none lost
    # replica-seconds (per-slot spells) = the integral of the replica count over time
    assert s["replica_seconds"] == pytest.approx(integral(s["replicas_over_time"], res.summary["sim_time_s"]),
                                                 rel=1e-12)
    assert s["gpu_hours"] == pytest.approx(s["replica_seconds"] / 3600)  # one GPU a replica
    assert s["replicas_min"] == 1 and s["replicas_max"] >= 4  # it scaled up for the peak ...
    counts = dict((round(t), k) for t, k in s["replicas_over_time"])
    late = [k for t, k in s["replicas_over_time"] if t > 25]
    assert late and min(late) < s["replicas_max"]  # ... and down after it
    # a started replica serves only after its model loaded: no request reached a slot beyond the
    # first before the first look (1 s) plus the load delay (2 s)
    rep, arr = res.requests.replica.to_numpy(), res.requests.arrival_s.to_numpy()
    assert arr[rep > 0].min() >= 3.0
    assert res.summary["processes"]["actions"]["add_replica"] >= 3
    assert counts  # (the timeline is not empty)


def test_an_autoscaler_pinned_at_every_slot_changes_nothing():
    """min_replicas = the slots: it never acts; results equal the plain fleet's and the
    replica-seconds are replicas x the run's time."""
    raw = merge(PEAK, {"rate_schedule": None})
    raw.pop("rate_schedule")
    plain = dict(raw, cluster={"router": "least-requests"})
    pinned = merge(raw, {"cluster": {"autoscale": {"min_replicas": 6}}})
    a, b = simulate(scenario_from_dict(plain)), simulate(scenario_from_dict(pinned))
    assert_identical(a, b, fleet_keys=("cluster", "processes", "scaling"))
    s = b.summary["scaling"]
    assert s["replicas_over_time"] == [[0.0, 6]]
    assert s["replica_seconds"] == pytest.approx(6 * b.summary["sim_time_s"], rel=1e-12)


def test_autoscale_bounds_are_checked():
    with pytest.raises(ScenarioError, match="min_replicas 9 .* 6 replica slots"):
        simulate(scenario_from_dict(merge(PEAK, {"cluster": {"autoscale": {"min_replicas": 9}}})))
    with pytest.raises(ScenarioError, match="initial_replicas"):
        scenario_from_dict(merge(PEAK, {"cluster": {"autoscale": {"min_replicas": 3, "initial_replicas": 2}}}))


def test_the_autoscale_example_loads():
    sc = load_scenario(REPO / "scenarios" / "examples" / "autoscale.yaml")
    assert sc.cluster.autoscale is not None and sc.rate_schedule is not None
