"""Hot-prefix detection for preload: which prefix blocks were asked for often enough, lately.

A block hash is *hot* while at least ``min_hits`` requests looked it up within the last
``window_s`` seconds (each request counts once per block, on its first lookup). The prefix cache
keeps hot blocks resident in L1 ahead of demand: a hot block that becomes free joins a protected
queue drained last (up to ``max_blocks`` of them), and a hot block that is only in a lower tier is
fetched back into L1 as soon as a lookup finds room for it, before the next request asks. Typical
hot prefixes are shared system prompts and few-shot templates (Halo's "hot-prefix preload";
SGLang's radix cache gets the same effect for free by never evicting referenced tree nodes).

The window slides with the lookups' clock: counts are updated only when a request is first
looked up, so the result does not depend on how often the scheduler runs.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from servesim.request import NUM_CLASSES


class HotPrefixTracker:
    def __init__(self, min_hits: int, window_s: float, max_blocks: int):
        if min_hits < 1 or window_s <= 0 or max_blocks < 0:
            raise ValueError(f"need min_hits >= 1, window_s > 0, max_blocks >= 0; got "
                             f"{min_hits}, {window_s}, {max_blocks}")
        self.min_hits = int(min_hits)
        self.window_s = float(window_s)
        self.max_blocks = int(max_blocks)
        self.counts: dict[int, int] = {}
        self._events: deque[tuple[float, list[int]]] = deque()

    def is_hot(self, h: int) -> bool:
        return self.counts.get(h, 0) >= self.min_hits

    def observe(self, hashes: list[int], now: float) -> tuple[list[int], list[int]]:
        """One request looked up ``hashes`` at ``now``. Returns (hashes that became hot, hashes
        that stopped being hot as old lookups left the window)."""
        counts, m = self.counts, self.min_hits
        cooled: list[int] = []
        horizon = now - self.window_s
        while self._events and self._events[0][0] < horizon:
            _, old = self._events.popleft()
            for h in old:
                v = counts[h] - 1
                if v == m - 1:
                    cooled.append(h)
                if v:
                    counts[h] = v
                else:
                    del counts[h]
        heated = []
        for h in hashes:
            v = counts.get(h, 0) + 1
            counts[h] = v
            if v == m:
                heated.append(h)
        if hashes:
            self._events.append((now, hashes))
        if cooled and heated:
            back = set(heated)
            cooled = [h for h in cooled if h not in back]
        return heated, cooled


# -- the prefix cache's side (functions of a PrefixCacheKV) -------------------------------------


def hot_mask(kv, blocks: np.ndarray) -> np.ndarray:
    """Which of the released ``blocks`` join the hot queue (hashed, hot, within the quota)."""
    mask = np.zeros(len(blocks), dtype=bool)
    if kv.hot is None or kv.hot.max_blocks == 0:
        return mask
    room = kv.hot.max_blocks - kv.pool.queues[kv.policy.HOT].size
    for i, (b, h) in enumerate(zip(blocks.tolist(), kv.bhash[blocks].tolist())):
        if room <= 0:
            break
        if kv.hashed[b] and kv.hot.is_hot(h):
            mask[i] = True
            room -= 1
    return mask


def observe(kv, hs: list[int], now: float) -> None:
    """A request's first lookup: update the window, move blocks in or out of the hot queue,
    preload hot blocks that only lower tiers hold."""
    heated, cooled = kv.hot.observe(hs, now)
    hot_q = kv.policy.HOT
    for h in cooled:
        kv.hot_missing.pop(h, None)
        b = kv.cache.get(h)
        if b is not None and kv.pool.qid[b] == hot_q:
            blk = np.array([b])
            kv.pool.remove(blk)
            kv.pool.push(blk, kv.policy.queue_of(kv.hashed[blk], kv.bclass[blk], np.zeros(1, bool)))
    for h in heated:
        b = kv.cache.get(h)
        if b is None:
            kv.hot_missing[h] = None
        elif kv.pool.qid[b] >= 0 and kv.pool.qid[b] != hot_q:
            blk = np.array([b])
            if hot_mask(kv, blk)[0]:
                kv.pool.remove(blk)
                kv.pool.push(blk, hot_q)
    if kv.tiers is not None and kv.hot_missing:
        preload(kv, now)


def preload(kv, now: float) -> None:
    """Fetch hot blocks that only lower tiers hold into free L1 blocks (never evicting hot
    ones), up to the hot quota."""
    room = min(kv.pool.size - kv.pool.queues[kv.policy.HOT].size,
               kv.hot.max_blocks - kv.pool.queues[kv.policy.HOT].size)
    if room <= 0:
        return
    hs, where = [], []
    for h in list(kv.hot_missing):
        w = kv.tiers.find([h])
        if not w:
            continue
        hs.append(h)
        where.append(w[0])
        if len(hs) == room:
            break
    if not hs:
        return
    for h in hs:
        del kv.hot_missing[h]
    ready_at = kv.tiers.fetch(hs, where, now, klass=-1)
    blocks = kv._take(len(hs), allow_hot=False)
    for b, h in zip(blocks.tolist(), hs):
        kv.cache[h] = b
    kv.hashed[blocks] = True
    kv.bhash[blocks] = hs
    kv.bclass[blocks] = NUM_CLASSES - 1  # no request has used it yet (not the class of its last holder)
    kv.ready[blocks] = ready_at
    kv.pool.push(blocks, kv.policy.HOT)
