"""Kernels of a fleet's incrementally kept loads (engine/load_index.py): the min segment tree,
and the re-read of the replicas whose load may have changed, in one compiled call.

This module is the load index only: what a load-reading router asks (the least-loaded replica,
one replica's load) and how the answer is kept current. The routed loop that drives it, compiled
(engine/fleet_loop.py), is a client of it as engine/router.py is, and lives apart so that each
can be read, and changed, without the other.

Before, the re-read was a Python loop (one kernel call per engine read, ~65 us a replica with
its bookkeeping) and took ~40 % of a 1,024-replica least-tokens run (benchmarks/RESULTS.md).
Here the fleet's load state is one StructRef (:data:`LoadsRef`: one pointer per call, as the
engines' ``EngineRef``), and a read passes only the engines touched since the last one.

A tree is an int64 array ``t`` of ``2 * size`` slots: leaves at ``size + i``, node ``i`` the
minimum of ``2i`` and ``2i + 1``, empty leaves :data:`BIG`, and ``t[0]`` (no node of a 1-based
tree) the sum of the ``n`` values -- affinity's load cap reads the fleet's total.

The replicas whose tokens change with time alone (a decode run under way: a step ending counts
its tokens as done, engine/inbox.py ``outstanding_work``) are keyed by their next step end on an
indexed binary heap (engine/iheap.py: one entry a replica, ``hpos[r]`` its place, -1: none; equal
step ends by replica id): a read at ``t`` first marks every replica whose step end came by ``t``.
The order in which due replicas are marked does not matter: each re-read touches only its own
replica's leaf, sum and heap entry (the Python path re-reads a set, in no set order).
"""

from __future__ import annotations

import numpy as np
from numba.core import cgutils
from numba.extending import intrinsic

from servesim.engine.iheap import iheap_set
from servesim.engine.inbox import INFLIGHT_RUN, outstanding_work
from servesim.jit import bisect_right, kernel, struct_ref
from servesim.kv.pool import _unowned

BIG = np.iinfo(np.int64).max  # an empty leaf
TOK, REQ = 0, 1  # rows of ``mark`` / ``pend`` and slots of ``ints`` (pending counts); ints[2]: heap length;
# ints[3]: 1 = a replica due by time alone is read in full too (FleetLoads.walk: benchmarks compare)

# refs: the engines' EngineRefs (typed list); first: replica r's engines are first[r]:first[r+1];
# rep_of: each engine's replica; routed: requests routed to each engine (the fleet's array);
# tok, req: the trees; size: their leaf count; mark/pend: replicas to re-read, per kind;
# step_at, heap, hpos: the next step end of each replica and the heap over them; ints: counts;
# wbase, lin: each engine's tokens before its run's steps and its batch size (reread_tokens)
LoadsRefType, LoadsRef, make_loads_ref = struct_ref(
    "LoadsRefType", "LoadsRef",
    ["refs", "first", "rep_of", "routed", "tok", "req", "size", "mark", "pend", "step_at", "heap", "hpos", "ints",
     "wbase", "lin"],
    "make_loads_ref", __name__, __file__)


@intrinsic
def _borrowed_list(typingctx, lst):
    """A typed list without its meminfo (its items are reached through its data pointer): the
    list the fleet holds (``Fleet._refs``), read by every routed event."""
    def codegen(context, builder, sig, args):
        c = cgutils.create_struct_proxy(sig.args[0])(context, builder, value=args[0])
        c.meminfo = cgutils.get_null_value(c.meminfo.type)
        return c._getvalue()
    return lst(lst), codegen


@kernel
def make_loads_borrowed(refs, first, rep_of, routed, tok, req, size, mark, pend, step_at, heap, hpos, ints, wbase,
                        lin):
    """The LoadsRef with its list of EngineRefs and every array but ``req`` unowned (null meminfo), as the engines' state
    (engine/kernel.py ``borrowed_state``): owned, each ``ref.field`` a kernel reads across a
    branch was an atomic increment and decrement of that array's meminfo -- ~6 a routed event
    (the heap of step ends, the marks), fleet-only work on the routed loop's path. ``req`` (read
    only by a least-requests router) stays owned through a view whose base holds the others
    (engine/load_index.py), so they live as long as the LoadsRef."""
    return make_loads_ref(_borrowed_list(refs), _unowned(first), _unowned(rep_of), _unowned(routed), _unowned(tok), req, size,
                          _unowned(mark), _unowned(pend), _unowned(step_at), _unowned(heap), _unowned(hpos),
                          _unowned(ints), _unowned(wbase), _unowned(lin))


@kernel
def tree_set(t, size, i, v):
    """Leaf ``i`` takes ``v``: its ancestors up to the first that keeps its minimum, and the sum."""
    i += size
    old = t[i]
    if old == v:
        return
    t[0] += v - old
    t[i] = v
    i >>= 1
    while i:
        a = t[2 * i]
        b = t[2 * i + 1]
        m = a if a <= b else b
        if t[i] == m:
            break
        t[i] = m
        i >>= 1


@kernel(inline=True)
def tree_first_at_most(t, size, n, lo, x):
    """The first leaf at or after ``lo`` whose value is <= ``x`` (-1: none)."""
    if lo >= n:
        return -1
    i = lo + size
    if t[i] <= x:
        return lo
    while i > 1:
        if not i & 1 and t[i + 1] <= x:
            i += 1
            while i < size:
                i = 2 * i if t[2 * i] <= x else 2 * i + 1
            return i - size
        i >>= 1
    return -1


@kernel
def tree_least_from(t, size, n, ptr):
    """``Router.least``'s choice: a leaf holding the minimum, the first at or after ``ptr``, else
    the first from the start."""
    low = t[1]
    best = tree_first_at_most(t, size, n, ptr, low)
    return best if best >= 0 else tree_first_at_most(t, size, n, 0, low)


@kernel(inline=True)
def _step_at_set(ref, r, v):
    """Replica ``r``'s next step end is ``v`` (inf: none): its heap entry moved, made or removed."""
    ref.ints[2] = iheap_set(ref.step_at, ref.heap, ref.hpos, ref.ints[2], r, v)


@kernel(inline=True)
def _mark(ref, kind, r):
    """Replica ``r`` was touched: re-read in full at the next read of ``kind`` (mark 1; a
    replica due by time alone is marked 2 until then: :func:`reread_tokens`)."""
    _mark_in(ref.mark, ref.pend, ref.ints, kind, r)


@kernel(inline=True)
def _mark_in(mark, pend, ints, kind, r):
    m = mark[kind, r]
    if m != 1:
        if m == 0:
            pend[kind, ints[kind]] = r
            ints[kind] += 1
        mark[kind, r] = 1


@kernel(inline=True)
def mark_replica(ref, r):
    """Replica ``r`` was touched (advanced, routed to, restarted): re-read at the next read of
    either kind."""
    mark_replica_in(ref.mark, ref.pend, ref.ints, r)


@kernel(inline=True)
def mark_replica_in(mark, pend, ints, r):
    """:func:`mark_replica` given the LoadsRef's ``mark``, ``pend`` and ``ints`` (the routed loop
    reads them once a call: each pass of the LoadsRef itself is a count of its meminfo)."""
    _mark_in(mark, pend, ints, TOK, r)
    _mark_in(mark, pend, ints, REQ, r)


@kernel
def routed_tokens(ref, r, e, rid):
    """Replica ``r`` (engine ``e``) was sent request ``rid`` right after a read of the tokens
    tree at the arrival's instant: its load grows by the request's tokens (``outstanding_work``
    counts a routed request's ``prompt + output - computed``) without a re-read -- a walk over
    every request it holds -- at the next read. A decode run the request cut keeps its steps
    ending before the arrival and the first at or after it (engine/inbox.py ``route_in``), so its
    next step end (the heap's key) and the steps done by any later instant are those the next
    read would find; ``wbase`` (the run's tokens before its steps) grows by as much."""
    st = ref.refs[e].state
    w = np.int64(st.prompt[rid]) + np.int64(st.output[rid]) - np.int64(st.computed[rid])
    tree_set(ref.tok, ref.size, r, ref.tok[ref.size + r] + w)
    ref.wbase[e] += w
    _mark(ref, REQ, r)


@kernel
def called_tokens(ref, r, e, x):
    """Engine ``e`` (EngineRef ``x``) of replica ``r`` has just been called: read its tokens now,
    while the requests it just stepped are in cache, instead of in full at the next read of the
    tree, after other engines' calls have evicted them. Until its next call, a routing there or
    a touch from Python -- each of which updates or marks it again -- its state stays as it is
    now, so the next read finds ``outstanding_work`` at any later ``t`` as ``wbase - done * lin``,
    as for a replica due by time alone (:func:`reread_tokens`): ``wbase`` its tokens before its
    run's steps (``outstanding_work`` before the run's first step end: ``done = 0``), ``lin`` the
    batch size. Where that does not hold (a multi-step burst, a request finishing inside the run:
    ``lin = -1``; a replica of several engines) the replica is marked for the full read.

    (Tried in 3b98258 and reverted: the read then walked the replica's waiting queues too, which
    no call touched, and cost more at 1M requests than the cold read it saved; since the queues'
    tokens are a running count, ``st.s.q_work``, it walks only the running set the call touched.)"""
    st = x.state
    mark, pend, ints = ref.mark, ref.pend, ref.ints
    lin = run_slope(st)
    first = ref.first
    if lin < 0 or mark[TOK, r] == 1 or first[r + 1] - first[r] != 1:
        mark_replica_in(mark, pend, ints, r)
        return
    ref.wbase[e] = outstanding_work(x.conf.cfg, st, -np.inf)
    ref.lin[e] = lin
    if mark[TOK, r] == 0:  # (read by ``wbase`` at the next read, like a replica due by time)
        mark[TOK, r] = 2
        pend[TOK, ints[TOK]] = r
        ints[TOK] += 1
    _mark_in(mark, pend, ints, REQ, r)


@kernel(inline=True)
def run_slope(st):
    """Tokens an engine's decode run under way takes off its outstanding work per step (its batch
    size): 0 when no run is under way; -1 when the work cannot be stepped that way -- a multi-step
    burst, or a request that finishes inside the run -- and must be read in full."""
    if st.s.inflight != INFLIGHT_RUN:
        return np.int64(0)
    k = st.s.run_k
    lin = np.int64(st.s.b_len)
    if st.s.b_steps > 1:
        lin = np.int64(-1)
    for i in range(st.s.b_len):
        q = st.b_ids[i]
        if np.int64(st.output[q]) - np.int64(st.num_output[q]) < k:
            lin = np.int64(-1)
    return lin


@kernel
def mark_touched(ref, touched):
    """The replicas of engines ``touched`` are re-read at the next read of either kind."""
    for j in range(touched.shape[0]):
        mark_replica(ref, ref.rep_of[touched[j]])


@kernel
def replica_tokens(ref, r, t):
    """Replica ``r``'s outstanding tokens at ``t``, read alone."""
    w = np.int64(0)
    for e in range(ref.first[r], ref.first[r + 1]):
        x = ref.refs[e]
        w += outstanding_work(x.conf.cfg, x.state, t)
    return w


@kernel
def replica_requests(ref, r):
    """Replica ``r``'s outstanding requests (routed there, not ended), read alone."""
    v = np.int64(0)
    for e in range(ref.first[r], ref.first[r + 1]):
        v += ref.routed[e] - ref.refs[e].state.s.ended
    return v


@kernel
def reread_tokens(ref, t):
    """The tokens tree at ``t``: re-read the replicas marked since the last read and those whose
    decode run's next step ended by ``t``; key each re-read replica by its next step end after
    ``t``.

    A replica due by time alone was not called since its last read, so only the steps of its
    run done by ``t`` changed: ``outstanding_work`` subtracts ``min(done, rem)`` for each request
    of the batch, and in a run that is no multi-step burst no request finishes before the run's
    last step (``rem >= run_k >= done``, checked at the full read), so its tokens are the full
    read's value before any step (``wbase``) less ``done * b_len`` (``lin``: the batch size; -1:
    a burst, read in full) -- O(1) instead of a walk over every request it holds."""
    heap, at = ref.heap, ref.step_at
    while ref.ints[2] > 0 and at[heap[0]] <= t:
        r = heap[0]
        if ref.mark[TOK, r] == 0:
            ref.mark[TOK, r] = 2
            ref.pend[TOK, ref.ints[TOK]] = r
            ref.ints[TOK] += 1
        _step_at_set(ref, r, np.inf)
    pend = ref.pend
    for j in range(ref.ints[TOK]):
        r = pend[TOK, j]
        full = ref.mark[TOK, r] == 1
        ref.mark[TOK, r] = 0
        w = np.int64(0)
        nxt = np.inf
        for e in range(ref.first[r], ref.first[r + 1]):
            x = ref.refs[e]
            st = x.state
            run = st.s.inflight == INFLIGHT_RUN
            k = st.s.run_k if run else 0
            done = bisect_right(st.ends[:k], t) if run else 0
            if full or ref.lin[e] < 0 or ref.ints[3]:
                we = outstanding_work(x.conf.cfg, st, t)
                if full:
                    lin = run_slope(st)
                    ref.lin[e] = lin
                    ref.wbase[e] = we + done * lin if lin > 0 else we
            else:
                we = ref.wbase[e] - done * ref.lin[e]
            w += we
            if run and done < k and st.ends[done] < nxt:
                nxt = st.ends[done]
        tree_set(ref.tok, ref.size, r, w)
        _step_at_set(ref, r, nxt)
    ref.ints[TOK] = 0


@kernel
def reread_requests(ref):
    """The requests tree: re-read the replicas marked since the last read."""
    pend = ref.pend
    for j in range(ref.ints[REQ]):
        r = pend[REQ, j]
        ref.mark[REQ, r] = 0
        tree_set(ref.req, ref.size, r, replica_requests(ref, r))
    ref.ints[REQ] = 0


@kernel
def refresh_tokens(ref, touched, t):
    """Mark the replicas of the engines ``touched`` since the last read, then :func:`reread_tokens`."""
    mark_touched(ref, touched)
    reread_tokens(ref, t)


@kernel
def refresh_requests(ref, touched):
    mark_touched(ref, touched)
    reread_requests(ref)
