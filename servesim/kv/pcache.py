"""Paged KV with automatic prefix caching (vLLM's ``enable_prefix_caching``), as kernels.

The pool is the paged allocator's state (kv/kernels.py ``KVState``, ``prefix`` 1) with block ids,
because *which* block is evicted matters. Every block is in exactly one state::

    free (plain)    in a free queue (kv/pqueue.py), holds nothing reusable   bhash -1
    in use          ref count >= 1: in the block table of one or more requests
    cached-free     ref count 0, holds the KV of a prefix block (bhash >= 0, and the cache map
                    ``cache_blk[bhash]`` names it), in a free queue: reusable until taken

Hashes are dense ids (kv/pstate.py interns a workload's chain hashes once): the cache map is an
array over hash ids, not a dict, and nothing depends on Python's ``hash()``.

A request's prompt carries a chain of block hashes: equal hash at position j means equal tokens
0..end of block j. A lookup (:func:`px_lookup`) walks the chain through the cache map until the
first miss; the matched blocks are the request's first blocks and its prefill starts after them.
At most ``(known tokens - 1) // block_size`` blocks are matched: at least one token is always
computed, so there are logits to sample from (vLLM's ``num_tokens - 1`` rule).

Block tables without a table: a request's blocks are its *hit* blocks (``nhit[rid]`` chain
positions, each ``cache_blk[chain[j]]`` -- a hit block cannot leave the cache map while held)
followed by the blocks it took itself, in order, as a linked list over block ids (kv/dlist.py:
``onext``, ``oends[:, rid]``; a block is taken by one request at a time). Memory is O(blocks + requests + hashes).

Life of a block (vLLM v1 ``BlockPool`` / ``KVCacheManager``, v0.8)::

    free ──take── in use (ref 1) ──request frees──► ref 0: cached-free (has hash) or free (none)
                   ▲  └─hit by another request: ref 2 ...   │   appended at the queue tail,
                   └──────────── hit (touch) ──────────────┘   last block of the request first
    cached-free ──reaches the head when a block is needed──► evicted: hash forgotten (-> L2)

* Hashes are registered when their block's tokens are scheduled (as vLLM v1's ``cache_blocks``)
  or, for blocks filled by decode steps, when the request frees them (the decode path stays
  vectorized). One block per hash: a second block computed with the same hash (two requests
  prefilling the same prefix at once) is not registered and is freed as plain.
* Hits are taken in two steps. A lookup finds them and sets ``computed[rid]`` but takes no
  reference (the blocks wait in ``pend_blk``); :func:`px_allocate` right after takes the
  references and the new blocks together, and fails without side effects if the pool cannot
  provide both (ref-0 hit blocks count against the free blocks, as in vLLM). A hit evicted in
  between is cut back to what is still cached; ``stale_hits`` counts it.
* With lower tiers (kv/ptiers.py), a lookup that continues below L1 starts the fetch at once, if
  the pool can hold the request's whole prefill: the request takes its L1 blocks, blocks for the
  fetched part and for the rest of its prefill immediately and holds them while it waits (vLLM
  allocates a request's slots when it starts an async KV load), so a landed request never waits
  for blocks; the lookup's ready time is the fetch completion. The fetched blocks are registered
  at once with that ready time, so a second request hitting them waits for the same transfer.
* Decode steps take blocks through the same queues in bulk (:func:`px_grow` orders a run's new
  blocks by step, then batch order: exactly what stepwise allocation takes).

Counters (per SLA class): ``cnt`` rows = tokens looked up, tokens hit, blocks looked up, blocks
hit (counted when a hit is taken); ``tier_hits[tier]`` blocks hit per tier (0 = L1); seconds
waited for tier fetches (``fwait``, ``fwaits``); evictions.
"""

from __future__ import annotations

import numpy as np

from servesim.jit import bisect_right, kernel
from servesim.kv.dlist import dl_append
from servesim.kv.pqueue import (MAIN, PLAN_STEPS, PRIORITY, SGLANG, _unlink, hm_remove, observe, plan_queue, release,
                                take_plan)
from servesim.kv.radix import rx_access, rx_link, rx_released, rx_take, take_blocks
from servesim.kv.ptiers import tier_of, tiers_fetch
from servesim.kv.runs import blocks_for, run_demand_into, slots_per_step

# ------------------------------------------------------------------------ holders, tables
@kernel(inline=True)
def _hold_add(kv, rid):
    n = kv.ps[0].n_hold
    kv.h_arr[n] = rid
    kv.h_pos[rid] = n
    kv.ps[0].n_hold = n + 1


@kernel(inline=True)
def _hold_remove(kv, rid):
    i = kv.h_pos[rid]
    n = kv.ps[0].n_hold - 1
    last = kv.h_arr[n]
    kv.h_arr[i] = last
    kv.h_pos[last] = i
    kv.h_pos[rid] = -1
    kv.ps[0].n_hold = n


@kernel(inline=True)
def _own_append(onext, oprev, oends, ref, rid, b):
    """Block ``b`` (just taken, ref 1) becomes the next position of ``rid``'s table (the pool's
    arrays read once by the caller's loop)."""
    ref[b] = 1
    dl_append(onext, oprev, oends, rid, b)


@kernel(inline=True)
def _hit_block(kv, rid, j):
    return kv.cache_blk[kv.chain[kv.off[rid] + j]]


@kernel
def px_table(kv, rid, out):
    """``rid``'s block table into ``out[:held]`` (tests, checks); returns its length."""
    n = 0
    for j in range(kv.nhit[rid]):
        out[n] = _hit_block(kv, rid, j)
        n += 1
    b = kv.oends[0, rid]
    while b >= 0:
        out[n] = b
        n += 1
        b = kv.onext[b]
    return n


@kernel
def _new_row(kv, rid, nhit, new, nnew):
    """``rid`` starts holding: its ``nhit`` hit blocks (referenced already), then ``new[:nnew]``."""
    kv.nhit[rid] = nhit
    kv.oends[0, rid] = -1
    kv.oends[1, rid] = -1
    onext, oprev, oends, ref = kv.onext, kv.oprev, kv.oends, kv.ref
    for i in range(nnew):
        _own_append(onext, oprev, oends, ref, rid, new[i])
    kv.held[rid] = nhit + nnew
    kv.reg[rid] = nhit
    _hold_add(kv, rid)


@kernel
def _register(kv, rid, upto):
    """Enter ``rid``'s full blocks at table positions ``reg[rid] .. upto`` into the cache map."""
    a = kv.reg[rid]
    o = kv.off[rid]
    n_chain = kv.off[rid + 1] - o
    if upto > n_chain:
        upto = n_chain
    if upto > kv.held[rid]:
        upto = kv.held[rid]
    if upto <= a:
        return
    kv.reg[rid] = upto
    onext, chain, cache_blk, bhash, bclass = kv.onext, kv.chain, kv.cache_blk, kv.bhash, kv.bclass
    g = kv.klass[rid]
    hot_missing = kv.ps[0].hm_size > 0  # (only hm_remove changes it here, never from 0)
    sg = kv.evict == SGLANG
    hpar, nchild, send = kv.hpar, kv.nchild, kv.send
    b = kv.oends[0, rid]
    for _ in range(a - kv.nhit[rid]):
        b = onext[b]
    fresh = True  # (sglang: the parent was not entered by this call)
    for j in range(a, upto):
        h = chain[o + j]
        if cache_blk[h] < 0 and bhash[b] < 0:
            cache_blk[h] = b
            bhash[b] = h
            bclass[b] = g
            if hot_missing:
                hm_remove(kv, h)
            if sg:
                rx_link(hpar, nchild, cache_blk, send, h, fresh)
            fresh = False
        else:
            fresh = True
        b = onext[b]


@kernel(inline=True)
def _touch(kv, rid, m):
    """Take a reference on ``rid``'s ``m`` pending hit blocks (a ref-0 block leaves its queue)."""
    a = kv.off[rid]
    pend_blk, ref = kv.pend_blk, kv.ref
    qnext, qprev, qends, qid, qsize = kv.qnext, kv.qprev, kv.qends, kv.qid, kv.qsize
    idle = 0
    for j in range(m):
        b = pend_blk[a + j]
        if ref[b] == 0:
            _unlink(qnext, qprev, qends, qid, qsize, b)
            idle += 1
        ref[b] += 1
    kv.s[0].free -= idle


@kernel(inline=True)
def _chain_len(kv, rid):
    """Hashes a lookup of ``rid`` may match: full blocks of its known tokens but the last."""
    known = np.int64(kv.prompt[rid]) + kv.num_output[rid]
    full = (known - 1) // kv.block_size
    n = kv.off[rid + 1] - kv.off[rid]
    return n if n < full else (full if full > 0 else 0)


@kernel
def _claim(kv, rid, l1_blocks, where, w):
    """Count a taken hit: looked-up and hit tokens and blocks, blocks hit per tier."""
    g = kv.klass[rid]
    known = np.int64(kv.prompt[rid]) + kv.num_output[rid]
    hit = np.int64(kv.computed[rid])
    kv.cnt[0, g] += known
    kv.cnt[1, g] += hit
    kv.cnt[2, g] += _chain_len(kv, rid)
    kv.cnt[3, g] += hit // kv.block_size
    kv.tier_hits[0, g] += l1_blocks
    for j in range(w):
        kv.tier_hits[1 + where[j], g] += 1
    kv.hit_of[rid] = hit


# ---------------------------------------------------------------------------------- lookup
@kernel
def px_lookup(kv, computed, rid, now):
    """Longest cached prefix of full blocks (module docstring): ``(tokens, ready time)``; sets
    ``computed[rid]``. A request already holding blocks (a fetch in flight, or landed) answers
    its holding; one with KV of its own (swap-in) answers that."""
    if kv.h_pos[rid] >= 0:
        return np.int64(computed[rid]), kv.load_ready[rid]
    if computed[rid] > 0 and kv.pend[rid] < 0:
        return np.int64(computed[rid]), now
    ps = kv.ps[0]
    a = kv.off[rid]
    n = _chain_len(kv, rid)
    if now != ps.watch_t:
        ps.watch_t = now
        ps.watch_gen += 1
        ps.watch_any = 0
    chain, watch, cache_blk, pend_blk, ref = kv.chain, kv.watch, kv.cache_blk, kv.pend_blk, kv.ref
    gen = ps.watch_gen
    for j in range(a, a + n):
        watch[chain[j]] = gen
    if n:
        ps.watch_any = 1
    if kv.hot_min > 0 and not kv.seen[rid]:
        kv.seen[rid] = True
        observe(kv, rid, n, now)
    m = 0
    while m < n and cache_blk[chain[a + m]] >= 0:
        pend_blk[a + m] = cache_blk[chain[a + m]]
        m += 1
    if kv.evict == SGLANG:
        rx_access(kv, a, m)
    bs = kv.block_size
    if kv.t_cap.shape[0] and m < n:
        # as vLLM with an async KV load: the whole prefill's blocks are taken when the fetch
        # starts, so a landed request never waits for blocks (nothing can deadlock on them); the
        # lower tiers are searched only when the pool could hold them (a blocked queue head is
        # looked up at every pass)
        known = np.int64(kv.prompt[rid]) + kv.num_output[rid]
        total = blocks_for(known, bs)
        need = total - m
        for j in range(m):
            if ref[pend_blk[a + j]] == 0:
                need += 1
        if need <= kv.s[0].free:
            where = np.empty(n - m, dtype=np.int64)
            w = 0
            t_in = kv.t_in
            for j in range(a + m, a + n):
                h = chain[j]
                if cache_blk[h] >= 0:
                    break
                t = tier_of(t_in, h)
                if t < 0:
                    break
                where[w] = t
                w += 1
            if w:
                return _fetch(kv, computed, rid, m, where, w, now, total)
    kv.pend[rid] = -1
    computed[rid] = m * bs
    if m == 0:
        return np.int64(0), 0.0
    kv.pend[rid] = m
    ready = kv.ready
    r = ready[pend_blk[a]]
    for j in range(1, m):
        if ready[pend_blk[a + j]] > r:
            r = ready[pend_blk[a + j]]
    return np.int64(m * bs), r


@kernel
def _fetch(kv, computed, rid, m, where, w, now, total):
    """Take the L1 hit (``m`` blocks), blocks for the ``w`` hashes fetched from lower tiers and
    for the rest of the prefill (``total`` blocks in all); start the fetch."""
    kv.pend[rid] = -1
    g = kv.klass[rid]
    a = kv.off[rid]
    _touch(kv, rid, m)
    # start the fetch before taking L1 blocks: their eviction may push the source copies out of
    # a small lower tier (the transfer has its data by then)
    ready_at = tiers_fetch(kv, kv.chain[a + m:a + m + w], where, w, now, g)
    new = np.empty(total - m, dtype=np.int64)
    take_blocks(kv, total - m, new)
    _new_row(kv, rid, m, new, total - m)
    _register(kv, rid, m + w)
    ready, pend_blk = kv.ready, kv.pend_blk
    for j in range(w):
        ready[new[j]] = ready_at
    r1 = 0.0
    for j in range(m):
        if ready[pend_blk[a + j]] > r1:
            r1 = ready[pend_blk[a + j]]
    if r1 > ready_at:
        ready_at = r1
    kv.load_ready[rid] = ready_at
    computed[rid] = (m + w) * kv.block_size
    _claim(kv, rid, m, where, w)
    wait = ready_at - now
    kv.fwait[g] += wait if wait > 0.0 else 0.0
    kv.fwaits[g] += 1
    return np.int64(computed[rid]), ready_at


# ------------------------------------------------------------------------------ allocation
@kernel
def px_grow(kv, computed, ids, nb, plus, keyed):
    """Give each of ``ids[:nb]`` blocks for ``computed + plus`` tokens, all or nothing. New blocks
    go out in ids order, or (``keyed``: a decode run's blocks, taken after it) in the order
    stepwise allocation takes them: block ``slot`` of a request now at ``c`` tokens was first
    needed ``slot * bs - c`` steps from now, ties in batch order."""
    bs = kv.block_size
    held = kv.held
    total = 0
    grown = 0
    for i in range(nb):  # (no array of needs: most decode steps take no block, and allocate none)
        need = blocks_for(np.int64(computed[ids[i]]) + plus, bs) - held[ids[i]]
        if need > 0:
            total += need
            grown += 1
    if total == 0:
        return True
    if total > kv.s[0].free:
        return False
    blocks = np.empty(total, dtype=np.int64)
    onext, oprev, oends, ref = kv.onext, kv.oprev, kv.oends, kv.ref
    if not keyed or total == 1:
        take_blocks(kv, total, blocks)
        t = 0
        for i in range(nb):
            r = ids[i]
            need = blocks_for(np.int64(computed[r]) + plus, bs) - held[r]
            for _ in range(need):
                _own_append(onext, oprev, oends, ref, r, blocks[t])
                t += 1
            if need > 0:
                held[r] += need
        return True
    key = np.empty(total, dtype=np.int64)
    who = np.empty(total, dtype=np.int64)
    step = np.empty(total, dtype=np.int64)
    t = 0
    gi = 0
    for i in range(nb):
        r = ids[i]
        need = blocks_for(np.int64(computed[r]) + plus, bs) - held[r]
        if need <= 0:
            continue
        for slot in range(held[r], held[r] + need):
            step[t] = slot * bs - np.int64(computed[r])
            key[t] = step[t] * grown + gi
            who[t] = r
            t += 1
        gi += 1
    order = np.argsort(key)
    if kv.evict == SGLANG:  # one allocation per step, as the steps took them (kv/radix.py)
        s = 0
        while s < total:
            e = s + 1
            while e < total and step[order[e]] == step[order[s]]:
                e += 1
            rx_take(kv, e - s, blocks[s:e])
            s = e
    else:
        take_blocks(kv, total, blocks)
    for t in range(total):
        _own_append(onext, oprev, oends, ref, who[order[t]], blocks[t])
    for t in range(total):
        held[who[t]] += 1
    return True


@kernel
def px_allocate(kv, computed, rid, n):
    """Room for ``n`` more tokens of ``rid``: take its pending hit and new blocks (module
    docstring); False, changing nothing, when the pool cannot provide them."""
    c = np.int64(computed[rid])
    bs = kv.block_size
    if kv.h_pos[rid] >= 0:
        one = np.empty(1, dtype=np.int64)
        one[0] = rid
        if not px_grow(kv, computed, one, 1, n, False):
            return False
        _register(kv, rid, (c + n) // bs)
        return True
    m = kv.pend[rid]
    kv.pend[rid] = -1
    lookup = m >= 0 or c == 0
    a = kv.off[rid]
    if m < 0:
        m = 0
    else:
        pend_blk, bhash, chain = kv.pend_blk, kv.bhash, kv.chain
        for j in range(m):
            b = pend_blk[a + j]
            if bhash[b] != chain[a + j]:  # evicted since the lookup
                m = j
                c = m * bs
                computed[rid] = c
                kv.ps[0].stale_hits += 1
                break
    need = blocks_for(c + n, bs) - m
    idle = 0
    pend_blk, ref = kv.pend_blk, kv.ref
    for j in range(m):
        if ref[pend_blk[a + j]] == 0:
            idle += 1
    if need + idle > kv.s[0].free:
        if m:
            kv.pend[rid] = m
        return False
    _touch(kv, rid, m)
    new = np.empty(need if need > 0 else 0, dtype=np.int64)
    take_blocks(kv, len(new), new)
    _new_row(kv, rid, m, new, len(new))
    _register(kv, rid, (c + n) // bs)
    if lookup:
        _claim(kv, rid, m, new, 0)
    return True


@kernel
def px_free(kv, computed, rid):
    """Release ``rid``'s blocks: full blocks of its chain become cached-free, tail first."""
    kv.pend[rid] = -1
    if kv.h_pos[rid] < 0:
        return
    _register(kv, rid, np.int64(computed[rid]) // kv.block_size)
    rel = np.empty(kv.held[rid], dtype=np.int64)
    nrel = 0
    g = kv.klass[rid]
    b = kv.oends[1, rid]
    j = kv.nhit[rid] - 1
    ref, bclass, oprev, cache_blk, chain = kv.ref, kv.bclass, kv.oprev, kv.cache_blk, kv.chain
    o = kv.off[rid]
    priority = kv.evict == PRIORITY
    while True:
        if b >= 0:
            blk = b
            b = oprev[b]
        elif j >= 0:
            blk = cache_blk[chain[o + j]]  # a hit block (_hit_block)
            j -= 1
        else:
            break
        ref[blk] -= 1
        if priority and g < bclass[blk]:
            bclass[blk] = g
        if ref[blk] == 0:
            rel[nrel] = blk
            nrel += 1
    if kv.evict == SGLANG:  # SGLang inserts the finished sequence root first, then unlocks it
        rel[:nrel] = rel[:nrel][::-1].copy()
        release(kv, rel, nrel)
        rx_released(kv, rel, nrel)
    else:
        release(kv, rel, nrel)
    kv.held[rid] = 0
    kv.reg[rid] = 0
    kv.nhit[rid] = 0
    kv.oends[0, rid] = -1
    kv.oends[1, rid] = -1
    kv.load_ready[rid] = 0.0
    _hold_remove(kv, rid)


# ------------------------------------------------------------- chainless pools (``counted``)
# Where no request has a chain (a workload without prefixes), no block is ever cached, so which
# block a request holds cannot matter: the pool takes the paged allocator's count rules
# (kv/kernels.py, ``kv.counted``) and keeps only what the prefix reports and the KV usage read.
@kernel
def px_counted_hold(kv, computed, rid):
    """A counted pool's allocation that is about to succeed: a first one makes ``rid`` a
    holder and counts its lookup (as :func:`px_allocate`: hit 0)."""
    if kv.h_pos[rid] >= 0:
        return
    kv.pend[rid] = -1
    kv.nhit[rid] = 0
    kv.reg[rid] = 0
    _hold_add(kv, rid)
    if computed[rid] == 0:
        _claim(kv, rid, 0, np.empty(0, dtype=np.int64), 0)


@kernel
def px_counted_free(kv, rid):
    """A counted pool's release of ``rid`` (the blocks are the caller's count)."""
    kv.pend[rid] = -1
    if kv.h_pos[rid] >= 0:
        kv.load_ready[rid] = 0.0
        _hold_remove(kv, rid)


# ------------------------------------------------------------------------------ decode runs
@kernel
def px_stable_steps(kv, computed, ids, nb, k):
    """How many of the next ``k`` decode steps of ``ids[:nb]`` (a fast-path run whose step 1 is
    allocated) can run before a policy decision could differ from the one just taken.

    A waiting request blocked at this boundary stays blocked while the pool only shrinks, unless
    its lookup changes: a block of its chain evicted from L1 shortens its hit (which can *lower*
    what it needs: ref-0 hit blocks count against the free blocks) and, with tiers, demotes the
    block where a fetch may now find it. Decode steps take blocks but register none, so only
    those evictions matter. The run therefore ends before the first step whose blocks include a
    cached block of a chain looked up at this boundary (the lookups at the latest lookup time;
    older ones only make the cut earlier)."""
    if k <= 1 or not kv.ps[0].watch_any:
        return k
    c = np.empty(nb, dtype=np.int64)
    for i in range(nb):
        c[i] = computed[ids[i]]
    demand = np.empty(k - 1, dtype=np.int64)
    run_demand_into(c, k, 0, kv.block_size, 1, demand)
    for j in range(1, k - 1):
        demand[j] += demand[j - 1]
    total = demand[k - 2]
    if total == 0:
        return k
    if kv.evict == SGLANG:  # the run ends before its first eviction (no plan of rx_evict's order)
        p = kv.qsize[MAIN]
        return k if total <= p else bisect_right(demand, p) + 1
    plan = np.empty(PLAN_STEPS, dtype=np.int64)
    steps = take_plan(kv, total, True, plan)
    gen = kv.ps[0].watch_gen
    qends, qnext, bhash, watch = kv.qends, kv.qnext, kv.bhash, kv.watch
    p = 0
    for step in range(steps):
        b = qends[0, plan_queue(kv, step)]
        for _ in range(plan[step]):
            if b < 0:
                break
            h = bhash[b]
            if h >= 0 and watch[h] == gen:
                # position p of the take order is taken at step 2 + (first i: demand[i] > p)
                return bisect_right(demand, p) + 1
            b = qnext[b]
            p += 1
    return k


@kernel
def px_step_usage(kv, computed, ids, new, nb, k, used, out):
    """As ``kv_step_usage`` (kv/kernels.py), with shared blocks counted once: allocated slots
    are the blocks in use; internal slack is the partly written last block of each holder
    (shared blocks are always full); nothing is reserved unused, nothing external."""
    bs = kv.block_size
    written = np.empty(k, dtype=np.int64)
    touched = np.empty(k, dtype=np.int64)
    slots_per_step(computed, kv.h_arr, kv.ps[0].n_hold, ids, new, nb, k, bs, written, touched)
    full = out.shape[0] >= 5
    for j in range(k):
        a = used[j] * bs
        internal = touched[j] * bs - written[j]
        out[0, j] = internal
        out[1, j] = 0
        out[2, j] = 0
        if full:
            out[3, j] = a
            out[4, j] = a - internal
