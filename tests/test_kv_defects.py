"""Prefix-cache and KV-tier defects found by a hunt (2026-12-04), each wrong with exit 0 before
its fix: a pipeline replica's tiers held pp times their capacity, tier names could overwrite
each other's report entries, a fleet's tier report left out two documented keys, and a preloaded
block kept the SLA class of the block's previous holder under priority eviction."""

from __future__ import annotations

import pytest

from servesim import scenario_from_dict
from servesim.errors import ScenarioError
from tests.reference_kv.prefix import PrefixCacheKV
from tests.reference_kv.preload import HotPrefixTracker, observe
from tests.reference_kv.tiers import Link, LowerTier, TierStack
from servesim.simulate import build, run_built
from tests.conftest import BASE, merge
from tests.test_kv_golden import make_table, prefill

SESSIONS = {"arrival": {"process": "poisson", "rate": 20.0},
            "sessions": {"turns": 3, "think_s": 0.5, "new_input": {"dist": "fixed", "value": 64},
                         "output": {"dist": "fixed", "value": 16}}}


def _prefix(pp: int) -> dict:
    raw = merge(BASE, {"stop": {"requests": 60}, "engine": {"enable_prefix_caching": True, "pipeline_parallel_size": pp},
                       "kv_tiers": [{"kind": "cpu", "capacity_gib": 1}]})
    raw["workload"] = SESSIONS
    return raw


def test_a_pipeline_replicas_virtual_engines_share_its_tier_capacity():
    """Each virtual engine built a tier of the whole replica's capacity_gib, so a PP2 replica's L2
    held 2 GiB for capacity_gib 1; they now hold 1/pp each, as they do the GPU blocks."""
    def replica_bytes(pp):
        b = build(scenario_from_dict(_prefix(pp)))
        kvs = [e.kv for e in b.fleet.engines] if b.fleet is not None else [b.kv]
        return sum(kv.tiers.tiers[0].capacity for kv in kvs) * kvs[0].tiers.block_bytes * b.scenario.gpus_per_replica

    one, two = replica_bytes(1), replica_bytes(2)
    assert one <= 1 << 30 and two <= 1 << 30
    assert two == pytest.approx(one, rel=1e-3)


@pytest.mark.parametrize("tiers, words", [
    ([{"kind": "cpu", "name": "L3"}, {"kind": "remote"}], ["kv_tiers[1].name = 'L3'", "kv_tiers[0] has that name"]),
    ([{"kind": "cpu", "name": "L1"}], ["kv_tiers[0].name = 'L1'", "GPU pool"]),
    ([{"kind": "cpu", "name": "dropped_blocks"}], ["kv_tiers[0].name = 'dropped_blocks'", "summary key"]),
])
def test_tier_names_that_would_overwrite_report_entries_are_refused(tiers, words):
    """An unnamed tier is L2/L3 by position, so [{name: L3}, {}] gave two 'L3' entries, one
    overwriting the other (reported rates summed to 0.748 of a 0.811 block hit rate); 'L1' replaced
    the GPU's entry."""
    raw = _prefix(1)
    raw["kv_tiers"] = [dict(t, capacity_gib=1) for t in tiers]
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(raw)
    for w in words:
        assert w in str(err.value)


def test_a_fleets_tier_report_has_every_documented_key():
    raw = merge(_prefix(1), {"cluster": {"groups": [{"replicas": 2}]}, "stop": {"requests": 120}})
    fleet = run_built(build(scenario_from_dict(raw))).summary["kv"]["tiers"]
    lone = run_built(build(scenario_from_dict(_prefix(1)))).summary["kv"]["tiers"]
    assert set(fleet) == set(lone)
    assert set(fleet["fetch_wait_s"]) == set(lone["fetch_wait_s"]) == {"total", "mean", "by_class"}


def test_a_preloaded_block_has_no_class_until_a_request_uses_it():
    """Priority eviction + preload: a prefix that only P4 requests used was preloaded into blocks a
    P0 request had freed and kept that P0 stamp, so it cooled into P0's (protected) queue."""
    table, off, hs = make_table([(4, 1), (5, 1), (6, 1), (3, 1)], [[], [100, 101], [], []], klass=[0, 4, 4, 4])
    tiers = TierStack([LowerTier("L2", 8, Link("l2", 1e9, 0.0, 1))], 100)
    hot = HotPrefixTracker(min_hits=1, window_s=1.0, max_blocks=2)
    kv = PrefixCacheKV(5, 2, table, off, hs, eviction="priority", protect_share=[1.0], tiers=tiers, hot=hot)
    prefill(kv, table, 0, 0.0)  # the P0 request holds blocks 0, 1
    prefill(kv, table, 1, 0.1)
    kv.free(1)  # 100 -> block 2, 101 -> block 3 (P4), hot
    prefill(kv, table, 2, 0.2)  # takes 4, 3, 2: 101 and 100 go to L2
    kv.free(0)  # blocks 1, 0 are plain again, last held by P0
    kv.reuse_prefix(3, 0.3)  # the P4 lookup preloads 100, 101 from L2 into 1, 0
    blocks = [kv.cache[100], kv.cache[101]]
    observe(kv, [], 10.0)  # the window passes: they cool
    assert kv.bclass[blocks].tolist() == [4, 4]  # the lowest class: no holder yet, then P4's own stamp
    assert kv.pool.qid[blocks].tolist() == [5, 5]  # P4's queue (1 is P0's, 6 the hot queue)
    kv.check()
