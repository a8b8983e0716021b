"""The prefix cache, its lower tiers and hot-prefix preload as kernels (kv/pcache.py, kv/pqueue.py,
kv/ptiers.py) give exactly what the Python reference manager (tests/reference_kv/prefix.py, tests/reference_kv/tiers.py,
tests/reference_kv/preload.py) gives, request by request.

Random scenarios with prefix caching x LRU / priority eviction (protected shares) x preload x
output-block hashing x lower tiers (L2, L3, links with channels and latency) x every policy x
sessions and arrivals, under KV pressure and with invariant checks on, run twice on the Python
engine: once with the reference object bound in (``kv.factory.OBJECT_REFERENCE``), once with the
kernels. Per-request timestamps, blocked seconds, preemptions and the whole summary (hit rates,
evictions, tier traffic) must be identical. Then the kernels compiled = the kernels as Python.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from servesim import scenario_from_dict
from servesim.errors import ScenarioError
from servesim.kv import factory
from servesim.simulate import build, run_built
from servesim.testing import strategies as sst
from tests.conftest import BASE, merge
from tests.prefix_face import KernelPrefixKV
from tests.reference_kv.build import build_reference
from tests.test_compiled_engine import assert_identical
from tests.test_kv_golden import make_table
from tests.test_kv_properties import Driver, mixes


def run(raw, engine, reference=False):
    old = factory.OBJECT_REFERENCE
    factory.OBJECT_REFERENCE = build_reference if reference else None
    try:
        b = build(scenario_from_dict(merge(raw, {"sim": {"engine": engine}})))
    except ScenarioError as exc:  # a drawn tier smaller than one block is refused (kv/factory.py)
        assert "holds no KV block" in str(exc), exc
        reject()
    finally:
        factory.OBJECT_REFERENCE = old
    kvs = [b.kv] if b.fleet is None else [e.kv for e in b.fleet.engines]
    assert all((type(kv).__name__ == "PrefixCacheKV") == reference for kv in kvs)
    assert b.replica.path == engine
    return run_built(b)


def pair(bs, specs, chains, klass, num_blocks, tiers, eviction, preload):
    """The reference manager and the kernels over two copies of one request table."""
    from tests.reference_kv.preload import HotPrefixTracker
    from tests.reference_kv.prefix import PrefixCacheKV
    from tests.reference_kv.tiers import Link, LowerTier, TierStack

    out = []
    for cls in (PrefixCacheKV, KernelPrefixKV):
        table, off, hs = make_table(specs, chains, klass)
        ts = TierStack([LowerTier("L2", 3, Link("pcie", 400.0, 0.1)), LowerTier("L3", 4, Link("net", 100.0, 0.3, 2))],
                       block_bytes=20) if tiers else None
        hot = HotPrefixTracker(2, 2.0, 3) if preload else None
        out.append(Driver(cls(num_blocks, bs, table, off, hs, eviction=eviction, protect_share=[0.3, 0.1], tiers=ts,
                              hot=hot, trace=True), table))
    return out


def state(d: Driver) -> dict:
    kv, t = d.kv, d.t
    out = {"computed": t.computed.tolist(), "free": kv.free_blocks, "log": list(d.log),
           "tables": {int(r): kv.block_table(int(r)).tolist() for r in np.flatnonzero(kv.held > 0)},
           "queues": [q.items().tolist() for q in kv.pool.queues], "cache": dict(kv.cache),
           "evictions": list(kv.eviction_log), "hits": kv.hit_tokens.tolist(), "stale": kv.stale_hits,
           "tier_hits": kv.tier_hit_blocks.tolist(), "wait": kv.fetch_wait_s.tolist()}
    if kv.tiers is not None:
        out["tiers"] = [(list(x.blocks), x.link.bytes_up, x.link.bytes_down, x.link.busy_s, x.link.queue_s,
                         x.stats.preloaded, x.stats.evicted) for x in kv.tiers.tiers]
        out["dropped"] = kv.tiers.dropped
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixes(), st.booleans(), st.sampled_from(["lru", "priority"]), st.booleans())
def test_kernels_in_lockstep_with_the_reference_manager(mix, tiers, eviction, preload):
    """Operation by operation (lookups, allocations, decode steps, frees, preemptions): block
    tables, free queues in order, cache map, eviction order, tier contents and traffic, counters."""
    bs, specs, chains, klass, num_blocks, ops = mix
    ref, ker = pair(bs, specs, chains, klass, num_blocks, tiers, eviction, preload)

    for op in ops:
        ref.play([op])
        ker.play([op])
        assert state(ref) == state(ker), op
    ker.kv.check()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(sst.scenarios(prefix=True, pressure=True, cluster=False))
def test_kernels_equal_the_reference_object(raw):
    raw = merge(raw, {"sim": {"check_invariants": True}})
    assert_identical(run(raw, "python", reference=True), run(raw, "python"))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(sst.scenarios(prefix=True, pressure=True, cluster=True))
def test_fleet_kernels_equal_the_reference_object(raw):
    assert_identical(run(raw, "python", reference=True), run(raw, "python"))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(sst.scenarios(prefix=True, pressure=True, cluster=False))
def test_prefix_kernels_compiled_equal_python(raw):
    assert_identical(run(raw, "python"), run(raw, "compiled"))


SESSIONS = merge(BASE, {
    "stop": {"requests": 250}, "step_time": {"model": "roofline"},
    "engine": {"enable_prefix_caching": True, "gpu_memory_utilization": 0.3, "num_gpu_blocks_override": 300},
    "workload": {"arrival": {"process": "poisson", "rate": 4.0},
                 "sessions": {"turns": {"dist": "geometric", "mean": 4, "max": 10}, "think_s": 2.0,
                              "system_prompt_tokens": 200, "num_system_prompts": 3,
                              "new_input": {"dist": "uniform", "min": 20, "max": 200},
                              "output": {"dist": "uniform", "min": 10, "max": 100}}},
})
del SESSIONS["workload"]["prompt"], SESSIONS["workload"]["output"]


@pytest.mark.parametrize("variant", [
    {},
    {"engine": {"prefix_cache_eviction": "priority", "kv": {"protect_share": [0.2]}},
     "workload": {"classes": {"weights": [1, 1, 1]}}},
    {"kv_tiers": [{"kind": "cpu", "capacity_gib": 0.05}, {"kind": "remote", "capacity_gib": 0.2, "channels": 2}],
     "engine": {"kv": {"preload": {"min_hits": 2, "window_s": 20.0, "max_share": 0.1}}}},
])
def test_sessions_with_reuse_run_compiled_as_the_reference(variant):
    """A run long enough for evictions, tier traffic and preloads: the compiled kernels give the
    reference object's results, and the cache is used (hits, evictions)."""
    raw = merge(SESSIONS, variant)
    ref, comp = run(raw, "python", reference=True), run(raw, "compiled")
    assert_identical(ref, comp)
    kv = comp.summary["kv"]
    assert kv["prefix_cache"]["hit_tokens"] > 0 and kv["prefix_cache"]["evictions"] > 0
    if "kv_tiers" in variant:
        assert kv["tiers"]["L2"]["fetches"] > 0 and kv["tiers"]["L2"]["preloaded"] + kv["tiers"]["L3"]["hit_blocks"] > 0


def test_prefix_caching_runs_compiled():
    """Prefix caching, priority eviction, tiers and preload no longer send a run to Python."""
    raw = merge(BASE, {"engine": {"enable_prefix_caching": True, "prefix_cache_eviction": "priority",
                                  "kv": {"preload": {"min_hits": 2, "window_s": 5.0, "max_share": 0.1}}},
                       "kv_tiers": [{"kind": "cpu", "capacity_gib": 1}]})
    b = build(scenario_from_dict(raw))
    assert b.replica.path == "compiled", b.replica.why
    assert b.kv.prefix_caching and b.replica.engines[0].kstate.prefix == 1


def test_hash_ids_are_deterministic_and_dense():
    """Chain hashes are interned by value (np.unique, ids in order of first appearance), not by
    Python's hash(): the same chains
    give the same ids in any process, and ids index the cache map densely."""
    from servesim.kv.pstate import make_prefix_kv
    from types import SimpleNamespace

    n = 3
    table = SimpleNamespace(computed=np.zeros(n, np.int32), prompt=np.full(n, 9, np.int32),
                            num_output=np.zeros(n, np.int32), klass=np.zeros(n, np.int8))
    hs = np.array([2**62, -5, 7, 2**62, -5, 11], dtype=np.int64)
    kv = make_prefix_kv(8, 2, table, np.array([0, 2, 4, 6]), hs)
    assert kv.uniq.tolist() == [2**62, -5, 7, 11]  # numbered in order of first appearance
    assert kv.chain.tolist() == [0, 1, 2, 0, 1, 3]
    assert len(kv.cache_blk) == 4 and (kv.cache_blk == -1).all()
    assert int(kv.s[0].free) == 8 and kv.qsize.tolist() == [8, 0]


@pytest.mark.parametrize("eviction", ["lru", "priority"])
@pytest.mark.parametrize("nb", [1, 2, 7])
def test_a_fresh_pool_is_every_block_pushed_in_order(eviction, nb):
    """The free queues of a new pool, laid out at once, are the state q_push of every block in
    block order leaves (what make_prefix_kv did block by block)."""
    from types import SimpleNamespace

    from servesim.jit import pure
    from servesim.kv.pqueue import q_push
    from servesim.kv.pstate import make_prefix_kv

    table = SimpleNamespace(computed=np.zeros(2, np.int32), prompt=np.full(2, 9, np.int32),
                            num_output=np.zeros(2, np.int32), klass=np.zeros(2, np.int8))
    kv = make_prefix_kv(nb, 2, table, eviction=eviction)
    ref = make_prefix_kv(nb, 2, table, eviction=eviction)
    for name in ("qid", "qnext", "qprev", "qends", "qsize"):
        getattr(ref, name)[...] = np.full_like(getattr(ref, name), -1) if name != "qsize" else 0
    ref.s[0].free = 0
    for b in range(nb):
        pure(q_push)(ref, b, 0)
    for name in ("qid", "qnext", "qprev", "qends", "qsize", "s"):
        assert np.array_equal(getattr(kv, name), getattr(ref, name)), name


def test_a_pool_of_a_million_blocks_builds_in_a_moment():
    """2**20 blocks (a fuzzer's valid extreme of num_gpu_blocks_override): a block-by-block build
    took ~5 s a replica (two replicas and a 5-request run passed the fuzzer's 30 s); now milliseconds."""
    import time
    from types import SimpleNamespace

    from servesim.kv.pstate import make_prefix_kv

    table = SimpleNamespace(computed=np.zeros(2, np.int32), prompt=np.full(2, 9, np.int32),
                            num_output=np.zeros(2, np.int32), klass=np.zeros(2, np.int8))
    t0 = time.perf_counter()
    kv = make_prefix_kv(1 << 20, 1, table, eviction="priority")
    assert time.perf_counter() - t0 < 1.0  # (the old build: >= 4 s on an idle machine)
    assert int(kv.s[0].free) == 1 << 20 and kv.qends[:, 0].tolist() == [0, (1 << 20) - 1]
