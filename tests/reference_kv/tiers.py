"""Lower KV tiers (Halo's L2 CPU DRAM and L3 remote store) and the links that reach them.

L1 is the GPU pool of :class:`~tests.reference_kv.prefix.PrefixCacheKV`. Below it, each configured tier
is a hash-addressed block store with a capacity, reached from the GPU over its own link::

    GPU HBM (L1) ──PCIe / RDMA── CPU DRAM (L2) ──────────── capacity, LRU
        └──────────network (GPUDirect RDMA)──── remote store (L3, e.g. Redis/Mooncake)

* **Demotion** (write-behind): a block evicted from L1 is stored in L2 if L2 does not hold it
  already; a block L2 evicts to make room moves on to L3; what the last tier evicts is dropped.
  Stores are counted (bytes moved per link, down direction) but off every request's path: the
  engine stores KV as it is produced (LMCache and Mooncake store on prefill completion), so by
  the time L1 evicts it the copy exists. Links are full duplex, so stores do not delay fetches.
* **Promotion**: a hit in tier ``i`` is read over tier ``i``'s link straight into GPU memory (an L3
  hit is not staged through L2: Mooncake's transfer engine and LMCache's remote backends write into
  GPU buffers). The lower-tier copy stays (inclusive, as LMCache): evicting the block again from
  L1 costs no transfer while L2 still holds it.
* **Link contention**: each link has ``channels`` parallel transfer slots served first come first
  served; a fetch of ``b`` bytes requested at ``now`` starts when a channel is free and completes
  ``latency + b / bandwidth`` later. That completion is known when the fetch is requested (it is
  ``PrefixHit.ready_at``). :meth:`Link.fetch` is the one entry point for a transfer.
* **Shared links** (``kv_tiers[i].shared_link``): a link used by every replica of a fleet (a
  cluster-wide L3 such as Halo's Redis) is one contended resource: every replica's ``Link`` holds
  the same channel array (:class:`Channels`), so a fetch waits for the transfers the other
  replicas started before it. The fleet loop advances an engine only up to the next other
  engine's event when a link is shared (engine/cluster.py), so fetches reach the channels in time
  order -- first come first served, as one SimPy resource of ``channels`` slots would serve them,
  without a SimPy event per transfer. Each replica's ``Link`` keeps its own counters (bytes,
  fetches, busy and queued seconds), so a fleet's summed counters count every transfer once.

Lower tiers evict LRU (priority-aware eviction and pinning apply to L1, where blocks compete with
running requests). Block bytes are one GPU's share (``kv_bytes_per_token x block_size``); give each
link the bandwidth one GPU gets.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from servesim.request import NUM_CLASSES


class Channels:
    """A link's transfer slots: when each is next free. One per link, or one for every replica of
    a fleet on a shared link."""

    def __init__(self, channels: int):
        self.free_at = [0.0] * channels
        self.last_request = 0.0  # the latest request time seen (requests must come in time order)


class Link:
    """A full-duplex link between the GPU and one lower tier (``channels``: a :class:`Channels`
    shared with other replicas' links, or None for a link of its own)."""

    def __init__(self, name: str, bandwidth_bytes_per_s: float, latency_s: float = 0.0, channels: int = 1,
                 shared: "Channels | None" = None):
        if bandwidth_bytes_per_s <= 0 or latency_s < 0 or channels < 1:
            raise ValueError(f"link {name}: need bandwidth > 0, latency >= 0, channels >= 1")
        if shared is not None and len(shared.free_at) != channels:
            raise ValueError(f"link {name}: a shared link has {len(shared.free_at)} channels, not {channels}")
        self.name = name
        self.bw = float(bandwidth_bytes_per_s)
        self.latency = float(latency_s)
        self.slots = shared if shared is not None else Channels(channels)
        self.shared = shared is not None
        self.bytes_up = 0
        self.bytes_down = 0
        self.fetches = 0
        self.stores = 0
        self.busy_s = 0.0  # channel-seconds spent fetching
        self.queue_s = 0.0  # fetch seconds spent waiting for a free channel
        self.out_of_order_s = 0.0  # how far a request came before one already served (shared links: 0)

    @property
    def free_at(self) -> list[float]:
        return self.slots.free_at

    def fetch(self, nbytes: int, now: float) -> float:
        """Move ``nbytes`` up to the GPU, requested at ``now``; returns the completion time."""
        slots = self.slots
        free_at = slots.free_at
        ch = min(range(len(free_at)), key=free_at.__getitem__)
        start = max(now, free_at[ch])
        end = start + self.latency + nbytes / self.bw
        free_at[ch] = end
        if now < slots.last_request:
            self.out_of_order_s = max(self.out_of_order_s, slots.last_request - now)
        else:
            slots.last_request = now
        self.bytes_up += int(nbytes)
        self.fetches += 1
        self.busy_s += end - start
        self.queue_s += start - now
        return end

    def store(self, blocks: int, nbytes: int) -> None:
        """Count a write-behind store of ``blocks`` blocks, ``nbytes`` in all (down direction; see
        module docstring). ``stores`` counts blocks, so it does not depend on how many evictions
        one call groups (a decode run evicts many steps' blocks at once)."""
        self.bytes_down += int(nbytes)
        self.stores += int(blocks)


@dataclass
class TierStats:
    hits: np.ndarray = field(default_factory=lambda: np.zeros(NUM_CLASSES, dtype=np.int64))  # blocks fetched
    preloaded: int = 0  # blocks fetched ahead of demand
    inserted: int = 0  # blocks stored into this tier
    refreshed: int = 0  # blocks sent down that this tier already held (LRU touch, no transfer)
    evicted: int = 0  # blocks this tier evicted (moved down or dropped)


class LowerTier:
    """A block store of ``capacity`` blocks with LRU eviction, keyed by prefix hash."""

    def __init__(self, name: str, capacity_blocks: int, link: Link):
        self.name = name
        self.capacity = int(capacity_blocks)
        self.link = link
        self.blocks: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self.stats = TierStats()
        self.block_bytes = 0  # set by the TierStack that holds this tier

    def __contains__(self, h: int) -> bool:
        return h in self.blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def receive(self, hashes: list[int]) -> list[int]:
        """Blocks sent down to this tier, in order: one already held is refreshed (moved to the
        LRU tail, no transfer), a new one is stored and, when the tier is full, pushes out its
        least recently used block. Returns what was pushed out, in order.

        Processed one hash at a time, so sending a list at once or in consecutive pieces gives
        the same contents, order and counters (the engine's fast path sends a whole decode run's
        evictions at once; single stepping sends them step by step)."""
        blocks, cap = self.blocks, self.capacity
        out: list[int] = []
        stored = 0
        for h in hashes:
            if h in blocks:
                blocks.move_to_end(h)
                continue
            blocks[h] = None
            stored += 1
            if len(blocks) > cap:
                out.append(blocks.popitem(last=False)[0])
        self.stats.inserted += stored
        self.stats.refreshed += len(hashes) - stored
        self.stats.evicted += len(out)
        if stored:
            self.link.store(stored, stored * self.block_bytes)
        return out

    def touch(self, hashes: list[int]) -> None:
        for h in hashes:
            self.blocks.move_to_end(h)


class TierStack:
    """The lower tiers in order (index 0 = L2), with demotion, lookup and promotion."""

    def __init__(self, tiers: list[LowerTier], block_bytes: int):
        self.tiers = tiers
        self.block_bytes = int(block_bytes)
        for t in tiers:
            t.block_bytes = self.block_bytes
        self.dropped = 0  # blocks evicted from the last tier
        self.demoted = 0  # blocks L1 evicted into the stack

    def __len__(self) -> int:
        return len(self.tiers)

    def demote(self, hashes: list[int]) -> None:
        """Blocks evicted from L1 (in eviction order) go down the stack."""
        self.demoted += len(hashes)
        for tier in self.tiers:
            hashes = tier.receive(hashes)
            if not hashes:
                return
        self.dropped += len(hashes)

    def find(self, hashes: list[int], skip=None) -> list[int]:
        """Tier index of each leading hash found below L1, stopping at the first miss (or at a
        hash for which ``skip(h)`` is true)."""
        out = []
        for h in hashes:
            if skip is not None and skip(h):
                break
            for i, tier in enumerate(self.tiers):
                if h in tier.blocks:
                    out.append(i)
                    break
            else:
                break
        return out

    def fetch(self, hashes: list[int], where: list[int], now: float, klass: int = -1) -> float:
        """Promote ``hashes`` found in tiers ``where`` to L1; returns when all have arrived.
        ``klass`` -1 marks a preload (counted apart from demand hits)."""
        ready = now
        for i, tier in enumerate(self.tiers):
            mine = [h for h, w in zip(hashes, where) if w == i]
            if not mine:
                continue
            tier.touch(mine)
            ready = max(ready, tier.link.fetch(len(mine) * self.block_bytes, now))
            if klass >= 0:
                tier.stats.hits[klass] += len(mine)
            else:
                tier.stats.preloaded += len(mine)
        return ready

    def check(self) -> None:
        """Capacity; conservation: every block sent down a level is stored, refreshed or dropped."""
        sent = self.demoted
        for t in self.tiers:
            if t.stats.inserted + t.stats.refreshed != sent:
                raise AssertionError(f"tier {t.name}: {sent} blocks sent down, but {t.stats.inserted} stored "
                                     f"+ {t.stats.refreshed} refreshed")
            sent = t.stats.evicted
        if sent != self.dropped:
            raise AssertionError(f"last tier evicted {sent} blocks but {self.dropped} were dropped")
        for t in self.tiers:
            if len(t.blocks) > t.capacity:
                raise AssertionError(f"tier {t.name}: {len(t.blocks)} blocks exceed capacity {t.capacity}")
            if t.stats.inserted - t.stats.evicted != len(t.blocks):
                raise AssertionError(f"tier {t.name}: inserted - evicted != blocks held")
            if t.link.out_of_order_s > 0.0:
                raise AssertionError(f"link {t.link.name}: a fetch was requested {t.link.out_of_order_s} s "
                                     f"before one already served (the link's users are not in time order)")
