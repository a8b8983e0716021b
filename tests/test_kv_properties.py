"""Properties of the KV managers over generated request mixes and operation sequences.

A tiny driver plays policy and engine: admit (lookup + allocate the rest of the prompt, computed
at once), decode steps of the running set (preempting the newest when the pool is short),
finishes and preemptions. After every operation the manager's invariants hold, and:

* every GPU block is in exactly one state: free, in use (ref >= 1), cached-free; the total is
  constant; no tier exceeds its capacity; blocks sent down the tiers are stored, refreshed or
  dropped (conservation);
* a prefix hit only ever hands out blocks whose hash is the request's own chain hash;
* prefix caching without hashes allocates exactly like the counting paged allocator;
* a decode run (``decode_run`` + ``commit_decodes``) equals stepping ``allocate_decodes``, for
  every allocator, down to block ids, free-queue order and evictions.
"""

from __future__ import annotations

import copy

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.kv_faces import ElasticKV
from tests.kv_faces import PagedKV
from tests.reference_kv.preload import HotPrefixTracker
from tests.reference_kv.prefix import PrefixCacheKV
from tests.kv_faces import StaticKV
from tests.reference_kv.steps import run_demand
from tests.reference_kv.tiers import Link, LowerTier, TierStack
from tests.test_kv_golden import make_table

SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def mixes(draw, max_requests=14):
    """Requests whose chains share prefixes within a family: hash (family, j) for the first
    ``share`` blocks, then the request's own (equal hash at j => equal hashes before j)."""
    bs = draw(st.sampled_from([1, 2, 4]))
    n = draw(st.integers(2, max_requests))  # requests finish or are preempted, never re-run
    specs, chains, klass = [], [], []
    for i in range(n):
        p, o = draw(st.integers(1, 24)), draw(st.integers(1, 8))
        p = max(p, bs + 1) if draw(st.booleans()) else p
        fam, share = draw(st.integers(0, 1)), draw(st.sampled_from([0, 1, 3, 24, 24]))
        specs.append((p, o))
        chains.append([hash(("f", fam, j)) & 0xFFFFFFFF if j < share else (i << 20) + j for j in range(p // bs)])
        klass.append(draw(st.integers(0, 4)))
    need = max(-(-(p + o) // bs) for p, o in specs)
    num_blocks = draw(st.integers(need, need + 4))
    if draw(st.booleans()):  # free-form
        ops = draw(st.lists(st.tuples(st.sampled_from(["admit", "admit", "step", "step", "finish", "preempt"]),
                                      st.integers(0, n - 1)), min_size=1, max_size=60))
    else:  # rounds: admit a few, decode, finish them all (the cache fills, then evicts)
        ops = []
        for _ in range(draw(st.integers(1, 6))):
            ops += [("admit", 0)] * draw(st.integers(1, 4)) + [("step", 0)] * draw(st.integers(0, 3))
            ops += [("finish", 0)] * 4 + [("preempt", 0)] * draw(st.integers(0, 1))
    return bs, specs, chains, klass, num_blocks, ops


class Driver:
    """Policy + engine in miniature. ``now`` advances 0.25 s per operation."""

    def __init__(self, kv, table):
        self.kv, self.t = kv, table
        self.running: list[int] = []
        self.done: set[int] = set()
        self.now = 0.0
        self.log: list = []

    def known(self, rid):
        return int(self.t.prompt[rid] + self.t.num_output[rid])

    def admit(self, rid):
        if rid in self.running or rid in self.done:
            return
        hit = self.kv.reuse_prefix(rid, self.now)
        self.log.append(("hit", rid, hit.tokens))
        if hit.ready_at > self.now:
            return  # fetch in flight
        n = self.known(rid) - int(self.t.computed[rid])
        ok = self.kv.allocate(rid, n)
        self.log.append(("alloc", rid, ok))
        if not ok:
            return
        self.on_admitted(rid)
        self.running.append(rid)
        self.t.computed[rid] += n
        self.t.num_output[rid] += 1
        self.finish_done([rid])

    def on_admitted(self, rid):
        pass

    def step(self):
        ids = np.array(self.running, dtype=np.int64)
        if len(ids) == 0:
            return
        if not self.kv.allocate_decodes(ids):
            self.log.append(("short", len(ids)))
            self.preempt(self.running[-1])
            return
        self.t.computed[ids] += 1
        self.t.num_output[ids] += 1
        self.kv.commit_decodes(ids)
        self.finish_done(list(ids))

    def finish_done(self, ids):
        for rid in ids:
            if self.t.num_output[rid] >= self.t.output[rid]:
                self.finish(rid)

    def finish(self, rid):
        if rid in self.running:
            self.kv.free(rid)
            self.running.remove(rid)
            self.done.add(rid)

    def preempt(self, rid):
        if rid in self.running:
            self.kv.free(rid)
            self.t.computed[rid] = 0
            self.running.remove(rid)

    def play(self, ops, after=None):
        """``ops``: (name, r). ``admit``: the first waiting request at or after id ``r`` (FIFO
        from there); ``finish``/``preempt``: running request number ``r`` (mod the running count)."""
        n = len(self.t.computed)
        for op, r in ops:
            self.now += 0.25
            if op == "admit":
                waiting = [i for i in range(n) if i not in self.running and i not in self.done]
                if waiting:
                    self.admit(next((i for i in waiting if i >= r), waiting[0]))
            elif op == "step":
                self.step()
            elif self.running:
                rid = self.running[r % len(self.running)]
                self.finish(rid) if op == "finish" else self.preempt(rid)
            if after is not None:
                after(op, r)


def block_states(kv):
    """(plain free, cached-free, in use) counts, each block counted once."""
    in_use = kv.ref > 0
    free = kv.pool.qid >= 0
    assert not (in_use & free).any() and (in_use | free).all()
    return int((free & ~kv.hashed).sum()), int((free & kv.hashed).sum()), int(in_use.sum())


def prefix_kv(bs, specs, chains, klass, num_blocks, tiers=False, eviction="lru", preload=False):
    table, off, hs = make_table(specs, chains, klass)
    ts = None
    if tiers:
        ts = TierStack([LowerTier("L2", 3, Link("pcie", 400.0, 0.1)), LowerTier("L3", 4, Link("net", 100.0, 0.3))],
                       block_bytes=20)
    hot = HotPrefixTracker(2, 2.0, 3) if preload else None
    return PrefixCacheKV(num_blocks, bs, table, off, hs, eviction=eviction, tiers=ts, hot=hot, trace=True), table


@SETTINGS
@given(mixes(), st.booleans(), st.sampled_from(["lru", "priority"]), st.booleans())
def test_prefix_cache_invariants(mix, tiers, eviction, preload):
    bs, specs, chains, klass, num_blocks, ops = mix
    kv, table = prefix_kv(bs, specs, chains, klass, num_blocks, tiers, eviction, preload)
    d = Driver(kv, table)

    def after(op, rid):
        kv.check()  # ref counts = block tables, queues, cache map, tier capacity + conservation
        plain, cached, in_use = block_states(kv)
        assert plain + cached + in_use == num_blocks
        assert cached == len(kv.cache) - int((kv.hashed & (kv.ref > 0)).sum())
        if tiers:
            assert all(len(t) <= t.capacity for t in kv.tiers.tiers)

    def on_admitted(rid):
        # the hit blocks carry exactly the request's chain hashes
        hit_blocks = int(table.computed[rid]) // bs
        blocks = kv.block_table(rid)[:hit_blocks]
        chain = np.asarray(chains[rid][:hit_blocks], dtype=np.int64)
        assert kv.hashed[blocks].all() and (kv.bhash[blocks] == chain).all()

    d.on_admitted = on_admitted
    d.play(ops, after)


@SETTINGS
@given(mixes())
def test_prefix_cache_without_hashes_allocates_like_paged(mix):
    bs, specs, _, klass, num_blocks, ops = mix
    t1, _, _ = make_table(specs, None, klass)
    t2, _, _ = make_table(specs, None, klass)
    a, b = Driver(PagedKV(num_blocks, bs, t1.computed), t1), Driver(PrefixCacheKV(num_blocks, bs, t2), t2)
    a.play(ops)
    b.play(ops)
    assert a.log == b.log
    assert a.kv.free_blocks == b.kv.free_blocks
    assert (t1.computed == t2.computed).all() and b.kv.hit_tokens.sum() == 0


@SETTINGS
@given(mixes())
def test_caching_off_hashes_change_nothing(mix):
    """Hashes on a workload without prefix caching: the paged counts and decisions are those of
    the unhashed workload (the counting allocator never reads them)."""
    bs, specs, chains, klass, num_blocks, ops = mix
    t1, off, hs = make_table(specs, chains, klass)
    t2, _, _ = make_table(specs, None, klass)
    a, b = Driver(PagedKV(num_blocks, bs, t1.computed), t1), Driver(PagedKV(num_blocks, bs, t2.computed), t2)
    a.play(ops)
    b.play(ops)
    assert a.log == b.log and all(e[2] == 0 for e in a.log if e[0] == "hit")


# ------------------------------------------------------------------------ decode-run exactness
def snapshot(kv, table):
    s = {"computed": table.computed.copy(), "free": kv.free_blocks, "used": kv.used_blocks}
    if isinstance(kv, PrefixCacheKV):
        s["tables"] = {int(r): kv.block_table(int(r)).tolist() for r in kv.holders.ids}
        s["queue"] = kv.pool.members().tolist()
        s["cache"] = dict(kv.cache)
        s["evictions"] = list(kv.eviction_log)
        if kv.tiers is not None:
            s["tiers"] = [list(t.blocks) for t in kv.tiers.tiers]
    else:
        s["held"] = kv.held.copy()
    return s


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], np.ndarray):
            assert (a[k] == b[k]).all(), k
        else:
            assert a[k] == b[k], k


def run_equivalence(kv, table, running, k_max):
    ids = np.array(running, dtype=np.int64)
    if not kv.allocate_decodes(ids):
        return
    bulk_kv, bulk_t = copy.deepcopy((kv, table))
    k, used = bulk_kv.decode_run(ids, k_max)
    assert 1 <= k <= k_max and len(used) == k
    usage = bulk_kv.step_usage(ids, np.ones(len(ids), dtype=np.int64), k, used)
    bulk_t.computed[ids] += k
    bulk_kv.commit_decodes(ids)
    bulk_kv.check()
    # stepwise: step 1 is allocated; steps 2..k allocate one at a time, step k+1 must not fit
    for j in range(1, k + 1):
        if j > 1:
            assert kv.allocate_decodes(ids), j
        assert kv.used_blocks == used[j - 1], j
        u = kv.step_usage(ids, np.ones(len(ids), dtype=np.int64), 1)
        assert (u.allocated[0], u.used[0], u.reserved_unused[0], u.external[0]) == \
            (usage.allocated[j - 1], usage.used[j - 1], usage.reserved_unused[j - 1], usage.external[j - 1])
        table.computed[ids] += 1
        kv.commit_decodes(ids)
    if k < k_max:
        assert not copy.deepcopy(kv).allocate_decodes(ids)
    kv.check()
    assert_same(snapshot(bulk_kv, bulk_t), snapshot(kv, table))


@st.composite
def decode_states(draw):
    bs, specs, chains, klass, num_blocks, ops = draw(mixes())
    specs = [(p, 40) for p, _ in specs]  # long outputs: runs end on the pool, not on completions
    kind = draw(st.sampled_from(["paged", "prefix", "prefix-tiers", "elastic", "static"]))
    k_max = draw(st.integers(1, 60))
    if kind == "static":  # every reservation (prompt + 40) must fit the pool
        num_blocks = max(num_blocks, max(-(-(p + 40) // bs) for p, _ in specs))
    return bs, specs, chains, klass, num_blocks + draw(st.integers(0, 20)), ops, kind, k_max


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(decode_states())
def test_decode_run_equals_stepwise(state):
    bs, specs, chains, klass, num_blocks, ops, kind, k_max = state
    if kind.startswith("prefix"):
        kv, table = prefix_kv(bs, specs, chains, klass, num_blocks, tiers=kind.endswith("tiers"))
    else:
        table, _, _ = make_table(specs, None, klass)
        if kind == "paged":
            kv = PagedKV(num_blocks, bs, table.computed)
        elif kind == "elastic":
            kv = ElasticKV(num_blocks, bs, table.computed, base_blocks=2, growth_blocks=3)
        else:
            kv = StaticKV(num_blocks, bs, table.computed, table.prompt + table.output, "best")
    d = Driver(kv, table)
    d.play([(op, rid) for op, rid in ops if op != "step"])  # admissions, finishes, preemptions
    if d.running:
        run_equivalence(kv, table, d.running, k_max)


@given(st.lists(st.integers(0, 50), min_size=1, max_size=12), st.integers(1, 70), st.integers(0, 20),
       st.integers(1, 8), st.integers(1, 3))
@settings(max_examples=200, deadline=None)
def test_run_demand_matches_brute_force(c, k_max, threshold, period, chunk):
    c = np.array(c)
    got = run_demand(c, k_max, threshold, period, chunk)
    want = [chunk * sum(1 for x in c if x + j - 1 >= threshold and (x + j - 1 - threshold) % period == 0)
            for j in range(2, k_max + 1)]
    assert got.tolist() == want


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 16), st.lists(st.tuples(st.integers(0, 90), st.integers(1, 30)), min_size=1, max_size=10),
       st.integers(1, 12))
def test_paged_step_usage_equals_the_generic_slot_accounting(bs, reqs, k):
    """The paged shortcut (every held block touched) agrees with step_slots' general counting."""
    from tests.kv_faces import PagedKV
    from tests.reference_kv.steps import step_slots

    computed = np.array([c for c, _ in reqs], dtype=np.int64)
    kv = PagedKV(10_000, bs, computed)
    ids = np.arange(len(reqs))
    # an iteration computes num_new tokens each; a decode run (k > 1) one token each per step
    num_new = np.array([n for _, n in reqs], dtype=np.int64) if k == 1 else np.ones(len(reqs), dtype=np.int64)
    for rid in ids:  # the policy allocated exactly this step's slots
        assert kv.allocate(int(rid), int(num_new[rid]))
    used = None
    if k > 1:
        k, used = kv.decode_run(ids, k)
    u = kv.step_usage(ids, num_new, k, used)
    slots, touched = step_slots(computed, kv.holders.ids, ids, num_new, k, bs)
    np.testing.assert_array_equal(u.used, slots)
    np.testing.assert_array_equal(u.reserved_unused, u.allocated - touched * bs)
