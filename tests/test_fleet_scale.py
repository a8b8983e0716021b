"""Fleet scale (issue 30): load-reading routers answer from incrementally kept loads
(engine/load_index.py) and decide exactly as the scan of every replica did, request by request."""

from __future__ import annotations

import numpy as np
import pytest

from servesim import scenario_from_dict
from servesim.engine.load_index import MinTree
from servesim.engine.router import LeastRequests
from servesim.simulate import build, run_built
from tests.conftest import BASE, merge

# decode runs (multi-step bursts) make a replica's tokens change with time between its events
LOADED = {"stop": {"requests": 600}, "hardware": {"replicas": 7},
          "engine": {"max_num_seqs": 16},
          "workload": {"arrival": {"process": "poisson", "rate": 400.0},
                       "prompt": {"dist": "uniform", "min": 10, "max": 400},
                       "output": {"dist": "uniform", "min": 1, "max": 120},
                       "classes": {"weights": [0.3, 0.7]}}}


def _decisions(raw: dict, scan: bool):
    b = build(scenario_from_dict(raw))
    b.replica.scan = scan
    b.replica.decisions = []
    res = run_built(b)
    return [(rid, r) for rid, r, _ in b.replica.decisions], res


@pytest.mark.parametrize("router", ["least-tokens", "least-requests", "priority"])
@pytest.mark.parametrize("extra", [{}, {"sim": {"engine": "python"}}, {"cluster": {"router_refresh_s": 0.05}},
                                   {"workload": {"arrival": {"process": "closed", "clients": 40, "think_s": 0.01}}},
                                   {"engine": {"num_scheduler_steps": 4}}, {"sim": {"fast_path": False}}],
                         ids=["compiled", "python", "refresh", "closed", "multistep", "single-step"])
def test_tree_routing_equals_the_scan_request_by_request(router, extra):
    raw = merge(merge(LOADED, extra), {"cluster": {"router": router}})
    raw = merge(BASE, raw)
    tree, res_tree = _decisions(raw, scan=False)
    scan, res_scan = _decisions(raw, scan=True)
    assert len(tree) >= 600 and tree == scan
    assert len(set(r for _, r in tree)) == 7  # every replica was used
    assert res_tree.requests.equals(res_scan.requests)


def test_tree_routing_equals_the_scan_with_pipeline_replicas():
    raw = merge(merge(BASE, LOADED), {"cluster": {"router": "least-tokens"}, "hardware": {"replicas": 3},
                                      "engine": {"pipeline_parallel_size": 2}})
    tree, _ = _decisions(raw, scan=False)
    scan, _ = _decisions(raw, scan=True)
    assert tree == scan and len(tree) >= 600


def test_min_tree_least_from_is_the_scan_rule():
    rng = np.random.default_rng(3)
    for n in (1, 2, 5, 8, 33):
        vals = rng.integers(0, 4, n)
        tree, scan = MinTree(vals), LeastRequests(n)
        ptr = 0
        for _ in range(200):
            i, v = int(rng.integers(n)), int(rng.integers(0, 4))
            vals[i] = v
            tree.set(i, v)
            want = scan.least(vals)  # (moves scan.ptr as a router would)
            got = tree.least_from(ptr)
            ptr = got + 1 if got + 1 < n else 0
            assert got == want and ptr == scan.ptr


def test_router_sample_power_of_d_choices():
    raw = merge(merge(BASE, LOADED), {"cluster": {"router": "least-tokens"}})
    exact, res_exact = _decisions(raw, scan=False)
    # d at least the replica count: every replica compared, the exact rule
    whole, _ = _decisions(merge(raw, {"cluster": {"router_sample": 7}}), scan=False)
    assert whole == exact
    two, res_two = _decisions(merge(raw, {"cluster": {"router_sample": 2}}), scan=False)
    again, _ = _decisions(merge(raw, {"cluster": {"router_sample": 2}}), scan=False)
    scanned, _ = _decisions(merge(raw, {"cluster": {"router_sample": 2}}), scan=True)
    assert two == again == scanned  # seeded from the run's router stream; the tree's loads are the scan's
    assert two != exact and len(set(r for _, r in two)) == 7
    other, _ = _decisions(merge(raw, {"seed": 2, "cluster": {"router_sample": 2}}), scan=False)
    assert other != two


def test_router_sample_on_a_router_that_reads_no_load_is_a_clear_error():
    from servesim.errors import ScenarioError

    raw = merge(BASE, {"hardware": {"replicas": 2}, "cluster": {"router": "round-robin", "router_sample": 2}})
    with pytest.raises(ScenarioError, match="router_sample 2 applies to routers least-requests"):
        scenario_from_dict(raw)


@pytest.mark.parametrize("cap", [1.0, 1.25])
def test_affinity_from_the_tree_equals_the_scan(cap):
    raw = merge(BASE, {"stop": {"requests": 500}, "hardware": {"replicas": 5},
                       "engine": {"max_num_seqs": 8, "enable_prefix_caching": True},
                       "cluster": {"router": "affinity", "affinity": {"key": "session", "load_cap": cap}}})
    raw["workload"] = {"arrival": {"process": "poisson", "rate": 30.0},
                       "sessions": {"turns": {"dist": "geometric", "mean": 4, "max": 8}, "think_s": 0.2,
                                    "new_input": {"dist": "fixed", "value": 32},
                                    "output": {"dist": "uniform", "min": 1, "max": 40}, "system_prompt_tokens": 64}}
    tree, res_tree = _decisions(raw, scan=False)
    scan, res_scan = _decisions(raw, scan=True)
    assert len(tree) >= 500 and tree == scan
    assert res_tree.summary["cluster"]["affinity"] == res_scan.summary["cluster"]["affinity"]
    assert res_tree.summary["cluster"]["affinity"]["overflows"] > 0  # the cap was reached


def _view(loads):
    from servesim.engine.router import LoadView

    return LoadView(len(loads), lambda: loads, lambda: loads)


@pytest.mark.parametrize("n", [1, 3, 16])
def test_router_sample_unset_or_whole_fleet_is_the_exact_rule(n):
    """d of 0 (unset) or >= N: the router never draws, and decides as the exact rule, request by
    request, over changing loads (the engines' side: test_router_sample_power_of_d_choices)."""
    from servesim.engine.router import LeastTokens

    rng = np.random.default_rng(5)
    exact = LeastTokens(n)
    routers = []
    for d in (0, n, n + 3):
        r = LeastTokens(n)
        r.sampling(d, np.random.default_rng(1))
        routers.append(r)
    loads = rng.integers(0, 5, n)
    for rid in range(300):
        want = exact.least(loads)
        assert [r.choose(rid, 0, _view(loads)) for r in routers] == [want] * 3
        loads[want] += int(rng.integers(1, 4))
        loads[int(rng.integers(0, n))] = max(0, loads[int(rng.integers(0, n))] - 2)
    assert all(r.sampled == 0 for r in routers)


@pytest.mark.parametrize("d", [1, 2, 3])
def test_router_sample_picks_the_least_of_d_draws_from_its_stream(d):
    """Power of d choices: each decision is the least loaded of the next d replicas the router's
    stream draws (ties: the first drawn; a drained replica drawn is drawn again), and the draws
    are the stream's ``integers(0, N)`` in order, so a run is reproducible from its seed."""
    from servesim.engine.router import LeastRequests

    n = 11
    rng = np.random.default_rng(d)
    r = LeastRequests(n)
    r.sampling(d, np.random.default_rng(42), block=7)
    replay = np.random.default_rng(42).integers(0, n, 10_000).tolist()
    k = 0
    loads = rng.integers(0, 4, n)
    counts = np.zeros(n, dtype=np.int64)
    for rid in range(2000):
        if rid == 1000:
            r.set_active(3, False)
        drawn = []
        while len(drawn) < d:
            x = replay[k]
            k += 1
            if not (rid >= 1000 and x == 3):
                drawn.append(x)
        best = min(drawn, key=lambda x: (loads[x], drawn.index(x)))
        got = r.choose(rid, 0, _view(loads))
        assert got == best and loads[got] == min(loads[x] for x in drawn)
        counts[got] += 1
        loads[got] += 1
        loads[int(rng.integers(0, n))] = max(0, loads[int(rng.integers(0, n))] - 1)
    assert r.sampled == 2000 and counts.min() > 0


@pytest.mark.parametrize("router", ["least-tokens", "least-requests"])
def test_router_sample_reads_alone_what_the_tree_holds(router):
    """A sampling router reads only the replicas it drew (FleetLoads.one), not the tree of every
    load: the same decisions as reading the tree brought up to date, request by request."""
    raw = merge(merge(BASE, LOADED), {"cluster": {"router": router, "router_sample": 2}})
    runs = []
    for alone in (True, False):
        b = build(scenario_from_dict(raw))
        if not alone:
            b.replica.view._one = None
        b.replica.decisions = []
        res = run_built(b)
        runs.append(([(rid, r) for rid, r, _ in b.replica.decisions], res))
    assert len(runs[0][0]) >= 600 and runs[0][0] == runs[1][0]
    assert runs[0][1].requests.equals(runs[1][1].requests)


def _run_loop(raw: dict, compiled: bool):
    b = build(scenario_from_dict(raw))
    b.replica.compiled_loop = compiled
    assert b.replica._loop_compiles() == compiled
    return run_built(b)


@pytest.mark.parametrize("router,sample", [("least-tokens", 0), ("least-requests", 0), ("least-tokens", 2),
                                           ("least-requests", 3)])
@pytest.mark.parametrize("extra", [{}, {"stop": {"warmup_requests": 40}},
                                   {"stop": {"requests": None, "duration_s": 0.8}}],
                         ids=["drain", "warmup", "duration"])
def test_compiled_loop_equals_the_python_loop(router, sample, extra):
    """The routed loop as one kernel (engine/fleet_loop.py ``fleet_run``) takes the Python
    loop's steps: same routes, same results, request by request."""
    raw = merge(merge(BASE, LOADED), merge({"cluster": {"router": router, "router_sample": sample}}, extra))
    fast, slow = _run_loop(raw, True), _run_loop(raw, False)
    assert len(fast.requests) >= 300
    assert fast.requests.equals(slow.requests)
    assert {k: v for k, v in fast.summary.items() if k != "wall_s"} == \
        {k: v for k, v in slow.summary.items() if k != "wall_s"}
    assert fast.requests["replica"].nunique() == 7
