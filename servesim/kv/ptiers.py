"""Lower KV tiers (L2 CPU DRAM, L3 remote store) and their links, as kernels over the pool state.

L1 is the GPU pool of the prefix cache (kv/pcache.py). Below it, each configured tier ``i`` is a
block store keyed by prefix hash (a dense hash id, kv/pstate.py), with a capacity, kept in LRU
order as a doubly linked list over hash ids (kv/dlist.py: ``t_next[i]``, ``t_prev[i]``, ``t_ends``; ``t_in[i]``), reached
over its own link::

    GPU HBM (L1) ──PCIe / RDMA── CPU DRAM (L2) ──────────── capacity, LRU
        └──────────network (GPUDirect RDMA)──── remote store (L3, e.g. Redis/Mooncake)

* **Demotion** (write-behind): a block evicted from L1 is stored in L2 if L2 does not hold it
  already (then it is only refreshed: moved to the LRU tail); a block L2 pushes out to make room
  moves on to L3; what the last tier pushes out is dropped. Stores are counted (blocks and bytes
  down each link) but off every request's path: engines store KV as it is produced (LMCache and
  Mooncake store on prefill completion), and links are full duplex. One hash at a time, so a
  decode run's evictions sent at once give what single stepping gives.
* **Promotion**: a hit in tier ``i`` is read over tier ``i``'s link straight into GPU memory (an
  L3 hit is not staged through L2: Mooncake's transfer engine and LMCache's remote backends write
  into GPU buffers). The copy stays below (inclusive, as LMCache) and moves to the LRU tail.
* **Links**: :func:`link_transfer` is the one entry point for "a transfer of N bytes starts at t
  on link L": ``channels`` parallel slots served first come first served; the transfer starts
  when a slot is free and completes ``latency + bytes / bandwidth`` later. That completion is
  known when the transfer is requested (a lookup's ready time).

Lower tiers evict LRU (priority-aware eviction and pinning apply to L1, where blocks compete with
running requests). Block bytes are one GPU's share (``kv_bytes_per_token x block_size``); give each
link the bandwidth one GPU gets.

Counters per tier: ``t_stat[i]`` = (preloaded, inserted, refreshed, evicted) blocks, ``t_hits[i,
class]`` blocks fetched on demand; per link ``l_cnt[i]`` = (bytes up, bytes down, fetches, stores)
and ``l_time[i]`` = (busy channel-seconds, seconds waited for a free channel).
"""

from __future__ import annotations

import numpy as np

from servesim.jit import kernel
from servesim.kv.dlist import dl_append, dl_unlink

# t_stat columns
PRELOADED, INSERTED, REFRESHED, EVICTED = 0, 1, 2, 3
# l_cnt columns
BYTES_UP, BYTES_DOWN, FETCHES, STORES = 0, 1, 2, 3
# tier_check codes (pcheck.check_text gives the text)
TIER_FLOW = 40  # blocks sent down a level != stored + refreshed there
TIER_DROPPED = 41  # the last tier's evictions != blocks dropped
TIER_CAPACITY = 42  # a tier holds more than its capacity
TIER_COUNT = 43  # inserted - evicted != blocks held
TIER_ORDER = 44  # a shared link saw a fetch requested before one already served


@kernel
def link_transfer(kv, i, nbytes, now):
    """A transfer of ``nbytes`` up link ``i``, requested at ``now``: its completion time. The one
    place a link's model is applied (the seam where a link shared by several replicas is handed
    to a contended resource instead). A shared link (``l_sid[i] >= 0``) takes its slots from the
    fleet's array, which every engine holds: the fleet loop keeps the engines' fetches in time
    order (engine/cluster.py ``coupled``), so the slots serve all replicas first come first
    served, as one SimPy resource would."""
    r = kv.l_sid[i]
    if r >= 0:
        free = kv.l_sfree[r]
        if now < kv.l_slast[r]:
            if kv.l_slast[r] - now > kv.l_late[i]:
                kv.l_late[i] = kv.l_slast[r] - now
        else:
            kv.l_slast[r] = now
    else:
        free = kv.l_free[i]
    nch = free.shape[0]
    ch = 0
    for c in range(1, nch):
        if free[c] < free[ch]:
            ch = c
    start = now if now > free[ch] else free[ch]
    end = start + kv.l_lat[i] + nbytes / kv.l_bw[i]
    free[ch] = end
    kv.l_cnt[i, BYTES_UP] += nbytes
    kv.l_cnt[i, FETCHES] += 1
    kv.l_time[i, 0] += end - start
    kv.l_time[i, 1] += start - now
    return end


@kernel(inline=True)
def _to_tail(nxt, prv, ends, i, h):
    """Move hash ``h`` (held by tier ``i``; its row's links ``nxt``, ``prv``) to its LRU tail."""
    if ends[1, i] != h:
        dl_unlink(nxt, prv, ends, i, h)
        dl_append(nxt, prv, ends, i, h)


@kernel
def tier_demote(kv, hs, n):
    """Hashes ``hs[:n]`` evicted from L1, in eviction order, go down the stack (module
    docstring). Tier by tier: each tier's contents and counters depend only on the sequence of
    hashes sent to it, so passing the whole batch through tier 0, then what it pushed out through
    tier 1, gives what sending each hash down in turn gives. The pool's arrays are read once (a
    kernel call per hash, reading them from the pool, was a tenth of the Mooncake example's
    time in reference-count updates)."""
    kv.ps[0].demoted += n
    cur = hs[:n].copy()
    m = n
    t_ends, t_in, t_size, t_cap = kv.t_ends, kv.t_in, kv.t_size, kv.t_cap
    for i in range(t_cap.shape[0]):
        if m == 0:
            return
        nxt, prv = kv.t_next[i], kv.t_prev[i]
        out = np.empty(m, dtype=np.int64)
        k = 0
        refreshed = 0
        inserted = 0
        size = t_size[i]
        cap = t_cap[i]
        for j in range(m):
            h = cur[j]
            if t_in[i, h]:
                _to_tail(nxt, prv, t_ends, i, h)
                refreshed += 1
                continue
            t_in[i, h] = True
            dl_append(nxt, prv, t_ends, i, h)
            size += 1
            inserted += 1
            if size > cap:  # the least recently used block moves on
                o = t_ends[0, i]
                dl_unlink(nxt, prv, t_ends, i, o)
                t_in[i, o] = False
                size -= 1
                out[k] = o
                k += 1
        t_size[i] = size
        kv.t_stat[i, REFRESHED] += refreshed
        kv.t_stat[i, INSERTED] += inserted
        kv.t_stat[i, EVICTED] += k
        kv.l_cnt[i, BYTES_DOWN] += inserted * kv.block_bytes
        kv.l_cnt[i, STORES] += inserted
        cur = out
        m = k
    kv.ps[0].dropped += m


@kernel(inline=True)
def tier_of(t_in, h):
    """The first tier holding hash ``h`` (``t_in``: the pool's ``t_in``), or -1."""
    for i in range(t_in.shape[0]):
        if t_in[i, h]:
            return i
    return -1


@kernel
def tiers_fetch(kv, hs, where, m, now, klass):
    """Promote ``hs[:m]`` found in tiers ``where[:m]`` to L1, tier by tier (one transfer each);
    returns when all have arrived. ``klass`` -1 marks a preload (counted apart from demand hits)."""
    ready = now
    t_ends = kv.t_ends
    for i in range(kv.t_cap.shape[0]):
        mine = 0
        nxt, prv = kv.t_next[i], kv.t_prev[i]
        for j in range(m):
            if where[j] == i:
                h = hs[j]
                _to_tail(nxt, prv, t_ends, i, h)
                mine += 1
        if mine == 0:
            continue
        end = link_transfer(kv, i, mine * kv.block_bytes, now)
        if end > ready:
            ready = end
        if klass >= 0:
            kv.t_hits[i, klass] += mine
        else:
            kv.t_stat[i, PRELOADED] += mine
    return ready


@kernel
def tiers_check(kv):
    """0, or a TIER_* code: conservation (every block sent down a level is stored, refreshed or
    passed on, what the last tier passes on is dropped), capacity, held counts."""
    sent = kv.ps[0].demoted
    for i in range(kv.t_cap.shape[0]):
        if kv.t_stat[i, INSERTED] + kv.t_stat[i, REFRESHED] != sent:
            return TIER_FLOW
        sent = kv.t_stat[i, EVICTED]
    if kv.t_cap.shape[0] and sent != kv.ps[0].dropped:
        return TIER_DROPPED
    for i in range(kv.t_cap.shape[0]):
        if kv.t_size[i] > kv.t_cap[i]:
            return TIER_CAPACITY
        if kv.t_stat[i, INSERTED] - kv.t_stat[i, EVICTED] != kv.t_size[i]:
            return TIER_COUNT
        if kv.l_late[i] > 0.0:
            return TIER_ORDER
    return 0
