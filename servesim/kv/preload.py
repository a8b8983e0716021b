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
