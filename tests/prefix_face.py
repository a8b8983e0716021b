"""The prefix-cache kernels (kv/pcache.py) behind the reference manager's methods, so the golden
and property tests written for ``PrefixCacheKV`` (tests/reference_kv/prefix.py) drive the kernels too.

``KernelPrefixKV(num_blocks, block_size, table, offsets, hashes, eviction=..., protect_share=...,
tiers=TierStack, hot=HotPrefixTracker, trace=...)`` takes the reference's arguments (a tier stack
and a hot-prefix tracker are read for their settings only) and answers with the same method names
and views: ``reuse_prefix``, ``allocate``, ``allocate_decodes``, ``commit_decodes``, ``free``,
``decode_run``, ``stable_steps``, ``check``, ``block_table``, ``pool.members()``, ``cache``
(hash -> block), ``eviction_log``, the counters, ``tiers.tiers[i].blocks`` (hashes, LRU first).
Every call runs the kernels' own source (``jit.pure``), nothing restated.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from servesim.jit import pure
from servesim.kv import kernels as kvk
from tests.reference_kv.base import PrefixHit
from servesim.kv.pcache import px_stable_steps
from servesim.kv.pstate import PrefixPool, TierSpec, make_prefix_kv
from servesim.sched.parts import kv_prefix_lookup


class KernelPrefixKV(PrefixPool):
    def __init__(self, num_blocks, block_size, table, offsets=None, hashes=None, *, eviction="lru",
                 protect_share=None, tiers=None, hot=None, trace=False):
        specs = []
        block_bytes = 0
        if tiers is not None:
            block_bytes = tiers.block_bytes
            specs = [TierSpec(name=t.name, capacity=t.capacity, bandwidth=t.link.bw, latency=t.link.latency,
                              channels=len(t.link.free_at)) for t in tiers.tiers]
        hot_cfg = None if hot is None else (hot.min_hits, hot.window_s, hot.max_blocks)
        state = make_prefix_kv(num_blocks, block_size, table, offsets, hashes, eviction=eviction,
                               protect_share=protect_share, tiers=specs, block_bytes=block_bytes, hot=hot_cfg,
                               trace=1 << 16 if trace else 0)
        super().__init__(state, [t.name for t in specs], [t.link.name for t in tiers.tiers] if tiers else None)
        self.req = table
        self._k = {f: pure(f) for f in (kvk.kv_allocate, kvk.kv_allocate_decodes, kvk.kv_commit_decodes, kvk.kv_free,
                                       kvk.kv_decode_run, kv_prefix_lookup, px_stable_steps)}

    def _call(self, f, *args):
        return self._k[f](self.state, *args)

    def reuse_prefix(self, rid: int, now: float) -> PrefixHit:
        tokens, ready = self._call(kv_prefix_lookup, self.state.computed, rid, now)
        return PrefixHit(int(tokens), float(ready))

    def allocate(self, rid: int, n: int) -> bool:
        return bool(self._call(kvk.kv_allocate, self.state.computed, rid, n))

    def allocate_decodes(self, ids) -> bool:
        ids = np.asarray(ids, dtype=np.int64)
        return bool(self._call(kvk.kv_allocate_decodes, self.state.computed, ids, len(ids)))

    def commit_decodes(self, ids) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        self._call(kvk.kv_commit_decodes, self.state.computed, ids, len(ids))

    def free(self, rid: int) -> None:
        self._call(kvk.kv_free, rid)

    def decode_run(self, ids, k_max: int):
        ids = np.asarray(ids, dtype=np.int64)
        used = np.zeros(max(k_max, 1), dtype=np.int64)
        k = int(self._call(kvk.kv_decode_run, self.state.computed, ids, len(ids), k_max, used))
        return k, used[:k]

    def stable_steps(self, ids, k: int) -> int:
        ids = np.asarray(ids, dtype=np.int64)
        return int(self._call(px_stable_steps, self.state.computed, ids, len(ids), k))

    @property
    def cache(self) -> dict:
        kv = self.state
        ids = np.flatnonzero(kv.cache_blk >= 0)
        return {int(kv.uniq[h]): int(kv.cache_blk[h]) for h in ids}

    @property
    def pool(self):
        """The free queues, queue by queue, each head first (as ``FreeLists.members``)."""
        kv = self.state

        def members():
            out = []
            for q in range(kv.qends.shape[1]):
                b = kv.qends[0, q]
                while b >= 0:
                    out.append(int(b))
                    b = kv.qnext[b]
            return np.array(out, dtype=np.int64)

        def items(q):
            out, b = [], kv.qends[0, q]
            while b >= 0:
                out.append(int(b))
                b = kv.qnext[b]
            return np.array(out, dtype=np.int64)

        queues = [SimpleNamespace(items=lambda q=q: items(q), size=int(kv.qsize[q])) for q in range(len(kv.qsize))]
        return SimpleNamespace(members=members, size=int(kv.s[0].free), qid=kv.qid, queues=queues)

    @property
    def policy(self):
        from servesim.kv.pqueue import LRU, NC, SGLANG

        ev = self.state.evict
        return SimpleNamespace(HOT=1 if ev == LRU else (2 if ev == SGLANG else 1 + NC))

    ref = property(lambda self: self.state.ref)
    ready = property(lambda self: self.state.ready)
    hashed = property(lambda self: self.state.bhash >= 0)

    @property
    def bhash(self):
        kv = self.state
        return np.where(kv.bhash >= 0, kv.uniq[np.maximum(kv.bhash, 0)] if len(kv.uniq) else 0, 0)

    @property
    def tiers(self):
        view = super().tiers
        if view is None:
            return None
        kv = self.state
        for i, t in enumerate(view.tiers):
            hs, h = [], kv.t_ends[0, i]
            while h >= 0:
                hs.append(int(kv.uniq[h]))
                h = kv.t_next[i, h]
            t.blocks = hs
        return view
