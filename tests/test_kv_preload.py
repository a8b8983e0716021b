"""Golden traces for hot-prefix preload, stale hits, and session chains extended over outputs."""

from __future__ import annotations

import numpy as np
import pytest

from servesim.kv.chains import extend_with_next_turn
from tests.reference_kv.preload import HotPrefixTracker
from tests.reference_kv.prefix import PrefixCacheKV as ReferencePrefixKV
from tests.prefix_face import KernelPrefixKV
from tests.reference_kv.tiers import Link, LowerTier, TierStack
from tests.test_kv_golden import make_table, prefill


# Every prefix-cache trace here runs on the reference manager (tests/reference_kv/prefix.py) and on the kernels
# (kv/pcache.py, through tests/prefix_face.py): the same golden values hold for both.
IMPLS = {"reference": ReferencePrefixKV, "kernels": KernelPrefixKV}
PrefixCacheKV = ReferencePrefixKV  # rebound per test by prefix_impl


@pytest.fixture(autouse=True, params=sorted(IMPLS))
def prefix_impl(request, monkeypatch):
    monkeypatch.setitem(globals(), "PrefixCacheKV", IMPLS[request.param])
    return request.param


def hot_setup(plain_tokens=8):
    """bs 2, L1 4 blocks, L2 10 blocks of 100 B over 1000 B/s + 0.5 s; hot after 2 lookups."""
    h1, x = 101, 202
    chains = [[h1], [h1], [], [x], [h1]]
    table, off, hs = make_table([(3, 1), (3, 1), (plain_tokens, 1), (3, 1), (3, 1)], chains)
    link = Link("pcie", 1000.0, 0.5)
    tiers = TierStack([LowerTier("L2", 10, link)], block_bytes=100)
    hot = HotPrefixTracker(min_hits=2, window_s=100.0, max_blocks=2)
    kv = PrefixCacheKV(4, 2, table, off, hs, tiers=tiers, hot=hot, trace=True)
    return kv, table, tiers, link


def test_hot_prefix_is_protected_then_preloaded_ahead_of_demand():
    kv, table, tiers, link = hot_setup()
    prefill(kv, table, 0, now=0.0)
    kv.free(0)
    prefill(kv, table, 1, now=1.0)  # second lookup of h1: hot
    assert kv.hit_tokens[0] == 2
    kv.free(1)
    hot_q = kv.pool.queues[kv.policy.HOT]
    assert hot_q.items().tolist() == [kv.cache[101]]  # kept apart, drained last
    prefill(kv, table, 2, now=2.0)  # 8 tokens = every block: the hot one goes last, to L2
    assert kv.eviction_log == [101] and 101 in kv.tiers.tiers[0].blocks
    kv.free(2)
    prefill(kv, table, 3, now=3.0)  # an unrelated lookup finds room: h1 is fetched back now
    assert kv.tiers.tiers[0].stats.preloaded == 1 and kv.tiers.tiers[0].link.fetches == 1
    b = kv.cache[101]
    assert kv.ready[b] == pytest.approx(3.6) and kv.pool.qid[b] == kv.policy.HOT
    hit = kv.reuse_prefix(4, 3.2)  # demand arrives before the preload lands: waits for it
    assert hit.tokens == 2 and hit.ready_at == pytest.approx(3.6)
    assert kv.tiers.tiers[0].link.fetches == 1  # no second transfer
    kv.check()


@pytest.mark.parametrize("preload", [False, True])
def test_hot_block_outlives_more_recently_freed_blocks(preload):
    """A and B look up h1 (hot after two lookups); X then runs and frees 3 blocks, so h1's block is
    the least recently freed. C needs 3 blocks: LRU evicts h1 first; with preload it is spared."""
    table, off, hs = make_table([(3, 1), (3, 1), (5, 1), (6, 1)], [[101], [101], [], []])
    hot = HotPrefixTracker(min_hits=2, window_s=100.0, max_blocks=2) if preload else None
    kv = PrefixCacheKV(4, 2, table, off, hs, hot=hot, trace=True)
    for rid in range(4):
        prefill(kv, table, rid, now=float(rid))
        if rid < 3:
            kv.free(rid)
    assert kv.eviction_log == ([] if preload else [101])
    assert (101 in kv.cache) == preload
    kv.check()


def test_tracker_window_cools_old_lookups():
    hot = HotPrefixTracker(min_hits=2, window_s=10.0, max_blocks=5)
    assert hot.observe([1, 2], 0.0) == ([], [])
    assert hot.observe([1], 5.0) == ([1], [])
    assert hot.is_hot(1) and not hot.is_hot(2)
    assert hot.observe([3], 12.0) == ([], [1])  # the lookup at 0 left the window
    assert not hot.is_hot(1)


def test_stale_hit_is_cut_to_what_is_still_cached():
    """A policy that looks B up, then allocates C (evicting B's hit), then B: B's hit shrinks and
    its allocation covers the rest from its new computed count."""
    table, off, hs = make_table([(5, 1), (5, 1), (8, 1)], [[11, 12], [11, 12], []])
    kv = PrefixCacheKV(4, 2, table, off, hs, trace=True)
    prefill(kv, table, 0)
    kv.free(0)
    assert kv.reuse_prefix(1, 1.0).tokens == 4
    assert kv.reuse_prefix(2, 1.0).tokens == 0
    assert kv.allocate(2, 8)  # takes all 4 blocks: a2 then a1 evicted
    table.computed[2] = 8
    kv.free(2)
    assert kv.allocate(1, 1)
    assert kv.stale_hits == 1 and table.computed[1] == 0 and len(kv.block_table(1)) == 1
    kv.check()


def test_session_turns_get_their_output_blocks_hashes():
    """Session 7: turn 0 prompt 5 (+3 output), turn 1 prompt 12 whose first 8 tokens are turn 0's
    prompt + output; block size 2. Turn 0's chain [a, b] grows to [a, b, c] (7 written tokens: 3
    full blocks). Session 9's turn 1 was cut (different chain): its turn 0 keeps its chain."""
    off = np.array([0, 2, 8, 9, 11])
    hs = np.array([1, 2, 1, 2, 3, 4, 5, 6, 50, 60, 61])
    session = np.array([7, 7, 9, 9])
    prompt = np.array([5, 12, 3, 5])
    output = np.array([3, 2, 9, 2])
    new_off, new_hs = extend_with_next_turn(off, hs, session, prompt, output, 2)
    rows = [new_hs[new_off[i]:new_off[i + 1]].tolist() for i in range(4)]
    assert rows == [[1, 2, 3], [1, 2, 3, 4, 5, 6], [50], [60, 61]]
