"""The cache-aware router (servesim/engine/prefix_router.py): decisions on a hand trace, the
threshold, the load fallback, sampling's cost, a fleet of one, bad knobs."""

from __future__ import annotations

import numpy as np
import pytest

from servesim import scenario_from_dict
from servesim.engine import prefix_router
from servesim.errors import ScenarioError
from servesim.request import Workload
from servesim.simulate import build, run_built
from tests.conftest import BASE, merge, sessions_fleet
from tests.test_cluster_identity import assert_identical, run

BS = 16  # engine block = workload block: a chain entry is an engine block


def trace(rows):
    """``rows``: (arrival s, output tokens, chain); prompts of 4 blocks (64 tokens), so the lookup
    matches at most 3 blocks (48 tokens: one token is always computed)."""
    chains = [c for _, _, c in rows]
    off = np.concatenate([[0], np.cumsum([len(c) for c in chains])]).astype(np.int64)
    return Workload(arrival_s=np.array([t for t, _, _ in rows], dtype=np.float64),
                    prompt_tokens=np.full(len(rows), 4 * BS, dtype=np.int64),
                    output_tokens=np.array([o for _, o, _ in rows], dtype=np.int64),
                    klass=np.zeros(len(rows), dtype=np.int8), prefix_offsets=off,
                    prefix_hashes=np.array([h for c in chains for h in c], dtype=np.int64), prefix_block_tokens=BS)


def fleet_raw(router="cache-aware", replicas=2, knobs=None, **extra):
    raw = merge(BASE, {"hardware": {"replicas": replicas}, "engine": {"enable_prefix_caching": True},
                       "cluster": {"router": router}, **extra})
    if knobs:
        raw["cluster"]["cache_aware"] = knobs
    return raw


def route(rows, router="cache-aware", knobs=None, replicas=2, **cluster):
    wl = trace(rows)
    raw = fleet_raw(router, replicas, knobs)
    raw["cluster"].update(cluster)
    raw["stop"] = {"requests": len(wl)}
    b = build(scenario_from_dict(raw), workload=wl)
    b.replica.decisions = []
    res = run_built(b)
    return b, res, [r for _, r, _ in b.replica.decisions]


A, B = [1, 2, 3, 4], [5, 6, 7, 8]
HAND = [(0.0, 2, A), (0.001, 2, B),  # nothing cached: least loaded (0, then 1 with 0 busy)
        (1.0, 2, [5, 6, 7, 10]),     # B's first 3 blocks are on replica 1: 48/64 > 0.5
        (2.0, 2, [5, 6, 11, 12])]    # B's first 2 on replica 1: 32/64, not above 0.5: least loaded


def test_a_repeated_prefix_goes_to_the_replica_that_caches_it():
    b, res, chosen = route(HAND)
    assert chosen == [0, 1, 1, 0]  # (request 3: the tie pointer had moved past replica 1)
    c = res.summary["cluster"]["cache_aware"]
    assert (c["cache_routed"], c["below_threshold"], c["unbalanced"]) == (1, 3, 0)
    # what the router read is what the replica's lookup then hit (nothing was evicted between)
    pools = [e.kv for e in b.replica.engines]
    assert [int(pools[r].hit_tokens_of[i]) for i, r in enumerate(chosen)] == [0, 0, 48, 0]
    assert c["matched_token_share"] == pytest.approx(48 / (4 * 64))
    # least-requests, same trace: request 2 goes round the tie to replica 0, where B is not cached
    _, _, lr = route(HAND, "least-requests")
    assert lr[2] == 0


def test_the_threshold_decides():
    # 32/64 = 0.5 of request 3 is cached on replica 1: above a threshold of 0.4, not of 0.5
    b, res, chosen = route(HAND, knobs={"cache_threshold": 0.4})
    assert chosen == [0, 1, 1, 1] and int(b.replica.engines[1].kv.hit_tokens_of[3]) == 32
    # at 0.75 even request 2's 48/64 is not above it: every request to the least loaded
    b, res, chosen = route(HAND, knobs={"cache_threshold": 0.75})
    assert chosen == [0, 1, 0, 1] and res.summary["cluster"]["cache_aware"]["cache_routed"] == 0


def test_unbalanced_loads_go_to_the_least_loaded():
    """Three requests of one cached prefix, each still running when the next arrives: the second
    joins the first's replica (loads 1 vs 0: within balance_abs_threshold 1); the third finds
    loads 2 vs 0, unbalanced (2 - 0 > 1 and 2 > 1.0 x 0), and goes to the idle replica."""
    rows = [(0.0, 2, A), (1.0, 400, A), (1.001, 400, A), (1.002, 400, A)]
    knobs = {"balance_abs_threshold": 1, "balance_rel_threshold": 1.0}
    _, res, chosen = route(rows, knobs=knobs)
    assert chosen == [0, 0, 0, 1]
    assert res.summary["cluster"]["cache_aware"]["unbalanced"] == 1
    # a looser balance keeps all three on the cached replica
    assert route(rows, knobs={"balance_abs_threshold": 2, "balance_rel_threshold": 1.0})[2] == [0, 0, 0, 0]


def test_a_replica_that_failed_is_read_afresh():
    """Replica 1 caches B, fails at 1.0 s and serves again at 1.2 s, empty (its cache is lost):
    B's next request goes where the least load sends it, not to the cache replica 1 had."""
    rows = [(0.0, 2, A), (0.001, 2, B), (2.0, 2, [5, 6, 7, 11])]
    assert route(rows)[2] == [0, 1, 1]
    b, res, chosen = route(rows, faults={"schedule": [{"replica": 1, "at_s": 1.0, "down_s": 0.2}]})
    assert chosen == [0, 1, 0] and res.summary["cluster"]["cache_aware"]["cache_routed"] == 0


sessions = sessions_fleet


def test_sessions_hit_more_than_least_requests_and_affinity():
    hit = {r: run_built(build(scenario_from_dict(sessions(r)))).summary["kv"]["prefix_hit_rate"]["tokens"]
           for r in ("least-requests", "affinity", "cache-aware")}
    assert hit["cache-aware"] > hit["affinity"] > hit["least-requests"], hit


def test_sampling_reads_only_the_drawn_replicas(monkeypatch):
    """``router_sample: 2`` on 8 replicas: each request reads at most 2 replicas' caches, along
    its own chain (kv/resident.py), and is routed to one of them."""
    calls = []
    real = prefix_router.CacheAware._resident

    def counted(self, e, rid):
        calls.append(rid)
        return real(self, e, rid)

    monkeypatch.setattr(prefix_router.CacheAware, "_resident", counted)
    b = build(scenario_from_dict(sessions("cache-aware", replicas=8, requests=200, router_sample=2)))
    run_built(b)
    per = np.bincount(np.array(calls), minlength=200)
    assert per.max() <= 2 and per.sum() > 200  # (two reads, or one when both draws were the same)
    assert b.replica.router.sampled == 200
    calls.clear()
    run_built(build(scenario_from_dict(sessions("cache-aware", replicas=8, requests=200))))
    assert np.bincount(np.array(calls)).max() == 8  # exact: every replica, once each


def test_a_fleet_of_one_is_the_lone_replica():
    """Routed request by request (not solo), the router has one replica to choose: the lone
    replica's results exactly."""
    raw = sessions("cache-aware", replicas=1, requests=120)
    lone = {k: v for k, v in raw.items() if k != "cluster"}
    lone["hardware"] = {"gpu": "a100-80g"}
    assert_identical(run(lone), run(merge(lone, {"cluster": {"router": "cache-aware"}}), fleet=True))


@pytest.mark.parametrize("patch,message", [
    ({"cluster": {"router": "cache-aware", "cache_aware": {"cache_threshold": 1.5}}}, "cache_threshold"),
    ({"cluster": {"router": "cache-aware", "cache_aware": {"balance_rel_threshold": 0.5}}}, "balance_rel_threshold"),
    ({"cluster": {"router": "cache-aware", "cache_aware": {"load": "kv"}}}, "load"),
    ({"cluster": {"router": "least-requests", "cache_aware": {"cache_threshold": 0.2}}},
     "cluster.cache_aware applies to router 'cache-aware', not 'least-requests'"),
    ({"engine": {"enable_prefix_caching": False}}, "replica 0 has none (allowed: engine.enable_prefix_caching: true"),
    ({"workload": {"arrival": {"process": "poisson", "rate": 5.0}}}, "the workload has no prefix hashes"),
])
def test_bad_knobs_are_one_line(patch, message):
    raw = merge(sessions("cache-aware", replicas=2, requests=20), patch)
    if "workload" in patch:  # (no sessions, no trace: no prefix hashes)
        raw["workload"] = merge(BASE["workload"], patch["workload"])
    with pytest.raises((ScenarioError, ValueError)) as exc:
        build(scenario_from_dict(raw))
    text = str(exc.value)
    assert message in text and "\n" not in text.strip(), text


def test_the_router_rule_checks_its_knobs():
    with pytest.raises(ValueError, match="cache_threshold 2.0: allowed 0 to 1"):
        prefix_router.CacheAware(2, np.zeros(1, dtype=np.int64), cache_threshold=2.0)


def _copy(kv):
    """An independent copy of a pool's state (every array), for a lookup that must not touch it."""
    return kv._replace(**{f: v.copy() for f, v in kv._asdict().items() if isinstance(v, np.ndarray)})


def test_what_the_router_reads_is_what_a_lookup_would_hit():
    """kv/resident.py against the lookup itself (pcache ``px_lookup``, run on a copy of each
    pool): after a sessions run on a small pool with an L2 and an L3 tier, for every request of
    either replica, the resident run is the lookup's hit, L1 then tiers -- evictions and demotions
    included -- compiled and as Python, and it reads without writing."""
    from servesim.jit import pure
    from servesim.kv.pcache import px_lookup
    from servesim.kv.resident import px_resident

    resident_py = pure(px_resident)

    raw = merge(sessions("cache-aware", replicas=2, requests=300),
                {"engine": {"num_gpu_blocks_override": 48}, "workload": {"sessions": {"system_prompt_tokens": 0}},
                 "kv_tiers": [{"kind": "cpu", "capacity_gib": 0.01}, {"kind": "remote", "capacity_gib": 0.05}]})
    b = build(scenario_from_dict(raw))
    run_built(b)
    lookup = pure(px_lookup)
    seen = {"l1": 0, "tiers": 0, "none": 0}
    for eng in b.replica.engines:
        kv = eng.kstate
        before = _copy(kv)
        for rid in range(b.table.n):
            if kv.h_pos[rid] >= 0:
                continue  # (holding blocks: a lookup answers its holding)
            l1, total = px_resident(eng.kkv, rid)
            assert resident_py(kv, rid) == (l1, total)
            c = _copy(kv)
            c.pend[rid] = -1
            hit, _ = lookup(c, np.zeros(b.table.n, dtype=np.int64), rid, 1e9)
            assert total * kv.block_size == int(hit), rid
            seen["tiers" if total > l1 else "l1" if l1 else "none"] += 1
        for f, v in before._asdict().items():
            if isinstance(v, np.ndarray):
                np.testing.assert_array_equal(v, getattr(kv, f), err_msg=f)
    assert min(seen.values()) > 0, seen  # every kind of answer was compared


def test_the_python_engine_routes_as_the_compiled_one():
    """Beside the Python engine the router walks the same source uncompiled: the same decisions."""
    got = {}
    for engine in ("compiled", "python"):
        b = build(scenario_from_dict(merge(sessions("cache-aware", requests=150), {"sim": {"engine": engine}})))
        assert b.replica.path == engine
        b.replica.decisions = []
        run_built(b)
        got[engine] = [r for _, r, _ in b.replica.decisions]
    assert got["compiled"] == got["python"] and len(set(got["python"])) > 1


def test_pipeline_replicas_are_read_through_their_virtual_engines():
    """A pipeline replica is pp engines with a pool each: its match is its best engine's."""
    raw = merge(sessions("cache-aware", replicas=2, requests=200), {"engine": {"pipeline_parallel_size": 2}})
    b = build(scenario_from_dict(raw))
    assert all(len(m) == 2 for m in b.replica.replicas)
    res = run_built(b)
    c = res.summary["cluster"]["cache_aware"]
    assert res.summary["requests"]["completed"] == 200 and c["cache_routed"] > 150, c
    assert res.summary["kv"]["prefix_hit_rate"]["tokens"] > 0.5
