"""Build the reference object for a scenario (moved from servesim/kv/factory.py with the object
path)."""

from __future__ import annotations

from tests.reference_kv.prefix import PrefixCacheKV
from tests.reference_kv.preload import HotPrefixTracker
from tests.reference_kv.tiers import Channels, Link, LowerTier, TierStack


def build_reference(sc, plan, table, offsets, hashes, specs, block_bytes, hot, shared):
    """The reference manager for a scenario: what ``servesim.kv.factory.build_prefix_cache`` calls
    in place of the kernels' pool when ``OBJECT_REFERENCE`` is this function (its arguments: the
    engine chains, tier specs, preload knobs and shared links the factory worked out)."""
    tiers = None
    if specs:
        slots = [None if t.shared_row < 0 else shared.channels.setdefault(t.shared_row, Channels(t.channels))
                 for t in specs]
        tiers = TierStack([LowerTier(t.name, t.capacity, Link(f"{t.name}-link", t.bandwidth, t.latency, t.channels, c))
                           for t, c in zip(specs, slots)], block_bytes)
    e = sc.engine
    return PrefixCacheKV(plan.num_blocks, e.block_size, table, offsets, hashes, eviction=e.prefix_cache_eviction,
                         protect_share=e.kv.protect_share, tiers=tiers,
                         hot=HotPrefixTracker(*hot) if hot is not None else None)
