"""The prefix cache's free-block queues, eviction order and hot-prefix preload, as kernels.

Free queues
-----------
vLLM keeps every free block (never used, or cached with ref count 0) in one doubly linked list:
new blocks are taken from the head, freed blocks are appended at the tail, and a cache hit on a
free block unlinks it from the middle. The head is therefore the least recently freed block, and
taking it evicts whatever prefix it still caches: LRU eviction falls out of the allocation order.
Here each queue ``q`` is such a list over block ids (kv/dlist.py: ``qnext``, ``qprev``, ``qends[:, q]``;
``qid[b]`` the queue block ``b`` is in, -1 while in use). ``ps.free`` counts every
queued block: what an allocation can take.

Eviction policies (which queue a freed block joins, in what order queues are drained)
-------------------------------------------------------------------------------------
``lru`` (vLLM ``BlockPool``, v0.8 ``vllm/v1/core/block_pool.py``): one queue for every free
block, plain or cached, in the order they were freed. A request's blocks are freed tail first, so
a sequence's last blocks are evicted before its first ones (a shared system prompt survives
longest). Plain blocks are *not* preferred over cached ones. A hot-prefix queue, drained last,
is used only with preload.

``sglang`` (SGLang's radix cache, kv/radix.py): plain blocks first, then whole leaf segments
of the prefix tree, least recently accessed first; its own take (``rx_take``), not the plan below.

``priority`` (Halo): plain blocks first (as SGLang, which evicts from its radix tree only when
the free pool is short), then cached blocks by SLA class from P4 up to P0 (a block's class is the
most urgent class that used it), LRU within a class. ``protect[c]`` blocks of class ``c`` are
protected: taken only after every unprotected cached block. Hot prefixes are drained last::

    drain order:  plain | P4 P3 P2 P1 P0 beyond quota | P4 .. P0 within quota | hot

Hot-prefix preload
------------------
A block hash is *hot* while at least ``hot_min`` requests looked it up within the last
``hot_window`` seconds (each request counts once, on its first lookup; the window slides with the
lookups' clock, so the result does not depend on how often the scheduler runs). A hot block that
becomes free joins the hot queue (up to ``hot_max`` blocks), and a hot hash that is only in a
lower tier (the ``hm_*`` ordered set, oldest first) is fetched back into free L1 blocks as soon as
a lookup finds room, before the next request asks (Halo's hot-prefix preload; SGLang's radix
cache gets the same effect by never evicting referenced tree nodes).
"""

from __future__ import annotations

import numpy as np

from servesim.jit import kernel
from servesim.kv.dlist import dl_append, dl_unlink
from servesim.kv.ptiers import tier_demote, tier_of, tiers_fetch
from servesim.request import NUM_CLASSES

LRU, PRIORITY, SGLANG = 0, 1, 2
EVICTIONS = {"lru": LRU, "priority": PRIORITY, "sglang": SGLANG}
MAIN = 0  # lru: the one queue; priority, sglang: plain blocks
CACHED = 1  # sglang: cached blocks with ref count 0, least recently accessed first (kv/radix.py)
NC = NUM_CLASSES


@kernel(inline=True)
def hot_queue(kv):
    return 1 if kv.evict == LRU else (2 if kv.evict == SGLANG else 1 + NC)


@kernel(inline=True)
def _queue(evict, bhash, bclass, b, hot, hq):
    """The queue a freed block ``b`` joins (the pool's fields as arguments: loops read them once)."""
    if hot:
        return hq
    if evict == LRU or bhash[b] < 0:
        return MAIN
    if evict == SGLANG:
        return CACHED
    return 1 + bclass[b]


@kernel(inline=True)
def queue_of(kv, b, hot):
    """The queue a freed block ``b`` joins."""
    return _queue(kv.evict, kv.bhash, kv.bclass, b, hot, hot_queue(kv))


@kernel(inline=True)
def _push(qnext, qprev, qends, qid, qsize, b, q):
    """Append block ``b`` at the tail of queue ``q`` (the free count is the caller's). Loops over
    many blocks call this with the pool's arrays read once: a kernel call per block, reading the
    arrays from the pool each time, cost prefix caching a third of a run's speed."""
    qid[b] = q
    dl_append(qnext, qprev, qends, q, b)
    qsize[q] += 1


@kernel(inline=True)
def _unlink(qnext, qprev, qends, qid, qsize, b):
    """Take free block ``b`` out of its queue (the free count is the caller's)."""
    q = qid[b]
    dl_unlink(qnext, qprev, qends, q, b)
    qid[b] = -1
    qsize[q] -= 1


@kernel
def q_push(kv, b, q):
    """Append block ``b`` at the tail of queue ``q``."""
    _push(kv.qnext, kv.qprev, kv.qends, kv.qid, kv.qsize, b, q)
    kv.s[0].free += 1


@kernel
def q_unlink(kv, b):
    """Take free block ``b`` out of its queue (a cache hit on it, or a move)."""
    _unlink(kv.qnext, kv.qprev, kv.qends, kv.qid, kv.qsize, b)
    kv.s[0].free -= 1


PLAN_STEPS = 2 + 2 * NC  # the most (queue, count) steps of a take: see take_plan


@kernel
def take_plan(kv, n, allow_hot, plan):
    """How many blocks each step of a take of ``n`` blocks gives (``plan[step]``, from the queue
    :func:`plan_queue` names), in the policy's drain order (module docstring); ``allow_hot``
    False leaves the hot queue out (preload). Returns the number of steps."""
    a = min(n, kv.qsize[MAIN])
    plan[0] = a
    n -= a
    if kv.evict == LRU:
        plan[1] = n if allow_hot else 0
        return 2
    for s in range(1, NC + 1):  # beyond quota, least urgent class first
        c = NC - s
        a = min(n, max(0, kv.qsize[1 + c] - kv.protect[c]))
        plan[s] = a
        n -= a
    for s in range(1, NC + 1):  # within quota
        c = NC - s
        a = min(n, kv.qsize[1 + c] - plan[s])
        plan[NC + s] = a
        n -= a
    plan[2 * NC + 1] = n if allow_hot else 0
    return 2 * NC + 2


@kernel(inline=True)
def plan_queue(kv, step):
    """The queue step ``step`` of :func:`take_plan` drains."""
    if kv.evict == LRU or step == 0:
        return step
    if step <= NC:
        return 1 + NC - step
    if step <= 2 * NC:
        return 1 + 2 * NC - step
    return 1 + NC


@kernel
def take(kv, n, allow_hot, out):
    """``n`` blocks from the free queues in the policy's order into ``out[:n]`` (fewer when the
    hot queue is left out and the rest cannot give ``n``; the count is returned); cached ones are
    evicted, in the order taken."""
    plan = np.empty(PLAN_STEPS, dtype=np.int64)
    steps = take_plan(kv, n, allow_hot, plan)
    got = 0
    qnext, qprev, qends, qid, qsize = kv.qnext, kv.qprev, kv.qends, kv.qid, kv.qsize
    for step in range(steps):
        q = plan_queue(kv, step)
        for _ in range(plan[step]):
            b = qends[0, q]
            _unlink(qnext, qprev, qends, qid, qsize, b)
            out[got] = b
            got += 1
    kv.s[0].free -= got
    evict_blocks(kv, out, got)
    return got


@kernel
def evict_blocks(kv, out, got):
    """The cached blocks among ``out[:got]`` (just taken, in that order) forget their prefixes:
    out of the cache map, into the lower tiers, onto the list of hot hashes missing from L1 if
    hot. Each of those three structures sees the blocks in the order taken, so doing each for
    the whole batch in turn is evicting the blocks one at a time; the pool's arrays are read once
    (reading them per block was most of the Mooncake example's time, in reference counts)."""
    bhash, cache_blk, bclass, ready, evlog, uniq = kv.bhash, kv.cache_blk, kv.bclass, kv.ready, kv.evlog, kv.uniq
    m = 0
    for i in range(got):
        if bhash[out[i]] >= 0:
            m += 1
    if m == 0:  # (plain blocks only: no array to allocate)
        return
    hs = np.empty(m, dtype=np.int64)
    m = 0
    for i in range(got):
        b = out[i]
        h = bhash[b]
        if h < 0:
            continue
        cache_blk[h] = -1
        bhash[b] = -1
        bclass[b] = NC - 1
        ready[b] = 0.0
        hs[m] = h
        m += 1
    ps = kv.ps[0]
    ps.evictions += m
    n = ps.evlog_n
    for i in range(min(m, evlog.shape[0] - n)):
        evlog[n + i] = uniq[hs[i]]
    ps.evlog_n = min(n + m, evlog.shape[0])
    if kv.hot_min > 0:
        for i in range(m):
            if is_hot(kv, hs[i]):
                hm_add(kv, hs[i])
    if kv.t_cap.shape[0]:
        tier_demote(kv, hs, m)


# ------------------------------------------------------------------ hot hashes missing from L1
@kernel
def hm_add(kv, h):
    """Add ``h`` to the ordered set of hot hashes missing from L1 (kept in place if present)."""
    if kv.hm_in[h]:
        return
    kv.hm_in[h] = True
    dl_append(kv.hm_next, kv.hm_prev, kv.hm_ends, 0, h)
    kv.ps[0].hm_size += 1


@kernel
def hm_remove(kv, h):
    if not kv.hm_in[h]:
        return
    kv.hm_in[h] = False
    dl_unlink(kv.hm_next, kv.hm_prev, kv.hm_ends, 0, h)
    kv.ps[0].hm_size -= 1


# ------------------------------------------------------------------------------ preload
@kernel(inline=True)
def _hot(hot_min, counts, h):
    return hot_min > 0 and counts[h] >= hot_min


@kernel(inline=True)
def is_hot(kv, h):
    return _hot(kv.hot_min, kv.counts, h)


@kernel
def release(kv, rel, nrel):
    """Freed blocks ``rel[:nrel]`` (ref count 0, in release order) join their queues: hashed hot
    ones the hot queue while it has room (``hot_max``), the rest by the policy."""
    qnext, qprev, qends, qid, qsize, bhash = kv.qnext, kv.qprev, kv.qends, kv.qid, kv.qsize, kv.bhash
    bclass, counts = kv.bclass, kv.counts
    room = kv.hot_max - qsize[hot_queue(kv)] if kv.hot_min > 0 else 0
    for i in range(nrel):
        b = rel[i]
        hot = False
        if room > 0 and bhash[b] >= 0 and _hot(kv.hot_min, counts, bhash[b]):
            hot = True
            room -= 1
        _push(qnext, qprev, qends, qid, qsize, b, _queue(kv.evict, bhash, bclass, b, hot, hot_queue(kv)))
    kv.s[0].free += nrel


@kernel
def observe(kv, rid, m, now):
    """Request ``rid``'s first lookup, of the first ``m`` hashes of its chain, at ``now``: slide
    the window, move blocks in or out of the hot queue, preload hot blocks only lower tiers
    hold."""
    ps = kv.ps[0]
    mh = kv.hot_min
    horizon = now - kv.hot_window
    cooled = [np.int64(0)]
    cooled.pop()
    while ps.ev_head < ps.ev_tail and kv.ev_t[ps.ev_head] < horizon:
        e = ps.ev_head
        ps.ev_head = e + 1
        a = kv.off[kv.ev_rid[e]]
        for j in range(a, a + kv.ev_len[e]):
            h = kv.chain[j]
            kv.counts[h] -= 1
            if kv.counts[h] == mh - 1:
                cooled.append(np.int64(h))
    a = kv.off[rid]
    heated = [np.int64(0)]
    heated.pop()
    for j in range(a, a + m):
        h = kv.chain[j]
        kv.counts[h] += 1
        if kv.counts[h] == mh:
            heated.append(np.int64(h))
    if m:
        e = ps.ev_tail
        kv.ev_t[e] = now
        kv.ev_rid[e] = rid
        kv.ev_len[e] = m
        ps.ev_tail = e + 1
    hq = hot_queue(kv)
    for h in cooled:
        back = False
        for g in heated:
            if g == h:
                back = True
                break
        if back:
            continue
        hm_remove(kv, h)
        b = kv.cache_blk[h]
        if b >= 0 and kv.qid[b] == hq:
            q_unlink(kv, b)
            q_push(kv, b, queue_of(kv, b, False))
    for h in heated:
        b = kv.cache_blk[h]
        if b < 0:
            hm_add(kv, h)
        elif kv.qid[b] >= 0 and kv.qid[b] != hq:
            if kv.hot_max - kv.qsize[hq] > 0 and kv.bhash[b] >= 0 and is_hot(kv, h):
                q_unlink(kv, b)
                q_push(kv, b, hq)
    if kv.t_cap.shape[0] and ps.hm_size:
        preload(kv, now)


@kernel
def preload(kv, now):
    """Fetch hot blocks that only lower tiers hold into free L1 blocks (never evicting hot ones),
    oldest first, up to the hot quota."""
    ps = kv.ps[0]
    hq = hot_queue(kv)
    room = min(kv.s[0].free - kv.qsize[hq], kv.hot_max - kv.qsize[hq])
    if room <= 0:
        return
    hs = np.empty(room, dtype=np.int64)
    where = np.empty(room, dtype=np.int64)
    m = 0
    h = kv.hm_ends[0, 0]
    while h >= 0 and m < room:
        nx = kv.hm_next[h]
        w = tier_of(kv.t_in, h)
        if w >= 0:
            hs[m] = h
            where[m] = w
            m += 1
        h = nx
    if m == 0:
        return
    for j in range(m):
        hm_remove(kv, hs[j])
    ready_at = tiers_fetch(kv, hs, where, m, now, -1)
    blocks = np.empty(m, dtype=np.int64)
    got = take(kv, m, False, blocks)
    for j in range(got):
        b = blocks[j]
        kv.cache_blk[hs[j]] = b
        kv.bhash[b] = hs[j]
        kv.bclass[b] = NC - 1  # no request has used it yet (not the class of its last holder)
        kv.ready[b] = ready_at
        q_push(kv, b, hq)
