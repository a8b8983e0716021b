"""A replica's inbox: arrivals in time order, rejections at arrival, a fleet's routed FIFO.

Open-loop requests are read from the arrival column with a cursor; closed-loop clients' next
requests wait in a binary heap of (arrival time, row) until their turn (a client's next request
arrives when its previous one ended, plus think time). A request that can never run (longer than
``max_model_len``, more KV than the pool, more than the token budget without chunking) is rejected
as it arrives and ends its client's turn.

Routed (a fleet's replica, ``cfg.routed``): arrivals come from a router, one request at a time,
into a FIFO (:func:`route_in`); the driver (engine/cluster.py) only lets a replica plan at a
boundary once every arrival up to it has been routed. Decode runs are planned without ``until``
(they would be cut at every fleet event otherwise); a run planned before an arrival was routed
here is cut by :func:`route_in` exactly where planning would have cut it had the arrival been
known. With ``cfg.report_ended``, ended requests are listed for the driver (a fleet's closed
loops send their clients' next requests through the router) and ``advance`` returns ENDED at the
first boundary where one ended: right after the commit that finished it (the next request of a
client that does not think must be routed before that boundary's schedule, as the single replica
pulls it there), or after the planning of the boundary whose pull rejected it.
"""

from __future__ import annotations

import numpy as np

from servesim.jit import bisect_left, bisect_right, kernel
from servesim.request import REJECTED
from servesim.sched.queues import enqueue, queued_work_walk
from servesim.sched.state import start_waiting, work_left

INFLIGHT_NONE, INFLIGHT_MIXED, INFLIGHT_RUN = 0, 1, 2  # what the replica has planned (st.s.inflight)
R_MML, R_KV, R_BUDGET = 1, 2, 3  # servesim.request.Reject


@kernel(inline=True)
def next_arrival(cfg, st):
    """When the next request arrives (inf: none is known yet)."""
    if cfg.routed:
        h = st.s.in_head
        return st.arrival[h] if h >= 0 else np.inf
    if st.s.inbox_shut:
        return np.inf
    t = np.inf
    if cfg.closed and st.s.heap_len > 0:
        t = st.heap_t[0]
    c = st.s.cursor
    if c < cfg.n and st.arrival[c] < t:
        t = st.arrival[c]
    return t


@kernel(inline=True)
def heap_less(st, a, b):
    return st.heap_t[a] < st.heap_t[b] or (st.heap_t[a] == st.heap_t[b] and st.heap_id[a] < st.heap_id[b])


@kernel(inline=True)
def heap_swap(st, a, b):
    st.heap_t[a], st.heap_t[b] = st.heap_t[b], st.heap_t[a]
    st.heap_id[a], st.heap_id[b] = st.heap_id[b], st.heap_id[a]


@kernel
def heap_push(st, t, rid):
    i = st.s.heap_len
    st.heap_t[i] = t
    st.heap_id[i] = rid
    st.s.heap_len = i + 1
    while i > 0:
        p = (i - 1) // 2
        if heap_less(st, i, p):
            heap_swap(st, i, p)
            i = p
        else:
            break


@kernel
def heap_pop(st):
    rid = st.heap_id[0]
    last = st.s.heap_len - 1
    st.s.heap_len = last
    if last > 0:
        st.heap_t[0] = st.heap_t[last]
        st.heap_id[0] = st.heap_id[last]
        i = 0
        while True:
            left = 2 * i + 1
            if left >= last:
                break
            m = left
            if left + 1 < last and heap_less(st, left + 1, left):
                m = left + 1
            if heap_less(st, m, i):
                heap_swap(st, m, i)
                i = m
            else:
                break
    return rid


@kernel
def request_ended(cfg, st, rid, t):
    """Request ``rid`` ended (finished or rejected) at ``t``. In a closed loop its client thinks,
    then its group sends the group's next row. Routed: listed for the driver (whose fleet inbox
    runs this same rule for the fleet's closed loops)."""
    st.s.ended += 1
    if cfg.report_ended:
        st.in_next[rid] = -1
        if st.s.end_tail >= 0:
            st.in_next[st.s.end_tail] = rid
        else:
            st.s.end_head = rid
        st.s.end_tail = rid
        return
    if not cfg.closed or st.s.inbox_shut:
        return
    g = st.group_of[rid]
    if g < 0:
        return
    row = st.g_next[g]
    if row >= st.g_hi[g]:
        return
    st.g_next[g] = row + 1
    st.arrival[row] = t + st.think[row]
    heap_push(st, t + st.think[row], row)


@kernel(inline=True)
def reject_reason(cfg, st, rid):
    total = np.int64(st.prompt[rid]) + np.int64(st.output[rid])
    reason = 0
    if total - 1 > cfg.max_slots:
        reason = R_KV
    if total > cfg.max_model_len:
        reason = R_MML
    if reason == 0 and not cfg.chunked and st.prompt[rid] > cfg.budget:
        reason = R_BUDGET
    if reason == 0 and cfg.sglang_admission:  # SGLang's reservation could never pass, even alone
        o = np.int64(st.output[rid])
        if np.int64(st.prompt[rid]) + (o if o < 4096 else 4096) + cfg.block_size >= cfg.max_slots:
            reason = R_KV
    return reason


@kernel
def due_arrivals(cfg, st, t):
    """Ids of every request arriving at or before ``t`` in (time, id) order: sent closed-loop
    rows (the heap) merged with open-loop rows (the cursor). Past the arrival cap, nothing else
    arrives: the rest are cancelled (their arrival time becomes NaN, as for rows never sent).
    Routed: the rows the router sent here, in the order sent (the fleet inbox applied the cap)."""
    if cfg.routed:
        m = 0
        r = st.s.in_head
        while r >= 0 and st.arrival[r] <= t:
            m += 1
            r = st.in_next[r]
        out = np.empty(m, dtype=np.int64)
        for k in range(m):
            r = st.s.in_head
            out[k] = r
            st.s.q_work -= work_left(st, r)  # (pull_arrivals enqueues those it does not reject)
            st.s.in_head = st.in_next[r]
        if st.s.in_head < 0:
            st.s.in_tail = -1
        st.s.arrived += m
        return out
    if st.s.inbox_shut:
        return np.empty(0, dtype=np.int64)
    closed = np.empty(st.s.heap_len if cfg.closed else 0, dtype=np.int64)
    m = 0
    if cfg.closed:
        while st.s.heap_len > 0 and st.heap_t[0] <= t:
            closed[m] = heap_pop(st)
            m += 1
    lo = st.s.cursor
    hi = lo
    while hi < cfg.n and st.arrival[hi] <= t:
        hi += 1
    st.s.cursor = hi
    ids = np.empty(m + hi - lo, dtype=np.int64)
    i = 0
    j = lo
    for k in range(m + hi - lo):  # merge by (time, id)
        if j >= hi or (i < m and (st.arrival[closed[i]] < st.arrival[j]
                                  or (st.arrival[closed[i]] == st.arrival[j] and closed[i] < j))):
            ids[k] = closed[i]
            i += 1
        else:
            ids[k] = j
            j += 1
    room = cfg.max_arrivals - st.s.arrived
    if ids.shape[0] >= room:
        for k in range(room, ids.shape[0]):
            st.arrival[ids[k]] = np.nan
        while st.s.heap_len > 0:
            st.arrival[heap_pop(st)] = np.nan
        for r in range(st.s.cursor, cfg.n):
            st.arrival[r] = np.nan
        st.s.cursor = cfg.n
        st.s.inbox_shut = 1
        ids = ids[:room]
    st.s.arrived += ids.shape[0]
    return ids


@kernel
def pull_arrivals(cfg, st, t):
    """Every request arriving at or before ``t``: rejected if it can never run (each rejection
    ends its client's turn), else it starts waiting, in arrival order."""
    if next_arrival(cfg, st) > t:
        return
    ids = due_arrivals(cfg, st, t)
    m = ids.shape[0]
    if cfg.warmup_id >= 0:
        for i in range(m):
            if ids[i] == cfg.warmup_id:
                st.s.itl_from = st.arrival[cfg.warmup_id]
    ok = np.ones(m, dtype=np.bool_)
    for i in range(m):
        rid = ids[i]
        reason = reject_reason(cfg, st, rid)
        if reason != 0:
            ok[i] = False
            st.status[rid] = REJECTED
            st.reject[rid] = reason
            st.t_finish[rid] = st.arrival[rid]
    for i in range(m):
        if not ok[i]:
            request_ended(cfg, st, ids[i], t)
    for i in range(m):
        if ok[i]:
            start_waiting(st, ids[i])
            enqueue(cfg, st, ids[i])


@kernel(inline=True)
def inbox_append(st, rid):
    st.s.q_work += work_left(st, rid)
    st.in_next[rid] = -1
    if st.s.in_tail >= 0:
        st.in_next[st.s.in_tail] = rid
    else:
        st.s.in_head = rid
    st.s.in_tail = rid


@kernel
def route_in(cfg, st, rid):
    """The router sends ``rid`` here (its arrival is no earlier than any request sent before).
    A decode run planned before it was known is cut where :func:`plan_decode_run` cuts a run at
    a known arrival: after the first step ending at or after it (a multi-step burst is not cut,
    as it is not for a known arrival)."""
    inbox_append(st, rid)
    k = st.s.run_k
    if st.s.inflight == INFLIGHT_RUN and st.s.b_steps <= 1 and k > 1:
        t = st.arrival[rid]
        if st.ends[k - 1] >= t:
            k = bisect_left(st.ends[:k], t) + 1
            st.s.run_k = k
            st.s.t_end = st.ends[k - 1]


@kernel
def waiting_work_walk(cfg, st):
    """``work_left`` summed over the requests in the waiting queues and the routed inbox, by
    walking them: what ``st.s.q_work`` keeps as a running count."""
    w = queued_work_walk(st)
    if cfg.routed:
        r = st.s.in_head
        while r >= 0:
            w += work_left(st, r)
            r = st.in_next[r]
    return w


@kernel(inline=True)
def waiting_work(cfg, st):
    """The waiting queues' and the routed inbox's tokens still to compute: the running count.
    An engine whose scheduler parts are bound to Python callables (a user policy, kernel
    overrides: they may link and unlink queue entries directly, past the count) binds this to
    :func:`waiting_work_walk` instead (engine/driver.py)."""
    return st.s.q_work


@kernel
def outstanding_work(cfg, st, t):
    """Tokens still to compute for every request this replica holds at time ``t`` (running,
    waiting, fetching, routed here and not yet pulled): ``prompt + output - computed`` each --
    prefill and decode work left, a preempted request's recomputation included. Steps of a
    decode run under way that ended by ``t`` count as done (a request that finishes inside a
    multi-step burst counts only the tokens it still needed).

    The least-tokens router reads this for every replica touched since its last routing, cold
    (benchmarks/RESULTS.md, issue 30). The waiting queues and the inbox -- most of what a loaded
    replica holds -- are read from their running count (``st.s.q_work``, kept where a request
    enters or leaves them, sched/queues.py), not walked: only the running set and the requests
    fetching KV from a lower tier (few, and none without tiers) are read one by one. Under
    ``sim.check_invariants`` the engine holds the count to the walk after every schedule."""
    w = waiting_work(cfg, st)
    for i in range(st.s.run_len):
        w += work_left(st, st.run[i])
    for i in range(st.s.n_fetching):
        w += work_left(st, st.fetching[i])
    if st.s.inflight == INFLIGHT_RUN:
        done = np.int64(bisect_right(st.ends[:st.s.run_k], t))
        for i in range(st.s.b_len):  # (a multi-step burst's finished requests compute no more work)
            r = st.b_ids[i]
            rem = np.int64(st.output[r]) - np.int64(st.num_output[r])
            w -= done if done < rem else rem
    return w


@kernel
def route_in_after_plans(cfg, st, rid):
    """:func:`route_in` of a request sent at ``t`` after every replica with a boundary at ``t``
    planned there (engine/cluster.py: a closed loop's next request after one rejected as a replica
    planned at ``t``, as a lone replica pulls it only at its next boundary). A replica that single
    stepping has at a boundary at ``t`` planned a step past it without this request, so a decode
    run under way is cut after its first step ending *after* ``t``, where that step ends."""
    inbox_append(st, rid)
    k = st.s.run_k
    if st.s.inflight == INFLIGHT_RUN and st.s.b_steps <= 1 and k > 1:
        j = bisect_right(st.ends[:k], st.arrival[rid])
        if j + 1 < k:
            st.s.run_k = j + 1
            st.s.t_end = st.ends[j]
