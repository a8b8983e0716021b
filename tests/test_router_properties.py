"""Routers (servesim/engine/router.py): their rules on generated loads, and in whole fleets no
request is lost or sent twice, affinity holds, the load cap holds."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim import scenario_from_dict
from servesim.engine.router import Affinity, LeastRequests, LeastTokens, LoadView, PriorityRouter, RandomRouter, RoundRobin
from servesim.request import FINISHED, PENDING, REJECTED
from servesim.simulate import build, run_built
from servesim.testing.strategies import router_names
from tests.conftest import BASE, merge, sessions_fleet


def view(loads, tokens=None):
    loads = np.asarray(loads)
    tok = np.asarray(tokens if tokens is not None else loads)
    return LoadView(len(loads), lambda: loads, lambda: tok)


# ------------------------------------------------------------------------ rules on loads
@given(st.lists(st.lists(st.integers(0, 5), min_size=4, max_size=4), min_size=1, max_size=30))
def test_least_requests_picks_a_least_loaded_replica_and_spreads_ties(rounds):
    r = LeastRequests(4)
    for loads in rounds:
        before = r.ptr
        c = r.choose(0, 0, view(loads))
        assert loads[c] == min(loads)
        # the first least-loaded replica at or after the pointer
        order = [(before + j) % 4 for j in range(4)]
        assert c == next(i for i in order if loads[i] == min(loads))
    equal = LeastRequests(5)
    assert [equal.choose(0, 0, view([0] * 5)) for _ in range(10)] == [0, 1, 2, 3, 4] * 2


@given(st.lists(st.integers(0, 1000), min_size=1, max_size=8), st.integers(0, 4))
def test_least_tokens_reads_tokens_not_requests(tokens, klass):
    n = len(tokens)
    r = LeastTokens(n)
    c = r.choose(0, klass, view(list(range(n, 0, -1)), tokens))
    assert tokens[c] == min(tokens)


def test_round_robin_and_priority():
    rr = RoundRobin(3)
    assert [rr.choose(i, 0, view([9, 9, 9])) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    p = PriorityRouter(3)
    tokens = [50, 10, 30]
    assert p.choose(0, 0, view([0, 0, 0], tokens)) == 1  # P0: least work
    assert [p.choose(i, 2, view([0, 0, 0], tokens)) for i in range(4)] == [0, 1, 2, 0]  # others: round robin


@given(st.integers(1, 9), st.lists(st.integers(0, 50), min_size=1, max_size=6), st.integers(0, 99))
def test_routing_many_at_once_is_routing_one_by_one(n, sizes, seed):
    for make in (lambda: RoundRobin(n), lambda: RandomRouter(n, np.random.default_rng(seed), block=7)):
        one, many = make(), make()
        singles = [one.choose(i, 0, None) for i in range(sum(sizes))]
        assert np.concatenate([many.choose_many(m) for m in sizes]).tolist() == singles


def test_random_router_is_its_stream_in_any_block_size():
    a = RandomRouter(7, np.random.default_rng(3), block=5)
    b = RandomRouter(7, np.random.default_rng(3), block=4096)
    xs = [a.choose(i, 0, None) for i in range(40)]
    assert xs[:5] == list(np.random.default_rng(3).integers(0, 7, 5))
    assert all(0 <= x < 7 for x in xs)
    assert len(set(xs)) > 3
    assert [b.choose(i, 0, None) for i in range(5)] == xs[:5]


@given(st.lists(st.tuples(st.integers(0, 6), st.lists(st.integers(0, 9), min_size=5, max_size=5)),
                min_size=1, max_size=60),
       st.floats(1.0, 3.0))
def test_affinity_binds_keys_and_respects_the_load_cap(events, cap):
    n = 5
    keys = np.array([k for k, _ in events], dtype=np.int64)
    has = keys != 0  # key 0: no key
    r = Affinity(n, keys, has, cap)
    first: dict[int, int] = {}
    for rid, (k, loads) in enumerate(events):
        loads = np.array(loads)
        c = r.choose(rid, 0, view(loads))
        limit = math.ceil(cap * (loads.sum() + 1) / n)
        assert loads[c] + 1 <= limit  # the load cap holds for every request sent
        if not has[rid]:
            assert loads[c] == loads.min()
            continue
        if k not in first:
            first[k] = c
            assert loads[c] == loads.min()
        elif loads[first[k]] < limit:
            assert c == first[k]  # affinity: its key's replica while that one has room
        else:
            assert loads[c] == loads.min()  # overflow: the least loaded; the binding stays
        assert r.bound[k] == first[k]


# --------------------------------------------------------------------------- whole fleets
@st.composite
def fleet_runs(draw):
    n = draw(st.integers(2, 5))
    router = draw(st.sampled_from(router_names()))
    closed = draw(st.booleans())
    arrival = ({"process": "closed", "clients": draw(st.integers(1, 12)), "think_s": draw(st.sampled_from([0.0, 0.01]))}
               if closed else {"process": "poisson", "rate": draw(st.floats(20.0, 400.0))})
    stop = {"requests": draw(st.integers(10, 120))}
    if draw(st.booleans()):
        stop["duration_s"] = draw(st.floats(0.1, 2.0))
    return merge(BASE, {
        "seed": draw(st.integers(0, 1000)), "stop": stop,
        "engine": {"max_num_seqs": draw(st.integers(1, 6)), "num_gpu_blocks_override": draw(st.integers(8, 40)),
                   "max_model_len": 128},
        "hardware": {"replicas": n},
        "cluster": {"router": router},
        "workload": {"arrival": arrival, "prompt": {"dist": "uniform", "min": 1, "max": 120},
                     "output": {"dist": "uniform", "min": 1, "max": 30},
                     "classes": {"weights": [1, 1, 1]}},
        "sim": {"check_invariants": True},
    })


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleet_runs())
def test_no_request_lost_or_duplicated(raw):
    b = build(scenario_from_dict(raw))
    res = run_built(b)
    fleet, t = b.replica, b.table
    routed = fleet.replica_of >= 0
    # every request that reached a replica was routed there, once; a request is given a replica
    # exactly when it reached one (sent after the run ended: none)
    assert (routed == (t.status != PENDING)).all()
    per_replica = np.bincount(fleet.replica_of[routed], minlength=len(fleet.replicas))
    sent = [sum(fleet.engines[e].routed for e in r) for r in fleet.replicas]
    assert all(a <= s for a, s in zip(per_replica, sent)) and sum(sent) == int(fleet.routed.sum())
    if raw["stop"].get("duration_s") is None:
        assert per_replica.tolist() == sent
    # each engine ended exactly the requests of its own that finished or were rejected
    ended = (t.status == FINISHED) | (t.status == REJECTED)
    for r, members in enumerate(fleet.replicas):
        assert sum(fleet.engines[e].s.get_i("ended") for e in members) == int((ended & (fleet.replica_of == r)).sum())
    assert res.summary["requests"]["completed"] + res.summary["requests"]["rejected"] == int(ended.sum())
    c = res.summary["cluster"]
    assert sum(x["requests"] for x in c["per_replica"]) == int(routed.sum())
    if raw["stop"].get("duration_s") is None:  # drained: everything sent arrived and ended
        assert int(routed.sum()) == raw["stop"]["requests"] and ended[routed].all()


def _sessions(router="affinity", cap=1.25, requests=400):
    raw = sessions_fleet(router, requests=requests)
    if router == "affinity":
        raw["cluster"]["affinity"] = {"key": "session", "load_cap": cap}
    return raw


def test_affinity_keeps_sessions_on_one_replica_and_the_cap_holds():
    b = build(scenario_from_dict(_sessions(cap=1000.0)))
    b.replica.decisions = []
    res = run_built(b)
    sess = b.workload.session
    rep = b.replica.replica_of
    for s in np.unique(sess[sess >= 0]):
        assert len(set(rep[sess == s].tolist())) == 1  # no overflow at this cap: one replica per session
    assert res.summary["cluster"]["affinity"]["overflows"] == 0
    # a tight cap: overflows happen, and every decision kept the chosen replica within the cap
    b = build(scenario_from_dict(_sessions(cap=1.0)))
    b.replica.decisions = []
    res = run_built(b)
    assert res.summary["cluster"]["affinity"]["overflows"] > 0
    for rid, r, loads in b.replica.decisions:
        assert loads[r] + 1 <= math.ceil(1.0 * (loads.sum() + 1) / 4), (rid, r, loads)


def test_affinity_raises_prefix_hits_over_round_robin():
    """Sessions' history is cached where they ran before: affinity finds it, round robin mostly not."""
    aff = run_built(build(scenario_from_dict(_sessions(cap=2.0))))
    rr = run_built(build(scenario_from_dict(_sessions("round-robin"))))
    assert aff.summary["kv"]["prefix_hit_rate"]["tokens"] > rr.summary["kv"]["prefix_hit_rate"]["tokens"] + 0.1


def test_affinity_without_keys_is_a_clear_error():
    from servesim.errors import ScenarioError

    raw = merge(BASE, {"hardware": {"replicas": 2}, "cluster": {"router": "affinity", "affinity": {"key": "session"}}})
    with pytest.raises(ScenarioError, match="affinity.key 'session'.*no sessions"):
        build(scenario_from_dict(raw))


def test_least_loaded_routers_see_the_loads_at_the_arrival():
    """least-requests picks, at every decision, a replica with the fewest outstanding requests."""
    raw = merge(BASE, {"stop": {"requests": 300}, "hardware": {"replicas": 3}, "cluster": {"router": "least-requests"},
                       "workload": {"arrival": {"process": "poisson", "rate": 300.0},
                                    "output": {"dist": "uniform", "min": 1, "max": 60}}})
    b = build(scenario_from_dict(raw))
    b.replica.decisions = []
    run_built(b)
    assert len(b.replica.decisions) == 300
    for rid, r, loads in b.replica.decisions:
        assert loads[r] == loads.min()
    assert max(x[2].max() for x in b.replica.decisions) >= 3  # the loads did build up
