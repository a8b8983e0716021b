"""The KV kernels (servesim/kv/kernels.py) against the frozen pre-kernel allocators.

Random operation sequences (allocate, allocate_decodes + commit, free / preempt, decode runs,
step usage) drive three implementations in lockstep on one shared ``computed`` column: the frozen
classes of tests/kv_reference.py (the oracle), the kernel-backed classes compiled, and the same
classes running the kernels as plain Python (``servesim.jit.pure``). Every return value, array
and invariant check must be equal, and the compiled and pure states identical field by field.
Deliberately corrupted states must be caught by ``kv_check`` with the oracle's message.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tests.kv_reference as ref
from servesim import jit
from servesim.kv import kernels as K
from tests.kv_faces import ElasticKV
from tests.kv_faces import PagedKV
from tests.kv_faces import StaticKV

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KINDS = ["paged", "elastic", "static-first", "static-best"]


@st.composite
def setups(draw):
    kind = draw(st.sampled_from(KINDS))
    bs = draw(st.sampled_from([1, 2, 3, 4, 8]))
    n = draw(st.integers(1, 10))
    prompt = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    output = draw(st.lists(st.integers(1, 20), min_size=n, max_size=n))
    if draw(st.booleans()):
        reserve = [p + o for p, o in zip(prompt, output)]  # reserve: request
    else:
        reserve = [draw(st.integers(1, 64))] * n  # reserve: max_model_len
    num_blocks = draw(st.integers(1, 48))
    base, growth = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    return kind, bs, n, prompt, reserve, num_blocks, base, growth


def build(setup, computed):
    """(oracle, compiled, pure) managers over the same computed column."""
    kind, bs, n, _, reserve, num_blocks, base, growth = setup
    res = np.array(reserve, dtype=np.int64)
    out = []
    for mod, extra in ((ref, {}), (None, {"pure": False}), (None, {"pure": True})):
        if kind == "paged":
            cls = ref.PagedKV if mod else PagedKV
            out.append(cls(num_blocks, bs, computed, **extra))
        elif kind == "elastic":
            cls = ref.ElasticKV if mod else ElasticKV
            out.append(cls(num_blocks, bs, computed, base, growth, **extra))
        else:
            cls = ref.StaticKV if mod else StaticKV
            out.append(cls(num_blocks, bs, computed, res, kind.split("-")[1], **extra))
    return out


def ops(n):
    ids = st.lists(st.integers(0, n - 1), min_size=0, max_size=n, unique=True)
    return st.lists(st.one_of(
        st.tuples(st.just("alloc"), st.integers(0, n - 1), st.integers(0, 30), st.booleans()),
        st.tuples(st.just("decodes"), ids, st.booleans()),
        st.tuples(st.just("free"), st.integers(0, n - 1), st.booleans()),
        st.tuples(st.just("run"), ids, st.integers(0, 70), st.booleans()),
        st.tuples(st.just("usage"), ids, st.lists(st.integers(0, 6), min_size=10, max_size=10)),
    ), min_size=1, max_size=40)


def same(results):
    """All three results equal (arrays elementwise, dataclasses field by field)."""
    a = results[0]
    for b in results[1:]:
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(np.asarray(b), a)
        elif isinstance(a, tuple):
            assert len(a) == len(b)
            same_pairs(a, b)
        elif hasattr(a, "__dataclass_fields__"):
            assert type(a) is type(b)
            for f in a.__dataclass_fields__:
                same([getattr(a, f), getattr(b, f)])
        else:
            assert a == b, (a, b)


def same_pairs(a, b):
    for x, y in zip(a, b):
        same([x, y])


def outcome(f):
    try:
        return ("ok", f())
    except AssertionError as e:
        return ("raised", str(e))


def assert_states(mgrs):
    o, c, p = mgrs
    same([m.free_blocks for m in mgrs])
    same([m.used_blocks for m in mgrs])
    same([m.max_slots() for m in mgrs])
    same([np.asarray(m.held, dtype=np.int64) for m in mgrs])
    same([sorted(m.holders.ids.tolist()) for m in mgrs])
    same([outcome(m.check) for m in mgrs])
    if isinstance(o, ref.StaticKV):
        same([np.asarray(m.start, dtype=np.int64) for m in mgrs])
        same([m.extents.holes() for m in mgrs])
        same([m.next_need for m in mgrs])
        same([m.failed for m in mgrs])
        same([m.external_slots() for m in mgrs])
        same([m.extents.largest for m in mgrs])
    # compiled and pure kernels leave identical states, field by field
    for f in K.KVState._fields:
        a, b = getattr(c.state, f), getattr(p.state, f)
        if isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and (a == b).all(), f
        else:
            assert a == b, f


def play(setup, sequence, computed, mgrs):
    for op in sequence:
        name = op[0]
        if name == "alloc":
            _, rid, n, advance = op
            ok = [m.allocate(rid, n) for m in mgrs]
            same(ok)
            if ok[0] and advance:
                computed[rid] += n
        elif name == "decodes":
            ids = np.array(op[1], dtype=np.int64)
            ok = [m.allocate_decodes(ids) for m in mgrs]
            same(ok)
            if ok[0] and op[2] and len(ids):
                computed[ids] += 1
                for m in mgrs:
                    m.commit_decodes(ids)
        elif name == "free":
            _, rid, preempt = op
            for m in mgrs:
                m.free(rid)
            if preempt:
                computed[rid] = 0
        elif name == "run":
            _, id_list, k_max, given_used = op
            ids = np.array(id_list, dtype=np.int64)
            ok = [m.allocate_decodes(ids) for m in mgrs]
            same(ok)
            if not ok[0] or len(ids) == 0:
                continue
            runs = [m.decode_run(ids, k_max) for m in mgrs]
            same([r[0] for r in runs])
            same([r[1] for r in runs])
            k, used = runs[0]
            if k == 0:
                continue
            ones = np.ones(len(ids), dtype=np.int64)
            # the engine passes decode_run's blocks in use; without them the manager derives them
            same([m.step_usage(ids, ones, k, r[1] if given_used else None) for m, r in zip(mgrs, runs)])
            computed[ids] += k
            for m in mgrs:
                m.commit_decodes(ids)
        elif name == "usage":
            ids = np.array(op[1], dtype=np.int64)
            new = np.array(op[2][: len(ids)], dtype=np.int64)
            same([m.step_usage(ids, new, 1) for m in mgrs])
        assert_states(mgrs)


@SETTINGS
@given(st.data())
def test_kernels_equal_the_frozen_allocators(data):
    setup = data.draw(setups())
    sequence = data.draw(ops(setup[2]))
    computed = np.zeros(setup[2], dtype=np.int32)
    mgrs = build(setup, computed)
    assert_states(mgrs)
    play(setup, sequence, computed, mgrs)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_engine_like_runs_equal_the_frozen_allocators(data):
    """Admit (allocate the prompt, compute it), decode the running set with runs as long as the
    pool allows, preempt the newest when short, finish when the output is done: long runs, pools
    that fill up."""
    setup = data.draw(setups())
    kind, bs, n, prompt, *_ = setup
    out_len = data.draw(st.lists(st.integers(1, 120), min_size=n, max_size=n))
    computed = np.zeros(n, dtype=np.int32)
    mgrs = build(setup, computed)
    running, done, produced = [], set(), np.zeros(n, dtype=np.int64)
    for _ in range(data.draw(st.integers(1, 30))):
        waiting = [r for r in range(n) if r not in running and r not in done]
        if waiting and data.draw(st.booleans()):
            rid = waiting[0]
            ok = [m.allocate(rid, prompt[rid]) for m in mgrs]
            same(ok)
            if ok[0]:
                computed[rid] += prompt[rid]
                running.append(rid)
        if not running:
            continue
        ids = np.array(running, dtype=np.int64)
        ok = [m.allocate_decodes(ids) for m in mgrs]
        same(ok)
        if not ok[0]:
            victim = running.pop()
            for m in mgrs:
                m.free(victim)
            computed[victim] = 0
            produced[victim] = 0
            continue
        k_max = int(min(out_len[r] - produced[r] for r in running))
        runs = [m.decode_run(ids, k_max) for m in mgrs]
        same([r[0] for r in runs])
        same([r[1] for r in runs])
        k, used = runs[0]
        same([m.step_usage(ids, np.ones(len(ids), dtype=np.int64), k, used) for m in mgrs])
        computed[ids] += k
        produced[ids] += k
        for m in mgrs:
            m.commit_decodes(ids)
        for r in list(running):
            if produced[r] >= out_len[r]:
                running.remove(r)
                done.add(r)
                for m in mgrs:
                    m.free(r)
        assert_states(mgrs)


# ------------------------------------------------------------------------------ corruption
def corrupt(kind, mgr, how, rid, computed):
    """Apply one corruption to a manager (oracle or kernel-backed): returns False if it does not
    apply to this state."""
    static = kind.startswith("static")
    if static:
        ex = mgr.extents
        oracle = isinstance(mgr, ref.StaticKV)
    holders = sorted(mgr.holders.ids.tolist())
    if how == "held+1":
        if not holders:
            return False
        mgr.held[holders[0]] += 1
    elif how == "free-1":
        if static:
            if oracle:
                ex.free -= 1
            else:
                ex.s[0].free -= 1
        else:
            mgr.free_blocks -= 1
    elif how == "negative":
        if static or not holders:
            return False
        h = holders[0]
        mgr.free_blocks += 2 * int(mgr.held[h])
        mgr.held[h] = -mgr.held[h]
    elif how == "under":
        if kind != "elastic" or not holders:
            return False
        h = holders[0]
        mgr.held[h] -= 1
        mgr.free_blocks += 1
    elif how == "overlap":
        if not static or len(holders) < 2:
            return False
        mgr.start[holders[1]] = mgr.start[holders[0]]
    elif how == "past":
        if not static or not holders:
            return False
        computed[holders[0]] = int(mgr.held[holders[0]]) * mgr.block_size + 1
    elif how == "hole":
        if not static or not ex.holes():
            return False
        if oracle:
            ex.lengths[0] = 0
        else:
            ex.hole_len[0] = 0
    return True


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.sampled_from(["held+1", "free-1", "negative", "under", "overlap", "past", "hole"]))
def test_kv_check_catches_a_corrupted_state(data, how):
    setup = data.draw(setups())
    kind = setup[0]
    n = setup[2]
    computed = np.zeros(n, dtype=np.int32)
    mgrs = build(setup, computed)
    for rid in range(n):  # admit what fits, so there are holders
        if all([m.allocate(rid, int(setup[3][rid])) for m in mgrs]):
            computed[rid] = setup[3][rid]
    for m in mgrs:
        m.check()
    o, c, p = mgrs
    shared = computed.copy()
    if not corrupt(kind, o, how, 0, computed):
        return
    computed[:] = shared
    assert corrupt(kind, c, how, 0, computed)
    computed[:] = shared
    assert corrupt(kind, p, how, 0, computed)
    with pytest.raises(AssertionError) as want:
        o.check()
    for m in (c, p):
        with pytest.raises(AssertionError) as got:
            m.check()
        assert str(got.value) == str(want.value)
    h = c.holders
    code = K.kv_check(c.state, computed, h.ids, h.size)
    assert code != K.OK and code == jit.pure(K.kv_check)(p.state, computed, p.holders.ids, p.holders.size)


# ---------------------------------------------------------------------------- kernel contract
def test_step_usage_rows_without_the_extra_rows_are_the_same():
    """kv_step_usage with a (3, k) out fills the same internal/reserved/external as with (5, k)."""
    computed = np.array([5, 9, 0, 14], dtype=np.int32)
    for kind in (K.PAGED, K.ELASTIC, K.STATIC):
        kv = K.make_kv(kind, 64, 4, 4, base_blocks=2, growth_blocks=3, reserve_tokens=np.full(4, 40))
        holders = np.arange(3, dtype=np.int64)
        for r in holders:
            assert K.kv_allocate(kv, computed, r, 1)
        ids = np.array([0, 1], dtype=np.int64)
        used = np.empty(8, dtype=np.int64)
        k = K.kv_decode_run(kv, computed, ids, 2, 8, used)
        three, five = np.full((3, k), -1.0), np.full((5, 12), -1.0)
        K.kv_step_usage(kv, computed, holders, 3, ids, np.ones(2, dtype=np.int64), 2, k, used, three)
        K.kv_step_usage(kv, computed, holders, 3, ids, np.ones(2, dtype=np.int64), 2, k, used, five)
        np.testing.assert_array_equal(three, five[:3, :k])
        assert (five[:, k:] == -1.0).all()  # nothing written past k


def test_counts_kernels_and_make_kv_validation():
    kv = K.make_kv("paged", 10, 4, 3)
    computed = np.zeros(3, dtype=np.int32)
    assert K.kv_allocate(kv, computed, 1, 9) and K.kv_free_blocks(kv) == 7 and K.kv_used_blocks(kv) == 3
    assert K.kv_max_slots(kv) == 40
    twin = K.copy_kv(kv)  # independent arrays and scalars
    K.kv_free(twin, 1)
    assert K.kv_free_blocks(twin) == 10 and K.kv_free_blocks(kv) == 7 and kv.held[1] == 3
    with pytest.raises(ValueError, match="num_blocks >= 1"):
        K.make_kv("paged", 0, 4, 3)
    with pytest.raises(ValueError, match="kv kind 'pages'"):
        K.make_kv("pages", 4, 4, 3)
    with pytest.raises(ValueError, match="fit 'worst'"):
        K.make_kv("static", 4, 4, 1, reserve_tokens=[4], fit="worst")
    with pytest.raises(ValueError, match="reserve_tokens must be >= 1"):
        K.make_kv("static", 4, 4, 1, reserve_tokens=[0])


def test_decode_run_and_step_usage_are_linear_in_batch_plus_steps():
    """A 1000-step run of 128 requests: equal to the oracle, and each request's first crossing is
    computed once (not once per step): O(nb + k). Counted by overriding the crossing kernel."""
    n, k_max = 128, 1000
    computed = (np.arange(n, dtype=np.int32) * 7 % 300 + 1).astype(np.int32)
    calls = []
    first = jit.pure(K._first_step)

    def counted(x, threshold, period):
        calls.append(x)
        return first(x, threshold, period)

    for kind in ("paged", "elastic", "static"):
        kv = K.make_kv(kind, 1 << 20, 16, n, base_blocks=3, growth_blocks=2, reserve_tokens=np.full(n, 4096))
        o = {"paged": lambda: ref.PagedKV(1 << 20, 16, computed),
             "elastic": lambda: ref.ElasticKV(1 << 20, 16, computed, 3, 2),
             "static": lambda: ref.StaticKV(1 << 20, 16, computed, np.full(n, 4096), "first")}[kind]()
        ids = np.arange(n, dtype=np.int64)
        for r in range(n):
            assert K.kv_allocate(kv, computed, r, 1) and o.allocate(r, 1)
        assert K.kv_allocate_decodes(kv, computed, ids, n) and o.allocate_decodes(ids)
        used = np.empty(k_max, dtype=np.int64)
        calls.clear()
        k = jit.pure(K.kv_decode_run, {K._first_step: counted})(kv, computed, ids, n, k_max, used)
        assert len(calls) == (0 if kind == "static" else n)
        k_ref, used_ref = o.decode_run(ids, k_max)
        assert k == k_ref == k_max
        np.testing.assert_array_equal(used, used_ref)
        out = np.empty((5, k))
        calls.clear()
        jit.pure(K.kv_step_usage, {K._first_step: counted})(kv, computed, ids, n, ids, np.ones(n, dtype=np.int64),
                                                            n, k, used, out)
        assert len(calls) == (0 if kind == "paged" else n)
        u = o.step_usage(ids, np.ones(n, dtype=np.int64), k, used_ref)
        np.testing.assert_array_equal(out[:3], [u.internal, u.reserved_unused, u.external])


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 40), st.sampled_from(["first", "best"]), st.booleans(),
       st.lists(st.tuples(st.booleans(), st.sampled_from([1, 1, 2, 2, 3, 5]), st.integers(0, 100)), min_size=8,
                max_size=60))
def test_extents_equal_the_frozen_allocator(size, fit, pure, steps):
    """First/best fit placement, coalescing and hole statistics, with many equal-size holes."""
    from tests.kv_faces import ExtentAllocator

    o, e = ref.ExtentAllocator(size, fit), ExtentAllocator(size, fit, pure=pure)
    live = []
    for take, n, pick in steps:
        if take or not live:
            a, b = o.alloc(n), e.alloc(n)
            assert a == b
            if a >= 0:
                live.append((a, n))
        else:
            start, n = live.pop(pick % len(live))
            o.release(start, n)
            e.release(start, n)
        assert o.holes() == e.holes() and o.free == e.free and o.largest == e.largest
        assert [o.unusable(m) for m in range(1, 8)] == [e.unusable(m) for m in range(1, 8)]
        e.check()
    if live:  # releasing a live extent twice is refused with the oracle's message
        start, n = live[0]
        o.release(start, n)
        e.release(start, n)
        with pytest.raises(AssertionError) as want:
            o.release(start, n)
        with pytest.raises(AssertionError) as got:
            e.release(start, n)
        assert str(got.value) == str(want.value)
        assert o.holes() == e.holes()


def test_best_fit_breaks_ties_to_the_lowest_address():
    from tests.kv_faces import ExtentAllocator

    for ex in (ref.ExtentAllocator(20, "best"), ExtentAllocator(20, "best"), ExtentAllocator(20, "best", pure=True)):
        assert [ex.alloc(3) for _ in range(4)] == [0, 3, 6, 9]
        ex.release(0, 3)
        ex.release(6, 3)
        assert ex.alloc(2) == 0 and ex.alloc(3) == 6 and ex.holes() == [(2, 1), (12, 8)]


def test_paged_allocate_decodes_nets_out_requests_holding_more():
    """The vectorized rule sums ``want - held`` over the batch, so a request holding more than its
    next token needs (allocated ahead, not yet computed) offsets one that needs a block: with a
    zero total nothing is taken, as before the kernels."""
    computed = np.array([0, 4], dtype=np.int32)
    o, c, p = ref.PagedKV(3, 4, computed), PagedKV(3, 4, computed), PagedKV(3, 4, computed, pure=True)
    for m in (o, c, p):
        assert m.allocate(0, 8)  # 2 blocks for 8 tokens, none computed yet: its next token wants 1
        assert m.allocate(1, 0)  # 4 tokens computed, 1 block: its next token wants 2
        assert m.allocate_decodes(np.array([0, 1]))  # -1 + 1: nothing taken, though the pool is empty
    same([m.held.astype(np.int64) for m in (o, c, p)])
    assert c.held.tolist() == [2, 1] and c.free_blocks == o.free_blocks == p.free_blocks == 0
