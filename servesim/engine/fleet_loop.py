"""The routed loop, compiled: engine/fleet_events.py ``Fleet._run_events`` for an open loop behind
least-tokens or least-requests (exact or sampled), one engine a replica, nothing else on the clock: the same steps in the
same order, with a return to Python only where Python must act (``X_*`` below). Its state
lives in arrays the fleet keeps between calls: ``key`` (each engine's next event), ``done``,
the engines' indexed heap ``eh``/``ehpos`` (engine/iheap.py) ordered by (key, engine) as the
Python loop's heapq of (key, engine) tuples, ``ints`` (the counters named below), ``fl`` (the next arrival
T, and the instant of the batch being routed), ``due`` (that batch), ``draws`` (a sampling
router's draws, refilled by Python from the run's router stream), ``rids`` (requests routed
since the last return: Python notes their arrivals at their engines), ``late`` (ended
engines that were routed a request: Python takes it in) and ``lines`` (what to prefetch of each
engine before its call: below; it changes no result).

Why a module of its own: this is a driver of the fleet (engine/cluster.py's loop, as a kernel),
not part of the load index it reads (engine/load_kernels.py: the trees, the re-read, the
step-end heap); it reads that index only through its kernels, as the Python router does.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from servesim.engine.iheap import iheap_set
from servesim.engine.inbox import due_arrivals, next_arrival
from servesim.engine.kernel import DONE, ERROR, FLUSH, UNTIL, advance_ref, route_in_ref
from servesim.engine.load_kernels import (
    TOK,
    called_tokens,
    mark_replica_in,
    replica_requests,
    replica_tokens,
    reread_requests,
    reread_tokens,
    routed_tokens,
    tree_least_from,
)
from servesim.engine.slots import take_slot
from servesim.jit import kernel
from servesim.kv.pool import _unowned

X_DONE, X_ENGINE, X_DRAWS, X_LATE, X_NOARRIVAL, X_WARMUP, X_CALLS, X_RIDS, X_STALL, X_GROW = range(10)
(I_EH, I_DONE, I_PTR, I_DRAW_I, I_DRAW_N, I_CALLS, I_RIDS, I_DUE_I, I_DUE_N, I_LATE, I_E, I_CODE, I_SAMPLED,
 I_SHUT, I_WARMUP, I_D, I_KIND, I_PHASE, I_SLOTS, I_CHOSEN) = range(20)
N_INTS = 20  # (I_SLOTS: the engines keep their requests in slots, engine/slots.py; I_CHOSEN: the
# replica chosen for the arrival being routed when the loop returned X_GROW, else -1)
ROUTING, ROUTED = 1, 2  # ints[I_PHASE]: a batch of arrivals being routed; routed (what follows it)
CALLS_EVERY = 8192  # engine calls between returns (the progress callback, a held Ctrl-C)


# ------------------------------------------------------------------ the next engine's lines, early
# Each engine call reads its engine's state cold (1,024 engines: its lines were evicted since its
# last call), one dependent miss after another: the EngineRef, then the state's and the KV pool's
# StructRefs (their reference counts, then ~50 array descriptors), then the arrays. The next
# engine to be called is nearly always the smaller child of the engine heap's root, known before
# the current call starts: its lines are prefetched then, so its misses overlap this call's work
# instead of stalling its own. ``lines[e]`` holds (address, bytes) pairs for engine ``e``
# (:func:`engine_lines`); a prefetch never faults, so an address gone stale (an engine rebound)
# costs a useless prefetch and nothing else. Results do not depend on it.
N_STATIC = 8  # (address, bytes) pairs an engine, fixed while it is bound (engine_lines) ...
N_ROWS = 13  # ... where its next recorder row and inter-token gap go (note_lines: 3 + signals + 2) ...
RUN_COLS = 7  # ... and its running requests' columns, as its last call left them (note_lines)
N_LINES = N_STATIC + N_ROWS + RUN_COLS
RUN_SPAN = 128  # the running requests' slots prefetched: the last ones taken, at most this many
BATCH_BYTES = 320  # of the batch's and running set's rows (~40 requests a replica at the benchmark's load)
MI_HEADER = 48  # numba's NRT_MemInfo (refcount, dtor, dtor_info, data, size, allocator): the
# StructRef's payload follows it in the same allocation (NRT_MemInfo_alloc_dtor)


@intrinsic
def _prefetch(typingctx, addr, nbytes):
    """Prefetch (for writing, into every cache level) the lines of ``[addr, addr + nbytes)``
    (none if ``nbytes`` is 0)."""
    def codegen(context, builder, sig, args):
        a, n = args
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch.p0")
        lead = builder.and_(a, ir.Constant(a.type, 63))  # (from the line that holds ``addr``)
        a = builder.sub(a, lead)
        n = builder.select(builder.icmp_signed("==", n, ir.Constant(n.type, 0)), n, builder.add(n, lead))
        with cgutils.for_range_slice(builder, ir.Constant(n.type, 0), n, ir.Constant(n.type, 64)) as (off, _):
            p = builder.inttoptr(builder.add(a, off), i8p)
            builder.call(fn, [p, ir.Constant(i32, 1), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()
    return types.void(types.int64, types.int64), codegen


COLD_FROM = "ps"  # a StructRef's fields from this one on are not prefetched (the KV pool's prefix
# cache and tiers: kv/pool.py KVState; an engine's call without them reads none of those ~70 fields)


@intrinsic
def _block(typingctx, sref):
    """(address, bytes) of a StructRef's allocation: its meminfo and the payload after it, up to
    a field named :data:`COLD_FROM` if it has one."""
    def codegen(context, builder, sig, args):
        ty = sig.args[0]
        mi = cgutils.create_struct_proxy(ty)(context, builder, value=args[0]).meminfo
        size = MI_HEADER
        for name, fty in ty.field_dict.items():  # (every field 8-aligned: int64, float64, arrays)
            if name == COLD_FROM:
                break
            size += context.get_abi_sizeof(context.get_data_type(fty))
        tup = context.make_tuple(builder, sig.return_type,
                                 [builder.ptrtoint(mi, ir.IntType(64)), ir.Constant(ir.IntType(64), size)])
        return tup
    return types.UniTuple(types.int64, 2)(sref), codegen


@intrinsic
def _record_at(typingctx, rec):
    """The address of a record (numba passes a record by its data pointer)."""
    def codegen(context, builder, sig, args):
        return builder.ptrtoint(args[0], ir.IntType(64))
    return types.int64(rec), codegen


@kernel
def engine_lines(ref, lines):
    """``lines[e]``: what engine ``e``'s call reads first -- its EngineRef, its state's and KV
    pool's StructRefs, the state's scalars and its batch's head rows."""
    refs = ref.refs
    for e in range(len(refs)):
        x = refs[e]
        st = x.state
        lines[e, 0], lines[e, 1] = _block(x)
        lines[e, 2], lines[e, 3] = _block(st)
        lines[e, 4], lines[e, 5] = _block(x.kv)
        lines[e, 6], lines[e, 7] = np.int64(st.b_ids.ctypes.data), np.int64(min(st.b_ids.nbytes, BATCH_BYTES))
        lines[e, 8], lines[e, 9] = np.int64(st.run.ctypes.data), np.int64(min(st.run.nbytes, BATCH_BYTES))
        lines[e, 10], lines[e, 11] = np.int64(st.b_new.ctypes.data), np.int64(min(st.b_new.nbytes, BATCH_BYTES))
        lines[e, 12], lines[e, 13] = np.int64(st.ends.ctypes.data), np.int64(min(st.ends.nbytes, 128))
        lines[e, 14], lines[e, 15] = _record_at(st.s), np.int64(352)


@kernel(inline=True)
def _note(lines, e, j, addr, nbytes):
    lines[e, 2 * j] = addr
    lines[e, 2 * j + 1] = nbytes


@kernel(inline=True)
def _note_col(lines, e, j, a, lo, n):
    _note(lines, e, j, np.int64(a.ctypes.data) + lo * a.itemsize, n * a.itemsize)


@kernel
def note_lines(x, lines, e, slots):
    """After engine ``e``'s call, while its state is in cache: what its next call will write
    and read first -- the recorder's next row (``record``: a line in each of ~11 buffers) and its
    running requests' rows in the columns the commit, the KV pool and the scheduler read (a
    request admitted meanwhile is not among them: its slot comes after). Only with ``slots``
    (engine/slots.py): without, a replica's requests are ids ~N apart in the fleet's table."""
    st = x.state
    rows = st.s.rows
    j = N_STATIC
    for a in (st.rb_start, st.rb_end):
        _note(lines, e, j, np.int64(a.ctypes.data) + 8 * rows, 8)
        j += 1
    _note(lines, e, j, np.int64(st.rb_itlw.ctypes.data) + 8 * rows, 8)
    j += 1
    vals = st.rb_vals
    for v in range(N_ROWS - 5):
        ok = v < vals.shape[0]
        _note(lines, e, j, np.int64(vals.ctypes.data) + v * vals.strides[0] + 8 * rows if ok else 0, 8 if ok else 0)
        j += 1
    _note(lines, e, j, np.int64(st.itl_v.ctypes.data) + 8 * st.s.itl_len, 8)
    _note(lines, e, j + 1, np.int64(st.itl_w.ctypes.data) + 8 * st.s.itl_len, 8)
    j += 2
    hi = np.int64(-1)
    lo = np.int64(1 << 62)
    for i in range(st.s.run_len):
        q = np.int64(st.run[i])
        hi = q if q > hi else hi
        lo = q if q < lo else lo
    if hi < 0 or not slots:
        for c in range(RUN_COLS):
            _note(lines, e, j + c, 0, 0)
        return
    if hi - lo >= RUN_SPAN:
        lo = hi - RUN_SPAN + 1
    n = hi - lo + 1
    _note_col(lines, e, j, st.computed, lo, n)
    _note_col(lines, e, j + 1, st.num_output, lo, n)
    _note_col(lines, e, j + 2, st.output, lo, n)
    _note_col(lines, e, j + 3, st.prompt, lo, n)
    _note_col(lines, e, j + 4, st.t_last, lo, n)
    _note_col(lines, e, j + 5, st.status, lo, n)
    held = x.kv.held  # (by slot: engine/slots.py)
    if hi < held.shape[0]:
        _note_col(lines, e, j + 6, held, lo, n)
    else:
        _note(lines, e, j + 6, 0, 0)


@kernel(inline=True)
def prefetch_engine(lines, e):
    for j in range(N_LINES):
        _prefetch(lines[e, 2 * j], lines[e, 2 * j + 1])


@kernel(inline=True)
def eh_set(key, eh, ehpos, ints, e, k):
    """Engine ``e``'s next event is ``k`` (inf: it has ended): its heap entry moved, made or
    removed."""
    ints[I_EH] = iheap_set(key, eh, ehpos, ints[I_EH], e, k)


@kernel
def fleet_shut(ref, key, done, eh, ehpos, ints):
    """``Fleet._shut``: the inbox is exhausted; engines may end once drained, idle ones are
    woken (keyed now) to see it."""
    for i in range(key.shape[0]):
        if done[i]:
            continue
        s = ref.refs[i].state.s
        s.inbox_shut = 1
        if s.inflight == 0:
            k = s.now
            if k != key[i]:
                eh_set(key, eh, ehpos, ints, i, k)
    ints[I_SHUT] = 1


@kernel(inline=True)
def _choose(ref, ints, draws, t):
    """The router's replica for an arrival at ``t`` (``Router.least_of``)."""
    d = ints[I_D]
    if d > 0:  # power of d choices: the least loaded of d drawn, ties to the first drawn
        best = -1
        low = np.int64(0)
        for _ in range(d):
            r = draws[ints[I_DRAW_I]]
            ints[I_DRAW_I] += 1
            v = replica_tokens(ref, r, t) if ints[I_KIND] == TOK else replica_requests(ref, r)
            if best < 0 or v < low:
                best = r
                low = v
        ints[I_SAMPLED] += 1
        return best
    if ints[I_KIND] == TOK:
        reread_tokens(ref, t)
        tree = ref.tok
    else:
        reread_requests(ref)
        tree = ref.req
    n = ref.first.shape[0] - 1
    best = tree_least_from(tree, ref.size, n, ints[I_PTR])
    ints[I_PTR] = best + 1 if best + 1 < n else 0
    return best


@kernel
def fleet_run(ref, icfg, ist, key, done, eh, ehpos, ints, fl, due, draws, rids, late, replica_of, lines):
    """Run the fleet's loop until Python must act; returns why (``X_*``)."""
    # (the arrays unowned for the call, which Python's references outlive: each one a kernel
    # passes or reads across a branch is otherwise an atomic count of its meminfo, ~5 an event)
    key, done, eh, ehpos, ints, fl = _unowned(key), _unowned(done), _unowned(eh), _unowned(ehpos), _unowned(ints), \
        _unowned(fl)
    due, draws, rids, late, replica_of, lines = _unowned(due), _unowned(draws), _unowned(rids), _unowned(late), \
        _unowned(replica_of), _unowned(lines)
    n_eng = key.shape[0]
    refs = ref.refs
    mark, pend, lints = ref.mark, ref.pend, ref.ints
    while True:
        if ints[I_PHASE] == ROUTING:  # the batch of arrivals at fl[1], in (time, id) order
            t = fl[1]
            while ints[I_DUE_I] < ints[I_DUE_N]:
                rid = due[ints[I_DUE_I]]
                r = ints[I_CHOSEN]
                if r < 0:
                    if ints[I_D] > 0 and ints[I_DRAW_N] - ints[I_DRAW_I] < ints[I_D]:
                        return X_DRAWS
                    if ints[I_RIDS] >= rids.shape[0]:
                        return X_RIDS
                    r = _choose(ref, ints, draws, t)
                e = ref.first[r]
                x = refs[e]
                slot = rid
                if ints[I_SLOTS]:
                    st = x.state
                    if st.s.n_local >= st.gid.shape[0]:  # full: Python doubles its slots, and we resume here
                        ints[I_CHOSEN] = r
                        ints[I_E] = e
                        return X_GROW
                    slot = take_slot(st, rid, ist.arrival, ist.prompt, ist.output, ist.klass)
                ints[I_CHOSEN] = -1
                ints[I_DUE_I] += 1
                route_in_ref(x, slot)
                ref.routed[e] += 1
                if ints[I_D] == 0 and ints[I_KIND] == TOK and not done[e]:
                    routed_tokens(ref, r, e, slot)  # (the tree was read at t: its value grows by the request's)
                else:
                    mark_replica_in(mark, pend, lints, r)
                replica_of[rid] = r
                rids[ints[I_RIDS]] = rid
                ints[I_RIDS] += 1
                s = x.state.s
                if s.inflight:
                    k = s.t_end  # (route_in may have cut its decode run)
                elif s.idle:
                    k = key[e] if key[e] < t else t  # it wakes up for this arrival, if not earlier
                else:
                    k = key[e]  # a boundary it has yet to plan
                if done[e]:
                    seen = False
                    for j in range(ints[I_LATE]):
                        seen = seen or late[j] == e
                    if not seen:
                        late[ints[I_LATE]] = e
                        ints[I_LATE] += 1
                elif k != key[e]:
                    eh_set(key, eh, ehpos, ints, e, k)
                if rid == ints[I_WARMUP]:
                    return X_WARMUP
            fl[0] = next_arrival(icfg, ist)
            ints[I_PHASE] = ROUTED
        if ints[I_PHASE] == ROUTED:
            if ints[I_LATE] > 0:  # (Python takes them in, in engine order, and clears the count)
                return X_LATE
            ints[I_PHASE] = 0
            if ints[I_SHUT] == 0 and fl[0] == np.inf:
                return X_NOARRIVAL
            continue
        if ints[I_DONE] >= n_eng:
            return X_DONE
        T = fl[0]
        k_min = key[eh[0]] if ints[I_EH] > 0 else np.inf
        if T <= k_min and T < np.inf:
            batch = due_arrivals(icfg, ist, T)
            m = batch.shape[0]
            due[:m] = batch
            ints[I_DUE_I] = 0
            ints[I_DUE_N] = m
            ints[I_PHASE] = ROUTING
            fl[1] = T
            continue
        if k_min == np.inf:
            return X_STALL
        e = eh[0]
        bound = np.nextafter(T, -np.inf) if T < np.inf else np.inf  # arrivals at T are routed first
        x = refs[e]
        n_eh = ints[I_EH]
        if n_eh > 1:  # the engine called next, most likely (the smaller child of the root)
            nxt = eh[1]
            if n_eh > 2 and (key[eh[2]] < key[nxt] or (key[eh[2]] == key[nxt] and eh[2] < nxt)):
                nxt = eh[2]
            prefetch_engine(lines, nxt)
        code = advance_ref(x, bound)
        note_lines(x, lines, e, ints[I_SLOTS])
        r = ref.rep_of[e]
        if ints[I_D] == 0 and ints[I_KIND] == TOK and lints[3] == 0:
            called_tokens(ref, r, e, x)  # (its tokens read now, while its requests are in cache)
        else:
            mark_replica_in(mark, pend, lints, r)
        if code == DONE:
            done[e] = 1
            ints[I_DONE] += 1
            eh_set(key, eh, ehpos, ints, e, np.inf)
            continue
        s = x.state.s
        if s.inflight:
            k = s.t_end
        elif code == UNTIL:
            k = s.wake
        else:
            k = s.now
        eh_set(key, eh, ehpos, ints, e, k)
        ints[I_CALLS] += 1
        if code == FLUSH or code == ERROR:
            ints[I_E] = e
            ints[I_CODE] = code
            return X_ENGINE
        if ints[I_CALLS] % CALLS_EVERY == 0:
            return X_CALLS
