"""SGLang's radix-cache eviction (``prefix_cache_eviction: sglang``) over the prefix cache's chains.

SGLang keeps its prefix cache as a radix tree of token sequences (sgl-project/sglang,
python/sglang/srt/mem_cache/radix_cache.py, read at commit 95769b2 (v0.4.x); the rule is the same
at 006b0e3 (v0.5.x), which keeps the evictable leaves in a set and takes the heap key from an
eviction strategy, ``lru`` by default). What it evicts, and when:

* only when the free pool is short: an allocation of ``n`` tokens takes free slots, and calls
  ``evict(n)`` first only if fewer than ``n`` are free (``alloc_token_slots``,
  srt/managers/schedule_batch.py);
* ``evict(n)`` evicts *leaves* whose ``lock_ref`` is 0, least recently accessed first, a whole
  node (all its tokens) at a time, until at least ``n`` tokens are evicted; a parent whose last
  child went becomes a leaf candidate (pushed on the same heap, with its own access time);
* a node's ``last_access_time`` is set by every ``match_prefix`` through it (a waiting request is
  matched at every scheduling attempt) and every ``insert`` (a chunk of a prefill,
  ``cache_unfinished_req``; the whole sequence when the request finishes, ``cache_finished_req``,
  just before its locks are released), walking from the root, so a parent's time is earlier than
  its child's from the same walk;
* nodes are split where a match ends inside one, or an insert branches off inside one.

The same tree over servesim's structures (kv/pcache.py): with block size 1 a chain hash is a token
prefix, so the chains *are* SGLang's tree (at larger sizes, its paged variant). A hash's parent is
the hash before it in any chain (``hpar``); ``nchild[h]`` counts the cached hashes whose parent is
``h``; a block is a leaf when its hash has no cached child. A *segment* (SGLang's node) is the run
of blocks one ``_register`` call entered (a chunk, or the request's last blocks at release), cut
where a lookup's match ended or another insert branched off: ``send[b]`` marks a block that ends
its segment (a match ending at ``b``, or any block registered below ``b`` that was not registered
in the same call). ``lock_ref`` is the blocks' ref count (a request holds its whole path).

Access order is the cached queue (``CACHED``, kv/pqueue.py): every cached block with ref count 0,
oldest access first, ``acc[b]`` its stamp. A lookup moves the ref-0 blocks it matched to the tail
root first (:func:`rx_access`); a release appends the freed blocks root first (kv/pcache.py
``px_free``). Plain free blocks are the free pool (``MAIN``). :func:`rx_take` is the one
allocation entry point of the rule; :func:`rx_evict` the eviction. The first leaf found scanning
the cached queue from its head is the least recently accessed unlocked leaf; after its segment
goes, the parent segment (a leaf now, if childless) is next when its stamp is older than the
scan's next block, else the scan finds it in turn: SGLang's heap order, without a heap.

Where servesim differs: SGLang allocates one prefill *batch*'s tokens at once, servesim one
request's (a decode step's tokens are one allocation in both); so a prefill batch may evict in
smaller pieces here. Hot-prefix preload (Halo) is not part of SGLang's cache and is refused with
this rule (kv/pstate.py).
"""

from __future__ import annotations

import numpy as np

from servesim.jit import kernel
from servesim.kv.pqueue import CACHED, MAIN, SGLANG, _push, _unlink, evict_blocks, take


@kernel(inline=True)
def rx_link(hpar, nchild, cache_blk, send, h, fresh):
    """Hash ``h`` was just entered into the cache map: one more cached child of its parent; a
    ``fresh`` insert (its parent not entered by the same call) ends the parent's segment there."""
    ph = hpar[h]
    if ph >= 0:
        nchild[ph] += 1
        if fresh:
            p = cache_blk[ph]
            if p >= 0:
                send[p] = True


@kernel(inline=True)
def _stamp(kv, b):
    ps = kv.ps[0]
    kv.acc[b] = ps.tick
    ps.tick += 1


@kernel
def rx_access(kv, a, m):
    """A lookup matched the blocks ``pend_blk[a:a + m]`` (root first): SGLang's ``match_prefix``
    refreshes their access time (the ref-0 ones move to the cached queue's tail, in path order)
    and splits the node where the match ends."""
    if m == 0:
        return
    pend_blk, qid = kv.pend_blk, kv.qid
    qnext, qprev, qends, qsize = kv.qnext, kv.qprev, kv.qends, kv.qsize
    for j in range(a, a + m):
        b = pend_blk[j]
        if qid[b] == CACHED:
            _unlink(qnext, qprev, qends, qid, qsize, b)
            _push(qnext, qprev, qends, qid, qsize, b, CACHED)
            _stamp(kv, b)
    kv.send[pend_blk[a + m - 1]] = True


@kernel
def rx_released(kv, rel, nrel):
    """Stamp blocks just released into the cached queue (``rel[:nrel]``, in queue order)."""
    qid = kv.qid
    for i in range(nrel):
        if qid[rel[i]] == CACHED:
            _stamp(kv, rel[i])


@kernel
def rx_evict(kv, n):
    """SGLang's ``evict(n)`` (module docstring): whole leaf segments, least recently accessed
    first, until at least ``n`` blocks are evicted or none is left; they join the free pool."""
    qnext, qprev, qends, qid, qsize = kv.qnext, kv.qprev, kv.qends, kv.qid, kv.qsize
    bhash, hpar, nchild, cache_blk, send, acc = kv.bhash, kv.hpar, kv.nchild, kv.cache_blk, kv.send, kv.acc
    ev = np.empty(qsize[CACHED], dtype=np.int64)
    got = 0
    b = qends[0, CACHED]
    while got < n and b >= 0:
        if nchild[bhash[b]] > 0:  # not a leaf: its subtree is further on (all of it ref 0)
            b = qnext[b]
            continue
        nxt = qnext[b]
        cur = b
        while True:  # the segment, leaf first, then parents that are now the oldest leaf
            if cur == nxt:  # a parent that was the scan's next block: the scan goes on after it
                nxt = qnext[cur]
            _unlink(qnext, qprev, qends, qid, qsize, cur)
            send[cur] = False
            ev[got] = cur
            got += 1
            ph = hpar[bhash[cur]]
            if ph < 0:
                break
            nchild[ph] -= 1
            p = cache_blk[ph]
            if p < 0 or nchild[ph] > 0 or qid[p] != CACHED:
                break
            if send[p] and (got >= n or (nxt >= 0 and acc[p] > acc[nxt])):
                break  # a new segment: SGLang stops at n, or pops an older leaf first
            cur = p
        b = nxt
    # (chains that give one hash two parents could leave only non-leaves: take from the head)
    while got < n and qends[0, CACHED] >= 0:
        cur = qends[0, CACHED]
        _unlink(qnext, qprev, qends, qid, qsize, cur)
        send[cur] = False
        ev[got] = cur
        got += 1
        ph = hpar[bhash[cur]]
        if ph >= 0:
            nchild[ph] -= 1
    evict_blocks(kv, ev, got)
    for i in range(got):
        _push(qnext, qprev, qends, qid, qsize, ev[i], MAIN)


@kernel
def rx_take(kv, n, out):
    """``n`` blocks into ``out[:n]`` (the caller made sure ``n <= free``): from the free pool,
    after :func:`rx_evict` of ``n`` if it holds fewer."""
    if kv.qsize[MAIN] < n:
        rx_evict(kv, n)
    qnext, qprev, qends, qid, qsize = kv.qnext, kv.qprev, kv.qends, kv.qid, kv.qsize
    for i in range(n):
        b = qends[0, MAIN]
        _unlink(qnext, qprev, qends, qid, qsize, b)
        out[i] = b
    kv.s[0].free -= n
    return n


@kernel
def take_blocks(kv, n, out):
    """An allocation's ``n`` blocks into ``out[:n]`` by the pool's eviction rule."""
    if kv.evict == SGLANG:
        return rx_take(kv, n, out)
    return take(kv, n, True, out)


@kernel
def rx_check(kv):
    """True when every child count equals the cached hashes below it (sglang rule only)."""
    if kv.evict != SGLANG:
        return True
    count = np.zeros(kv.nchild.shape[0], dtype=np.int64)
    for h in range(kv.cache_blk.shape[0]):
        if kv.cache_blk[h] >= 0 and kv.hpar[h] >= 0:
            count[kv.hpar[h]] += 1
    for h in range(count.shape[0]):
        if count[h] != kv.nchild[h]:
            return False
    return True
