"""The routed loop, compiled: engine/fleet_events.py ``Fleet._run_events`` for an open loop behind
least-tokens or least-requests (exact or sampled), one engine a replica, nothing else on the clock: the same steps in the
same order, with a return to Python only where Python must act (``X_*`` below). Its state
lives in arrays the fleet keeps between calls: ``key`` (each engine's next event), ``done``,
the engines' indexed heap ``eh``/``ehpos`` (engine/iheap.py) ordered by (key, engine) as the
Python loop's heapq of (key, engine) tuples, ``ints`` (the counters named below), ``fl`` (the next arrival
T, and the instant of the batch being routed), ``due`` (that batch), ``draws`` (a sampling
router's draws, refilled by Python from the run's router stream), ``rids`` (requests routed
since the last return: Python notes their arrivals at their engines) and ``late`` (ended
engines that were routed a request: Python takes it in).

Why a module of its own: this is a driver of the fleet (engine/cluster.py's loop, as a kernel),
not part of the load index it reads (engine/load_kernels.py: the trees, the re-read, the
step-end heap); it reads that index only through its kernels, as the Python router does.
"""

from __future__ import annotations

import numpy as np

from servesim.engine.iheap import iheap_set
from servesim.engine.inbox import due_arrivals, next_arrival
from servesim.engine.kernel import DONE, ERROR, FLUSH, UNTIL, advance_ref, route_in_ref
from servesim.engine.load_kernels import (
    TOK,
    mark_replica,
    replica_requests,
    replica_tokens,
    reread_requests,
    reread_tokens,
    routed_tokens,
    tree_least_from,
)
from servesim.engine.slots import take_slot
from servesim.jit import kernel

X_DONE, X_ENGINE, X_DRAWS, X_LATE, X_NOARRIVAL, X_WARMUP, X_CALLS, X_RIDS, X_STALL, X_GROW = range(10)
(I_EH, I_DONE, I_PTR, I_DRAW_I, I_DRAW_N, I_CALLS, I_RIDS, I_DUE_I, I_DUE_N, I_LATE, I_E, I_CODE, I_SAMPLED,
 I_SHUT, I_WARMUP, I_D, I_KIND, I_PHASE, I_SLOTS, I_CHOSEN) = range(20)
N_INTS = 20  # (I_SLOTS: the engines keep their requests in slots, engine/slots.py; I_CHOSEN: the
# replica chosen for the arrival being routed when the loop returned X_GROW, else -1)
ROUTING, ROUTED = 1, 2  # ints[I_PHASE]: a batch of arrivals being routed; routed (what follows it)
CALLS_EVERY = 8192  # engine calls between returns (the progress callback, a held Ctrl-C)


@kernel
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
def fleet_run(ref, icfg, ist, key, done, eh, ehpos, ints, fl, due, draws, rids, late, replica_of):
    """Run the fleet's loop until Python must act; returns why (``X_*``)."""
    n_eng = key.shape[0]
    refs = ref.refs
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
                    mark_replica(ref, r)
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
        code = advance_ref(x, bound)
        r = ref.rep_of[e]
        mark_replica(ref, r)
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
