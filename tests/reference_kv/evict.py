"""Eviction policies of the GPU (L1) prefix cache: which free block is taken next.

A free block is either *plain* (holds nothing reusable) or *cached* (its KV has a prefix hash and
a ref count of 0). Taking a cached block evicts its prefix. A policy decides (1) which queue a
block joins when it becomes free and (2) in what order queues are drained. Within one queue the
order is always FIFO = least recently freed first (see :mod:`tests.reference_kv.freeq`).

``lru`` (vLLM ``BlockPool``): one queue for every free block, plain or cached, in the order they
were freed. A request's blocks are freed tail first, so a sequence's last blocks are evicted before
its first ones (a shared system prompt survives longest). Plain blocks are *not* preferred over
cached ones: vLLM takes the queue head whatever it holds. A hot-prefix queue, drained last, exists
only when hot-prefix preload is on.

``priority``: plain blocks first (as SGLang, which evicts from its radix tree only when the free
pool is short), then cached blocks by SLA class from P4 up to P0 (a block's class is the most
urgent class that used it), LRU within a class. ``protect_share[c]`` of the pool's blocks of class
``c`` are protected: they are taken only after every unprotected cached block (``[1.0]`` pins P0's
prefixes as long as anything else can be evicted). Hot prefixes are drained last::

    drain order:  plain | P4 P3 P2 P1 P0 beyond quota | P4 .. P0 within quota | hot
"""

from __future__ import annotations

import numpy as np

from servesim.request import NUM_CLASSES


class LRUEviction:
    name = "lru"
    MAIN = 0
    HOT = 1
    num_queues = 2
    PLAIN = MAIN

    def queue_of(self, hashed: np.ndarray, klass: np.ndarray, hot: np.ndarray) -> np.ndarray:
        return np.where(hot, self.HOT, self.MAIN).astype(np.int8)

    def plan(self, sizes: list[int], n: int) -> list[tuple[int, int]]:
        a = min(n, sizes[self.MAIN])
        return [(self.MAIN, a), (self.HOT, n - a)]


class PriorityEviction:
    name = "priority"
    PLAIN = 0
    HOT = 1 + NUM_CLASSES
    num_queues = 2 + NUM_CLASSES

    def __init__(self, num_blocks: int, protect_share: list[float]):
        share = list(protect_share) + [0.0] * (NUM_CLASSES - len(protect_share))
        self.protect = [int(s * num_blocks) for s in share[:NUM_CLASSES]]

    def queue_of(self, hashed: np.ndarray, klass: np.ndarray, hot: np.ndarray) -> np.ndarray:
        q = np.where(hashed, 1 + klass.astype(np.int64), self.PLAIN)
        return np.where(hot, self.HOT, q).astype(np.int8)

    def plan(self, sizes: list[int], n: int) -> list[tuple[int, int]]:
        plan = []
        a = min(n, sizes[self.PLAIN])
        plan.append((self.PLAIN, a))
        n -= a
        left = list(sizes)
        for c in range(NUM_CLASSES - 1, -1, -1):  # beyond quota, least urgent class first
            q = 1 + c
            a = min(n, max(0, left[q] - self.protect[c]))
            plan.append((q, a))
            left[q] -= a
            n -= a
        for c in range(NUM_CLASSES - 1, -1, -1):  # within quota
            q = 1 + c
            a = min(n, left[q])
            plan.append((q, a))
            n -= a
        plan.append((self.HOT, n))
        return plan


def make_eviction(name: str, num_blocks: int, protect_share: list[float] | None = None):
    if name == "lru":
        return LRUEviction()
    if name == "priority":
        return PriorityEviction(num_blocks, protect_share if protect_share is not None else [1.0])
    raise ValueError(f"prefix cache eviction {name!r} is not one of: lru, priority")
