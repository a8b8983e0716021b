"""Waiting queues and the queue disciplines (FIFO, SLA classes with aging).

Queues are intrusive singly linked lists over request ids (``q_next``): 4 bytes per request for
every queue together, O(1) push at either end and pop at the front. Six queues: one per SLA class
(the FIFO discipline uses queue 0 for everyone) and ``MEMBERS``, the static batch being formed.

The four primitives below are the only way the engine's own code links or unlinks a request, and
each keeps ``st.s.q_work`` (the queued requests' tokens still to compute, sched/state.py): a
request adds its ``work_left`` as it is linked and takes it back as it is unlinked, so a move
between queues nets to nothing. A request's ``computed`` may change while it waits (a prefix-cache
lookup at admission; blocks released from idle holders): sched/policies.py and sched/parts.py
adjust the count there. The fleet's least-tokens router reads the count instead of walking every
queue (engine/inbox.py ``outstanding_work``).

The discipline answers "who is next?" (:func:`head`):

``FIFO``
    the oldest request (preempted and returning requests are put back at the front).
``CLASSES`` (Halo, vLLM ``--scheduling-policy priority``)
    the first request of the most urgent non-empty class; with aging (``aging_s: T``) a waiting
    request ranks one class higher for every ``T`` seconds since its arrival, ties broken by
    arrival then id, so no class starves.
"""

from __future__ import annotations

import math

import numpy as np

from servesim.jit import kernel
from servesim.sched.state import B_STATIC, MEMBERS, NUM_QUEUES, Q_CLASSES, work_left

QUEUED = NUM_QUEUES - 1  # queues 0..QUEUED-1 hold waiting requests; MEMBERS the static batch


@kernel(inline=True)
def q_push_back(st, q, rid):
    st.s.q_work += work_left(st, rid)
    st.q_next[rid] = -1
    if st.q_len[q] == 0:
        st.q_head[q] = rid
    else:
        st.q_next[st.q_tail[q]] = rid
    st.q_tail[q] = rid
    st.q_len[q] += 1


@kernel(inline=True)
def q_push_front(st, q, rid):
    st.s.q_work += work_left(st, rid)
    if st.q_len[q] == 0:
        st.q_next[rid] = -1
        st.q_tail[q] = rid
    else:
        st.q_next[rid] = st.q_head[q]
    st.q_head[q] = rid
    st.q_len[q] += 1


@kernel(inline=True)
def q_pop_front(st, q):
    rid = st.q_head[q]
    st.s.q_work -= work_left(st, rid)
    st.q_head[q] = st.q_next[rid]
    st.q_len[q] -= 1
    if st.q_len[q] == 0:
        st.q_tail[q] = -1
    st.q_next[rid] = -1
    return rid


@kernel
def q_take(st, q, rid):
    """Remove ``rid`` from queue ``q``: O(1) at the head (every built-in discipline takes the
    head), O(position) elsewhere (a user's discipline may pick any waiting request)."""
    if st.q_head[q] == rid:
        q_pop_front(st, q)
        return
    st.s.q_work -= work_left(st, rid)
    prev = st.q_head[q]
    while st.q_next[prev] != rid:
        prev = st.q_next[prev]
    st.q_next[prev] = st.q_next[rid]
    if st.q_tail[q] == rid:
        st.q_tail[q] = prev
    st.q_len[q] -= 1
    st.q_next[rid] = -1


@kernel(inline=True)
def queue_of(cfg, st, rid):
    return np.int64(st.klass[rid]) if cfg.queue == Q_CLASSES else np.int64(0)


@kernel(inline=True)
def n_queued(st):
    """Requests in the waiting queues (not the static batch's members, not fetching)."""
    total = 0
    for q in range(QUEUED):
        total += st.q_len[q]
    return total


@kernel(inline=True)
def num_waiting(st):
    """Everyone waiting, as the recorder and the causes count them."""
    return n_queued(st) + st.q_len[MEMBERS] + st.s.n_fetching


@kernel(inline=True)
def enqueue(cfg, st, rid):
    """A request arrived: it waits at the back of its queue."""
    q_push_back(st, queue_of(cfg, st, rid), rid)


@kernel(inline=True)
def requeue(cfg, st, rid):
    """A preempted request (or one whose KV landed from a lower tier) goes back to its queue.
    FIFO: at the front, as vLLM's FCFS puts preempted requests back (``waiting.extendleft``,
    vllm/core/scheduler.py v0.6.x; V1 ``prepend_request``). SLA classes: in arrival order within
    its class, as vLLM's priority queue keeps every waiting request (a heap by (priority,
    arrival_time), vllm/v1/core/sched/request_queue.py PriorityRequestQueue) -- the front would put
    a request preempted later ahead of an older one preempted before it, and with aging the heads
    compared across classes would then not be the oldest (a priority inversion the checker's
    priority_order invariant found). A static batch takes its member back first."""
    if cfg.batch_rule == B_STATIC:
        q_push_front(st, MEMBERS, rid)
    elif cfg.queue == Q_CLASSES:
        q_insert_by_arrival(st, queue_of(cfg, st, rid), rid)
    else:
        q_push_front(st, queue_of(cfg, st, rid), rid)


@kernel(inline=True)
def _ahead(st, a, b):
    """``a`` waits ahead of ``b`` in a class queue: earlier arrival, then lower id."""
    return st.arrival[a] < st.arrival[b] or (st.arrival[a] == st.arrival[b] and a < b)


@kernel
def q_insert_by_arrival(st, q, rid):
    """Insert ``rid`` into queue ``q`` before the first request it waits ahead of: O(its place),
    a few steps for a preempted request, which is older than nearly everyone waiting."""
    if st.q_len[q] == 0 or _ahead(st, rid, st.q_head[q]):
        q_push_front(st, q, rid)
        return
    prev = st.q_head[q]
    nxt = st.q_next[prev]
    while nxt >= 0 and not _ahead(st, rid, nxt):
        prev = nxt
        nxt = st.q_next[nxt]
    st.s.q_work += work_left(st, rid)
    st.q_next[rid] = nxt
    st.q_next[prev] = rid
    if nxt < 0:
        st.q_tail[q] = rid
    st.q_len[q] += 1


@kernel(inline=True)
def eff_class(cfg, st, rid, now):
    """The class a waiting request ranks as: its own, minus one per ``aging_s`` waited."""
    g = np.int64(st.klass[rid])
    if cfg.aging_s <= 0.0 or g == 0:
        return g
    e = g - np.int64((now - st.arrival[rid]) // cfg.aging_s)
    return e if e > 0 else np.int64(0)


@kernel
def head(cfg, st, now):
    """``(rid, queue, effective class)`` of the next waiting request; rid -1 if none."""
    if cfg.queue != Q_CLASSES:
        if st.q_len[0] == 0:
            return np.int64(-1), np.int64(0), np.int64(0)
        rid = st.q_head[0]
        return rid, np.int64(0), np.int64(st.klass[rid])
    best, best_q, best_e = np.int64(-1), np.int64(0), np.int64(0)
    best_a = 0.0
    for q in range(QUEUED):
        if st.q_len[q] == 0:
            continue
        rid = st.q_head[q]
        e = eff_class(cfg, st, rid, now)
        if cfg.aging_s <= 0.0:
            return rid, np.int64(q), e
        a = st.arrival[rid]
        if best < 0 or e < best_e or (e == best_e and (a < best_a or (a == best_a and rid < best))):
            best, best_q, best_e, best_a = rid, np.int64(q), e, a
    return best, best_q, best_e


@kernel
def aging_horizon(cfg, st, now):
    """The next time a queue head's effective class drops (the order may change then): the
    exact first float time after ``now`` at which :func:`eff_class` gives less, so the engine
    re-decides at the first boundary that sees the new order -- never earlier, where an idle
    engine would wake to the same order and wait for the same instant again, and never later."""
    t = np.inf
    for q in range(QUEUED):
        if st.q_len[q] == 0:
            continue
        rid = st.q_head[q]
        if eff_class(cfg, st, rid, now) > 0:
            tq = class_drop_after(st.arrival[rid], cfg.aging_s, now)
            if tq < t:
                t = tq
    return t


@kernel(inline=True)
def class_drop_after(a, aging_s, now):
    """The first float ``t > now`` with ``(t - a) // aging_s`` above its value at ``now``: the
    arithmetic boundary ``a + (k + 1) * aging_s``, moved by the few ulps its rounding is off."""
    k = (now - a) // aging_s
    t = a + (k + 1.0) * aging_s
    if t <= now:
        t = math.nextafter(now, math.inf)
    while (t - a) // aging_s <= k:  # rounded below the boundary: not dropped yet
        t = math.nextafter(t, math.inf)
    while True:  # rounded above it: it drops a little earlier
        p = math.nextafter(t, -math.inf)
        if p <= now or (p - a) // aging_s <= k:
            return t
        t = p


@kernel
def waiting_ids(cfg, st, out):
    """Every queued request in the policy's order (class queues in class order), into ``out``;
    returns the count."""
    m = 0
    for q in range(QUEUED):
        rid = st.q_head[q]
        while rid >= 0 and m < out.shape[0]:
            out[m] = rid
            m += 1
            rid = st.q_next[rid]
    return m


@kernel
def queued_work_walk(st):
    """``work_left`` summed over every queued request (MEMBERS included), by walking the queues:
    what ``st.s.q_work`` keeps as a running count (sim.check_invariants holds the two equal)."""
    w = np.int64(0)
    for q in range(st.q_head.shape[0]):
        r = st.q_head[q]
        while r >= 0:
            w += work_left(st, r)
            r = np.int64(st.q_next[r])
    return w
