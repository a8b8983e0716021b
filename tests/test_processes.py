"""Processes on the run's clock (servesim/engine/processes.py).

1. The fleet (and the lone replica) yields to SimPy's next event and goes on: with processes that
   only wake up and look, every result is bit for bit the undisturbed run's (lone, fleets with
   load-reading and stateless routers, closed loops, pipeline replicas).
2. A process waking every few simulated seconds sees exactly the requests that requests.parquet
   says had finished by then.
3. Actions: a rate change moves the arrivals not yet sent by the time warp it promises; a
   drained replica gets no new request; a stale router view changes routing only when asked.
"""

from __future__ import annotations

import numpy as np
import pytest

from servesim import scenario_from_dict, simulate
from servesim.errors import ScenarioError
from tests.conftest import BASE, merge
from tests.test_cluster_identity import assert_identical

FLEET = {"hardware": {"replicas": 3}, "cluster": {"router": "least-requests"}}
CLOSED = {"workload": {"arrival": {"process": "closed", "clients": 6, "think_s": 0.05}}}
LONGER = {"stop": {"requests": 300}, "workload": {"arrival": {"process": "poisson", "rate": 60.0},
                                                  "output": {"dist": "uniform", "min": 2, "max": 60}}}


def looker(every: float, seen: list):
    def look(env, fleet):
        while True:
            seen.append((env.now, fleet.completed(), fleet.completed_ids().copy(), fleet.queue_lengths().copy(),
                         fleet.running().copy(), fleet.kv_used().copy(), fleet.outstanding().copy()))
            yield env.timeout(every)
    return look


CASES = {
    "lone": {},
    "lone-closed": CLOSED,
    "fleet-least-requests": FLEET,
    "fleet-least-tokens": merge(FLEET, {"cluster": {"router": "least-tokens"}}),
    "fleet-round-robin": merge(FLEET, {"cluster": {"router": "round-robin"}}),
    "fleet-closed": merge(FLEET, CLOSED),
    "fleet-pipeline": merge(FLEET, {"hardware": {"pp": 2, "gpus_per_replica": 2}}),
    "fleet-duration": merge(FLEET, {"stop": {"requests": None, "duration_s": 3.0}}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_processes_that_only_look_change_nothing(case):
    sc = scenario_from_dict(merge(merge(BASE, LONGER), CASES[case]))
    alone = simulate(sc)
    seen: list = []
    watched = simulate(sc, processes=[looker(0.37, seen)])
    assert len(seen) > 5
    assert_identical(alone, watched, fleet_keys=("cluster", "processes", "scaling"))
    if "cluster" in alone.summary:
        a, w = dict(alone.summary["cluster"]), dict(watched.summary["cluster"])
        assert a == w
    assert watched.summary["processes"]["names"][0].startswith("looker")
    assert "processes" not in alone.summary


@pytest.mark.parametrize("case", ["lone", "fleet-least-requests", "fleet-closed"])
def test_a_process_sees_exactly_the_requests_finished_by_then(case, tmp_path):
    import pandas as pd

    sc = scenario_from_dict(merge(merge(BASE, LONGER), CASES[case]))
    seen: list = []
    res = simulate(sc, processes=[looker(0.5, seen)])
    res.write(tmp_path)
    req = pd.read_parquet(tmp_path / "requests.parquet")
    finished = req[req.status == "finished"]
    assert len(finished) == len(req)  # (every request finishes in this scenario)
    t_finish = finished.finish_s  # (exact: no tolerance; a finish at 1.0000000000000007 is after 1.0)
    checked = 0
    for now, count, ids, *_ in seen:
        expect = np.sort(finished.index[t_finish.to_numpy() <= now].to_numpy())
        assert count == len(expect), (now, count, len(expect))
        np.testing.assert_array_equal(np.sort(ids), expect)
        checked += 0 < count < len(req)
    assert checked >= 3  # (looked mid-run, not only before and after)


def test_observations_follow_the_state():
    sc = scenario_from_dict(merge(merge(BASE, LONGER), FLEET))
    seen: list = []
    res = simulate(sc, processes=[looker(0.25, seen)])
    n = len(res.requests)
    assert all(len(q) == 3 and len(r) == 3 and len(k) == 3 and len(o) == 3 for _, _, _, q, r, k, o in seen)
    assert any(r.sum() > 0 for *_, r, _, _ in seen)
    assert all(((k >= 0) & (k <= 1)).all() for *_, k, _ in seen)
    # at the end nothing is outstanding; mid-run, some request is
    assert any(o.sum() > 0 for *_, o in seen)
    assert seen[-1][1] <= n


def test_set_rate_warps_the_arrivals_not_yet_sent():
    sc = scenario_from_dict(merge(BASE, LONGER))
    base = simulate(sc).requests.arrival_s.to_numpy()

    def double_at_2(env, fleet):
        yield env.timeout(2.0)
        fleet.set_rate(2.0)

    res = simulate(sc, processes=[double_at_2])
    got = res.requests.arrival_s.to_numpy()
    before = base <= 2.0
    np.testing.assert_array_equal(got[before], base[before])
    np.testing.assert_allclose(got[~before], 2.0 + (base[~before] - 2.0) / 2.0, rtol=0, atol=1e-12)
    assert res.summary["processes"]["actions"] == {"set_rate": 1}


def test_a_rate_schedule_compounds_from_the_base_rate():
    raw = merge(merge(BASE, LONGER), {"rate_schedule": {"steps": [{"at_s": 1.0, "factor": 2.0},
                                                                   {"at_s": 2.0, "factor": 0.5}]}})
    base = simulate(scenario_from_dict(merge(BASE, LONGER))).requests.arrival_s.to_numpy()
    got = simulate(scenario_from_dict(raw)).requests.arrival_s.to_numpy()
    # base time b -> real time: b (b <= 1); 1 + (b - 1) / 2 (b <= 3); 2 + (b - 3) * 2
    expect = np.where(base <= 1, base, np.where(base <= 3, 1 + (base - 1) / 2, 2 + (base - 3) * 2))
    np.testing.assert_allclose(got, expect, rtol=0, atol=1e-9)


def test_a_diurnal_curve_follows_its_factor():
    raw = merge(merge(BASE, {"stop": {"requests": 2000}, "workload": {"arrival": {"rate": 50.0}}}),
                {"rate_schedule": {"diurnal": {"period_s": 20.0, "amplitude": 0.8, "peak_s": 5.0, "step_s": 1.0}}})
    got = simulate(scenario_from_dict(raw)).requests.arrival_s.to_numpy()
    peak = np.count_nonzero((got >= 3) & (got < 7))  # factor ~1.7 over 4 s: ~340 requests
    trough = np.count_nonzero((got >= 13) & (got < 17))  # factor ~0.3: ~60
    assert peak > 3 * trough, (peak, trough)


def test_a_drained_replica_gets_no_new_request():
    sc = scenario_from_dict(merge(merge(BASE, LONGER), FLEET))

    def drain_1(env, fleet):
        yield env.timeout(1.0)
        fleet.drain(1)
        yield env.timeout(1.0)
        fleet.resume(1)

    res = simulate(sc, processes=[drain_1])
    r = res.requests
    sent = r.arrival_s.to_numpy()
    mid = (sent > 1.0 + 1e-9) & (sent <= 2.0)
    assert mid.sum() > 20
    assert not (r.replica.to_numpy()[mid] == 1).any()
    assert (r.replica.to_numpy()[sent > 2.0] == 1).any()
    assert res.summary["processes"]["actions"] == {"drain": 1, "resume": 1}


def test_every_replica_drained_is_refused():
    sc = scenario_from_dict(merge(merge(BASE, LONGER), FLEET))

    def drain_all(env, fleet):
        yield env.timeout(0.5)
        for r in range(fleet.replicas):
            fleet.drain(r)

    with pytest.raises(ValueError, match="every replica would be drained"):
        simulate(sc, processes=[drain_all])


@pytest.mark.parametrize("act, says", [("drain", "drain/resume: a lone replica has no router"),
                                       ("fail", "fail: a lone replica has no router")])
def test_a_lone_replica_has_no_router_to_act_on(act, says):
    """A lone replica is a solo fleet of one (engine/cluster.py): as before, it has no router a
    process may act on. Its load is what reached it and has not ended."""
    loads = []

    def act_at_1(env, fleet):
        yield env.timeout(1.0)
        loads.append(fleet.outstanding().copy())
        getattr(fleet, act)(0)

    with pytest.raises(ValueError, match=says):
        simulate(scenario_from_dict(merge(BASE, LONGER)), processes=[act_at_1])
    assert loads[0].shape == (1,) and loads[0][0] > 0


def test_a_fleet_of_one_refuses_to_drain_its_only_replica():
    """A ``cluster:`` fleet of one runs solo too; draining its one replica is refused, as for
    every replica of a routed fleet."""
    def drain_at_1(env, fleet):
        yield env.timeout(1.0)
        fleet.drain(0)

    one = merge(merge(BASE, LONGER), {"cluster": {"groups": [{"replicas": 1}]}})
    with pytest.raises(ValueError, match="every replica would be drained"):
        simulate(scenario_from_dict(one), processes=[drain_at_1])


def test_router_refresh_makes_the_router_read_stale_loads():
    raw = merge(merge(BASE, LONGER), FLEET)
    exact = simulate(scenario_from_dict(raw))
    zero = simulate(scenario_from_dict(merge(raw, {"cluster": {"router_refresh_s": 0.0}})))
    assert_identical(exact, zero)
    seen: list = []
    stale = simulate(scenario_from_dict(merge(raw, {"cluster": {"router_refresh_s": 1.0}})),
                     processes=[looker(1.0, seen)])  # (wakes right after each refresh, at 0, 1, 2, ...)
    rep = stale.requests.replica.to_numpy()
    arr = stale.requests.arrival_s.to_numpy()
    assert not np.array_equal(rep, exact.requests.replica.to_numpy())
    windows = 0
    for now, *_, loads in seen:
        # a request arriving in (now, now + 1] goes to a replica least loaded at the refresh at now
        mine = (arr > now) & (arr <= now + 1.0)
        if mine.any():
            least = np.flatnonzero(loads == loads.min())
            assert np.isin(rep[mine], least).all(), (now, loads, np.unique(rep[mine]))
            windows += len(least) < 3
    assert windows >= 2  # (some refresh saw unequal loads)


def test_scenario_processes_by_import_path():
    raw = merge(merge(BASE, LONGER), {"processes": ["tests.test_processes:halve_at_1"]})
    res = simulate(scenario_from_dict(raw))
    assert res.summary["processes"] == {"names": ["halve_at_1"], "actions": {"set_rate": 1}}
    with pytest.raises(ScenarioError, match="cannot import"):
        simulate(scenario_from_dict(merge(raw, {"processes": ["tests.nowhere:f"]})))
    with pytest.raises(ScenarioError, match="processes"):
        scenario_from_dict(merge(raw, {"processes": ["no colon"]}))
    with pytest.raises(ScenarioError, match="not a generator"):
        simulate(scenario_from_dict(BASE), processes=[lambda env, fleet: None])


def halve_at_1(env, fleet):
    yield env.timeout(1.0)
    fleet.set_rate(0.5)


def test_the_documented_examples_run():
    """docs/processes.md's examples run as written (the scaler by draining, the watcher)."""
    import re

    from tests.conftest import REPO

    text = (REPO / "docs" / "processes.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    ns: dict = {}
    exec(next(b for b in blocks if "def scale" in b), ns)  # noqa: S102 - the repository's own doc
    watch_src = next(b for b in blocks if "def watch" in b).split("sc = servesim")[0]
    exec(watch_src, ns)  # noqa: S102
    sc = scenario_from_dict(merge(merge(BASE, LONGER), merge(FLEET, {"hardware": {"replicas": 4}})))
    res = simulate(sc, processes=[ns["scale"], ns["watch"]])
    assert res.summary["processes"]["actions"].get("drain", 0) >= 1
    assert len(res.requests) == 300 and (res.requests.status == "finished").all()  # none lost
