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

from servesim.jit import kernel
from servesim.kv.dlist import dl_append, dl_unlink

# t_stat columns
PRELOADED, INSERTED, REFRESHED, EVICTED = 0, 1, 2, 3
# l_cnt columns
BYTES_UP, BYTES_DOWN, FETCHES, STORES = 0, 1, 2, 3
# tier_check codes (pcache.check_text gives the text)
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
def _lru_unlink(kv, i, h):
    dl_unlink(kv.t_next[i], kv.t_prev[i], kv.t_ends, i, h)


@kernel(inline=True)
def _lru_append(kv, i, h):
    dl_append(kv.t_next[i], kv.t_prev[i], kv.t_ends, i, h)


@kernel
def tier_touch(kv, i, h):
    """Move hash ``h`` (held by tier ``i``) to its LRU tail."""
    if kv.t_ends[1, i] != h:
        _lru_unlink(kv, i, h)
        _lru_append(kv, i, h)


@kernel
def tier_demote(kv, h):
    """Hash ``h`` evicted from L1 goes down the stack (module docstring)."""
    kv.ps[0].demoted += 1
    for i in range(kv.t_cap.shape[0]):
        if kv.t_in[i, h]:
            tier_touch(kv, i, h)
            kv.t_stat[i, REFRESHED] += 1
            return
        kv.t_in[i, h] = True
        _lru_append(kv, i, h)
        kv.t_size[i] += 1
        kv.t_stat[i, INSERTED] += 1
        kv.l_cnt[i, BYTES_DOWN] += kv.block_bytes
        kv.l_cnt[i, STORES] += 1
        if kv.t_size[i] <= kv.t_cap[i]:
            return
        out = kv.t_ends[0, i]  # the least recently used block moves on
        _lru_unlink(kv, i, out)
        kv.t_in[i, out] = False
        kv.t_size[i] -= 1
        kv.t_stat[i, EVICTED] += 1
        h = out
    kv.ps[0].dropped += 1


@kernel(inline=True)
def tier_of(kv, h):
    """The first tier holding hash ``h``, or -1."""
    for i in range(kv.t_cap.shape[0]):
        if kv.t_in[i, h]:
            return i
    return -1


@kernel
def tiers_fetch(kv, hs, where, m, now, klass):
    """Promote ``hs[:m]`` found in tiers ``where[:m]`` to L1, tier by tier (one transfer each);
    returns when all have arrived. ``klass`` -1 marks a preload (counted apart from demand hits)."""
    ready = now
    for i in range(kv.t_cap.shape[0]):
        mine = 0
        for j in range(m):
            if where[j] == i:
                tier_touch(kv, i, hs[j])
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
