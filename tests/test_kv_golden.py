"""Golden traces of the KV managers, driven directly with a tiny request table: exact block tables,
exact eviction order, external fragmentation with the static allocator, tier fetch times."""

from __future__ import annotations

import numpy as np
import pytest

from servesim.request import RequestTable
from tests.kv_faces import ElasticKV
from tests.kv_faces import ExtentAllocator
from tests.kv_faces import PagedKV
from tests.reference_kv.prefix import PrefixCacheKV as ReferencePrefixKV
from tests.prefix_face import KernelPrefixKV
from tests.kv_faces import StaticKV
from tests.reference_kv.tiers import Link, LowerTier, TierStack
from servesim.request import Request, Workload


# Every prefix-cache trace here runs on the reference manager (tests/reference_kv/prefix.py) and on the kernels
# (kv/pcache.py, through tests/prefix_face.py): the same golden values hold for both.
IMPLS = {"reference": ReferencePrefixKV, "kernels": KernelPrefixKV}
PrefixCacheKV = ReferencePrefixKV  # rebound per test by prefix_impl


@pytest.fixture(autouse=True, params=sorted(IMPLS))
def prefix_impl(request, monkeypatch):
    monkeypatch.setitem(globals(), "PrefixCacheKV", IMPLS[request.param])
    return request.param


def make_table(specs, chains=None, klass=None):
    """``specs``: (prompt, output) per request, arrival order = index. ``chains``: hash list per
    request (engine blocks). Returns (table, offsets, hashes)."""
    reqs = [Request(arrival_s=float(i), prompt_tokens=p, output_tokens=o, klass=(klass or [0] * len(specs))[i])
            for i, (p, o) in enumerate(specs)]
    table = RequestTable(Workload.from_requests(reqs))
    if chains is None:
        return table, None, None
    lens = [len(c) for c in chains]
    off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    hs = np.array([h for c in chains for h in c], dtype=np.int64)
    return table, off, hs


def prefill(kv, table, rid, now=0.0):
    """Lookup + allocate the rest of the known tokens, then compute them (as a policy + engine)."""
    kv.reuse_prefix(rid, now)
    n = int(table.prompt[rid] + table.num_output[rid] - table.computed[rid])
    assert kv.allocate(rid, n)
    table.computed[rid] += n
    table.num_output[rid] += 1


def decode(kv, table, ids):
    ids = np.asarray(ids, dtype=np.int64)
    assert kv.allocate_decodes(ids)
    table.computed[ids] += 1
    table.num_output[ids] += 1
    kv.commit_decodes(ids)


# ----------------------------------------------------------------------------- block tables
def test_paged_block_table_crosses_boundaries():
    """bs 4: a 6-token prompt takes blocks 0,1; decode steps writing slots 7, 8 stay in block 1;
    the one writing slot 9 takes block 2. Freed tail first, the queue becomes 3..9, 2, 1, 0 and the next request takes it in
    that order."""
    table, _, _ = make_table([(6, 10), (3, 2), (30, 1)])
    kv = PrefixCacheKV(10, 4, table)
    prefill(kv, table, 0)
    assert kv.block_table(0).tolist() == [0, 1]
    decode(kv, table, [0])  # writes slot 7
    decode(kv, table, [0])  # writes slot 8: block 1 full
    assert kv.block_table(0).tolist() == [0, 1]
    decode(kv, table, [0])  # writes slot 9: new block
    assert kv.block_table(0).tolist() == [0, 1, 2]
    prefill(kv, table, 1)
    assert kv.block_table(1).tolist() == [3]
    kv.free(0)
    assert kv.pool.members().tolist() == [4, 5, 6, 7, 8, 9, 2, 1, 0]
    prefill(kv, table, 2)
    assert kv.block_table(2).tolist() == [4, 5, 6, 7, 8, 9, 2, 1]
    kv.check()


def test_paged_counts_match_block_tables():
    table, _, _ = make_table([(6, 10), (3, 2), (30, 1)])
    counts = PagedKV(10, 4, table.computed)
    t2, _, _ = make_table([(6, 10), (3, 2), (30, 1)])
    ids = PrefixCacheKV(10, 4, t2)
    for kv, tb in ((counts, table), (ids, t2)):
        prefill(kv, tb, 0)
        for _ in range(3):
            decode(kv, tb, [0])
        prefill(kv, tb, 1)
    assert counts.held[:2].tolist() == [3, 1] == [len(ids.block_table(0)), len(ids.block_table(1))]
    assert counts.free_blocks == ids.free_blocks == 6


# ------------------------------------------------------------------------------ eviction order
def lru_script(eviction="lru", klass=None):
    """bs 2, 7 blocks. A (chain a1 a2) and B (b1 b2) run and finish; C (no chain, 8 tokens) needs 4
    blocks and takes the queue head onwards."""
    chains = [[11, 12], [21, 22], [], [21, 22]]
    table, off, hs = make_table([(5, 1), (5, 1), (8, 1), (5, 1)], chains, klass)
    kv = PrefixCacheKV(7, 2, table, off, hs, eviction=eviction, trace=True)
    for rid in (0, 1):
        prefill(kv, table, rid)
        kv.free(rid)
    return kv, table


def test_lru_eviction_order_matches_vllm():
    kv, table = lru_script()
    # A took 0,1,2 and freed 2,1,0; B took 3,4,5 and freed 5,4,3: queue 6 2 1 0 5 4 3
    assert kv.pool.members().tolist() == [6, 2, 1, 0, 5, 4, 3]
    assert kv.cache == {11: 0, 12: 1, 21: 3, 22: 4}
    prefill(kv, table, 2)  # takes 6 2 1 0: evicts a2 (block 1) before a1 (block 0)
    assert kv.block_table(2).tolist() == [6, 2, 1, 0]
    assert kv.eviction_log == [12, 11]
    hit = kv.reuse_prefix(3, 1.0)  # D shares B's two blocks; 5 tokens: at most 2 blocks reusable
    assert hit.tokens == 4 and table.computed[3] == 4
    assert kv.allocate(3, 1)
    assert kv.block_table(3).tolist() == [3, 4, 5]  # B's cached blocks, then the queue head
    assert kv.hit_tokens.sum() == 4 and kv.query_tokens.sum() == 5 + 5 + 8 + 5
    kv.check()


def test_priority_eviction_spares_urgent_and_takes_plain_first():
    # A is P0, B is P3; with LRU, A's blocks (freed first) would go first
    kv, table = lru_script("priority", klass=[0, 3, 1, 1])
    prefill(kv, table, 2)  # plain first: 6, 2 (A's tail, unhashed), 5 (B's tail); then P3's b2
    assert kv.block_table(2).tolist() == [6, 2, 5, 4]
    assert kv.eviction_log == [22]
    assert 11 in kv.cache and 12 in kv.cache  # P0 prefix kept
    kv.check()


def test_priority_quota_protects_only_up_to_its_share():
    chains = [[11, 12], [21, 22], []]
    table, off, hs = make_table([(5, 1), (5, 1), (12, 1)], chains, klass=[0, 3, 1])
    # P0 protected up to 1 block of 7 (share 0.15): one of A's blocks is beyond quota
    kv = PrefixCacheKV(7, 2, table, off, hs, eviction="priority", protect_share=[0.15], trace=True)
    for rid in (0, 1):
        prefill(kv, table, rid)
        kv.free(rid)
    prefill(kv, table, 2)  # 6 blocks: plain 6 2 5, then beyond quota: P3 b2 b1, P0 a2; a1 protected
    assert kv.eviction_log == [22, 21, 12]
    assert kv.cache == {11: 0}


def test_prefix_hit_never_covers_the_whole_prompt():
    table, off, hs = make_table([(8, 1), (8, 1)], [[1, 2], [1, 2]])
    kv = PrefixCacheKV(8, 4, table, off, hs)
    prefill(kv, table, 0)
    kv.free(0)
    hit = kv.reuse_prefix(1, 0.0)
    assert hit.tokens == 4  # 8 known tokens: the second block is recomputed
    assert kv.allocate(1, 4)
    assert kv.block_table(1)[0] == 0 and kv.block_table(1)[1] != 1
    kv.check()


# --------------------------------------------------------------------------- fragmentation
def test_static_external_fragmentation_on_crafted_sequence():
    """bs 1, 10 slots, reservations 3, 4, 3 fill the pool; freeing the outer two leaves holes of 3
    and 3: 6 free slots, but a 5-slot reservation fits in neither."""
    table, _, _ = make_table([(2, 1), (3, 1), (2, 1), (4, 1)])
    reserve = table.prompt + table.output
    kv = StaticKV(10, 1, table.computed, reserve, "first")
    for rid in range(3):
        assert kv.allocate(rid, int(table.prompt[rid]))
        table.computed[rid] += table.prompt[rid]
    assert kv.start[:3].tolist() == [0, 3, 7]
    kv.free(0)
    kv.free(2)
    assert kv.extents.holes() == [(0, 3), (7, 3)]
    assert not kv.allocate(3, 4)  # 6 free >= 5 needed, no hole of 5
    u = kv.step_usage([], [])  # the pool's slots with nothing scheduled
    assert (kv.free_blocks, kv.extents.largest, int(u.external[0])) == (6, 3, 6)
    assert u.external[0] / u.total_slots == pytest.approx(0.6)  # external fragmentation
    assert u.reserved_unused[0] / u.total_slots == pytest.approx(0.1)  # B reserved 4, wrote 3
    kv.check()


def test_paged_never_fragments_externally_on_the_same_sequence():
    table, _, _ = make_table([(2, 1), (3, 1), (2, 1), (4, 1)])
    kv = PagedKV(10, 1, table.computed)
    for rid in range(3):
        assert kv.allocate(rid, int(table.prompt[rid]))
    kv.free(0)
    kv.free(2)
    assert kv.allocate(3, 4)
    assert kv.step_usage([], []).external[0] == 0


def test_best_fit_picks_the_smallest_hole():
    ex = ExtentAllocator(20, "best")
    a, b, c, d = ex.alloc(5), ex.alloc(2), ex.alloc(3), ex.alloc(10)
    ex.release(a, 5)
    ex.release(c, 3)
    assert ex.alloc(3) == c  # first fit would take the 5-hole at 0
    ex.release(b, 2)
    ex.release(d, 10)
    ex.check()
    assert ex.holes() == [(0, 7), (10, 10)]


def test_elastic_reservation_and_waste():
    table, _, _ = make_table([(9, 20)])
    kv = ElasticKV(20, 4, table.computed, base_blocks=4, growth_blocks=2)
    assert [kv.blocks_needed(s) for s in (0, 1, 16, 17, 24, 25)] == [0, 4, 4, 6, 6, 8]
    assert kv.allocate(0, 9)
    table.computed[0] = 9
    u = kv.step_usage([], [])  # 4 blocks = 16 slots: 9 written, 3 slack in block 2, block 3 untouched
    assert (int(u.allocated[0]), int(u.used[0]), int(u.reserved_unused[0])) == (16, 9, 4)
    assert kv.max_slots() == (4 + 16) * 4


def test_step_usage_of_a_decode_run():
    """Two paged requests at 3 and 6 tokens, bs 4: during steps 1..4 they write 4+7, 5+8, 6+9,
    7+10 slots; request 0 takes its block 2 at step 2 (slot 5), request 1 its block 3 at step 3."""
    table, _, _ = make_table([(3, 9), (6, 9)])
    kv = PagedKV(10, 4, table.computed)
    for rid in (0, 1):
        kv.allocate(rid, int(table.prompt[rid]))
        table.computed[rid] = table.prompt[rid]
    ids = np.array([0, 1])
    assert kv.allocate_decodes(ids)
    k, used = kv.decode_run(ids, 4)
    u = kv.step_usage(ids, np.ones(2, dtype=np.int64), k, used)
    assert used.tolist() == [3, 4, 5, 5]
    assert u.used.tolist() == [11, 13, 15, 17]
    assert (u.internal).tolist() == [0 + 1, 3 + 0, 2 + 3, 1 + 2]  # unwritten slots of last blocks
    assert (u.reserved_unused == 0).all() and (u.external == 0).all()


# ------------------------------------------------------------------------------------- tiers
def tier_setup(bw=1000.0, latency=0.5, channels=1):
    """bs 2, L1 4 blocks, L2 10 blocks; a block is 100 bytes."""
    chains = [[11, 12], [], [11, 12], [11, 12], [31]]
    table, off, hs = make_table([(5, 1), (8, 1), (5, 1), (5, 1), (3, 1)], chains)
    link = Link("pcie", bw, latency, channels)
    tiers = TierStack([LowerTier("L2", 10, link)], block_bytes=100)
    kv = PrefixCacheKV(4, 2, table, off, hs, tiers=tiers, trace=True)
    return kv, table, tiers, link


def test_eviction_demotes_and_a_lower_tier_hit_is_fetched_with_its_transfer_time():
    kv, table, tiers, link = tier_setup()
    prefill(kv, table, 0)
    kv.free(0)
    prefill(kv, table, 1)  # takes all four blocks: a2 then a1 evicted to L2
    assert kv.eviction_log == [12, 11]
    assert list(kv.tiers.tiers[0].blocks) == [12, 11] and kv.tiers.tiers[0].link.bytes_down == 200
    kv.free(1)
    hit = kv.reuse_prefix(2, 10.0)  # both blocks in L2: fetched, 200 B at 1000 B/s + 0.5 s
    assert hit.tokens == 4 and hit.ready_at == pytest.approx(10.7)
    # it holds the whole prefill from now on: 2 fetched blocks + 1 for its last token
    assert len(kv.block_table(2)) == 3 and kv.tier_hit_blocks[:, 0].tolist() == [0, 2]
    # a second request hitting the blocks in flight waits for the same transfer
    hit2 = kv.reuse_prefix(3, 10.1)
    assert hit2.tokens == 4 and hit2.ready_at == pytest.approx(10.7)
    assert kv.reuse_prefix(2, 10.8) == hit  # idempotent once held
    assert kv.allocate(2, 1)
    kv.check()


def test_link_contention_queues_fetches_first_come_first_served():
    link = Link("net", 100.0, 0.1, channels=1)
    assert link.fetch(100, 0.0) == pytest.approx(1.1)
    assert link.fetch(50, 0.5) == pytest.approx(1.1 + 0.6)  # waits 0.6 s for the channel
    assert link.queue_s == pytest.approx(0.6)
    two = Link("net2", 100.0, 0.1, channels=2)
    assert two.fetch(100, 0.0) == pytest.approx(1.1)
    assert two.fetch(50, 0.5) == pytest.approx(1.1)  # second channel free


def test_lower_tier_lru_cascades_to_l3_and_drops():
    l2 = LowerTier("L2", 2, Link("a", 1.0))
    l3 = LowerTier("L3", 1, Link("b", 1.0))
    st = TierStack([l2, l3], block_bytes=10)
    st.demote([1, 2])
    st.demote([3])  # L2 evicts 1 -> L3
    st.demote([2])  # already in L2: refreshed, no store
    st.demote([4])  # L2 evicts 3 (2 was refreshed) -> L3 evicts 1 -> dropped
    assert list(l2.blocks) == [2, 4] and list(l3.blocks) == [3] and st.dropped == 1
    assert st.find([2, 3, 5]) == [0, 1]
    assert l2.link.bytes_down == 40 and l3.link.bytes_down == 20
    st.check()


def test_tier_report_counts_hits_bytes_and_waits():
    from servesim.kv.report import kv_report

    kv, table, tiers, link = tier_setup()
    prefill(kv, table, 0)
    kv.free(0)
    prefill(kv, table, 1)
    kv.free(1)
    kv.reuse_prefix(2, 10.0)
    rep = kv_report(kv, np.array([0.1, 0.2, np.nan, np.nan, np.nan]))
    t = rep["tiers"]
    assert (t["L1"]["hit_blocks"], t["L2"]["hit_blocks"]) == (0, 2)
    assert t["L2"]["bytes_fetched"] == 200 and t["L2"]["bytes_stored"] == 200
    assert t["L2"]["bytes_fetched_by_class"] == {"P0": 200}
    assert t["fetch_wait_s"]["total"] == pytest.approx(0.7)
    # looked up: A 5 + B 8 + C 5 tokens; hit: C's 4
    assert rep["prefix_hit_rate"]["tokens"] == pytest.approx(4 / 18)
    assert t["L1"]["hit_rate"] + t["L2"]["hit_rate"] == pytest.approx(rep["prefix_hit_rate"]["blocks"])
    assert rep["ttft_effect"]["without_hit"]["requests"] == 2
