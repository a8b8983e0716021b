"""Free-block queues for the prefix-caching pool: FIFO order, vectorized, with O(1) removal.

vLLM keeps every free block (never used, or cached with ref count 0) in one doubly linked list:
new blocks are taken from the head, freed blocks are appended at the tail, and a cache hit on a
free block unlinks it from the middle. The head is therefore the least recently freed block, and
taking it evicts whatever prefix it still caches: LRU eviction falls out of the allocation order.

We need the same three operations on numpy arrays, because the engine's fast path takes many
blocks at once. :class:`BlockQueue` stores the queue as a slice ``arr[head:tail]`` of block ids in
which a removed entry becomes a tombstone (-1); ``pos[b]`` is the index of block ``b`` in ``arr``
(-1 when it is not queued)::

    arr:  [ x  x  7  -1  3  9  -1  4  .  .  . ]
                ^head             tail^          pop(2) -> [7, 3]  (skips the tombstone)
    remove(9):  arr[pos[9]] = -1                  append([5, 2]) -> written at tail

``pop``, ``append`` and ``remove`` are O(count) numpy operations; tombstones are squeezed out when
the tail reaches the end of the array (amortized O(1) per operation, capacity 2x the pool).

:class:`FreeLists` holds several queues and pops from them in an order an eviction policy gives
(see :mod:`tests.reference_kv.evict`): one queue reproduces vLLM's LRU; several give priority-aware and
hot-prefix-protecting eviction.
"""

from __future__ import annotations

import numpy as np

_EMPTY = np.empty(0, dtype=np.int64)


class BlockQueue:
    """FIFO of block ids with tombstone removal. ``pos`` is shared by every queue of a pool."""

    def __init__(self, pos: np.ndarray, capacity: int):
        self.pos = pos
        self.arr = np.full(max(2 * capacity, 16), -1, dtype=np.int64)
        self.head = 0
        self.tail = 0
        self.size = 0

    def append(self, blocks: np.ndarray) -> None:
        m = len(blocks)
        if m == 0:
            return
        if self.tail + m > len(self.arr):
            self._compact(m)
        self.arr[self.tail : self.tail + m] = blocks
        self.pos[blocks] = np.arange(self.tail, self.tail + m)
        self.tail += m
        self.size += m

    def remove(self, blocks: np.ndarray) -> None:
        """Unlink ``blocks`` (each must be in this queue)."""
        if len(blocks) == 0:
            return
        self.arr[self.pos[blocks]] = -1
        self.pos[blocks] = -1
        self.size -= len(blocks)

    def pop(self, n: int) -> np.ndarray:
        """The first ``n`` live entries (``n <= size``), removed."""
        if n <= 0:
            return _EMPTY
        if n > self.size:
            raise ValueError(f"pop({n}) from a queue of {self.size}")
        h = self.head
        window = self.arr[h : h + n]
        if window.min() >= 0:  # no tombstone: the common case
            out = window.copy()
            window[:] = -1
            self.head = h + n
            self.pos[out] = -1
            self.size -= n
            return out
        w = n
        while True:
            window = self.arr[self.head : min(self.head + w, self.tail)]
            live = np.flatnonzero(window >= 0)
            if len(live) >= n or self.head + w >= self.tail:
                break
            w *= 2
        cut = int(live[n - 1]) + 1
        out = window[live[:n]].copy()
        self.arr[self.head : self.head + cut] = -1
        self.head += cut
        self.pos[out] = -1
        self.size -= n
        return out

    def peek(self, n: int) -> np.ndarray:
        """The first ``n`` live entries (at most ``size``), left in place: what ``pop(n)`` would
        return."""
        n = min(n, self.size)
        if n <= 0:
            return _EMPTY
        w = n
        while True:
            window = self.arr[self.head : min(self.head + w, self.tail)]
            live = window[window >= 0]
            if len(live) >= n or self.head + w >= self.tail:
                return live[:n]
            w *= 2

    def items(self) -> np.ndarray:
        """Live entries in queue order (head first)."""
        w = self.arr[self.head : self.tail]
        return w[w >= 0]

    def _compact(self, extra: int) -> None:
        live = self.items()
        need = len(live) + extra
        if need > len(self.arr) // 2:
            self.arr = np.full(max(2 * need, len(self.arr)), -1, dtype=np.int64)
        else:
            self.arr[:] = -1
        self.arr[: len(live)] = live
        self.pos[live] = np.arange(len(live))
        self.head = 0
        self.tail = len(live)


class FreeLists:
    """Several :class:`BlockQueue` of one pool; ``qid[b]`` names the queue block ``b`` is in
    (-1 when it is in use)."""

    def __init__(self, num_blocks: int, num_queues: int):
        self.pos = np.full(num_blocks, -1, dtype=np.int64)
        self.qid = np.full(num_blocks, -1, dtype=np.int8)
        self.queues = [BlockQueue(self.pos, num_blocks) for _ in range(num_queues)]
        self.size = 0

    def push(self, blocks: np.ndarray, qids: np.ndarray | int) -> None:
        """Append ``blocks`` (in order) to the tails of their queues."""
        if len(blocks) == 0:
            return
        if not (np.isscalar(qids) or np.ndim(qids) == 0) and qids.min() == qids.max():
            qids = qids[0]
        if np.isscalar(qids) or np.ndim(qids) == 0:
            q = int(qids)
            self.queues[q].append(blocks)
            self.qid[blocks] = q
        else:
            qids = np.asarray(qids)
            for q in np.unique(qids).tolist():
                sel = blocks[qids == q]
                self.queues[q].append(sel)
                self.qid[sel] = q
        self.size += len(blocks)

    def remove(self, blocks: np.ndarray) -> None:
        """Unlink free ``blocks`` from whatever queues hold them (a cache hit on a free block)."""
        if len(blocks) == 0:
            return
        q = self.qid[blocks]
        if (q < 0).any():
            raise AssertionError("removing a block that is not free")
        if (q == q[0]).all():
            self.queues[int(q[0])].remove(blocks)
        else:
            for v in np.unique(q).tolist():
                self.queues[v].remove(blocks[q == v])
        self.qid[blocks] = -1
        self.size -= len(blocks)

    def pop_plan(self, plan: list[tuple[int, int]]) -> np.ndarray:
        """Pop ``count`` blocks from queue ``q`` for each ``(q, count)`` in order, concatenated."""
        parts = [self.queues[q].pop(c) for q, c in plan if c > 0]
        if not parts:
            return _EMPTY
        out = parts[0] if len(parts) == 1 else np.concatenate(parts)
        self.qid[out] = -1
        self.size -= len(out)
        return out

    def peek_plan(self, plan: list[tuple[int, int]]) -> np.ndarray:
        """What :meth:`pop_plan` would return for ``plan``, without taking anything."""
        parts = [self.queues[q].peek(c) for q, c in plan if c > 0]
        if not parts:
            return _EMPTY
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def sizes(self) -> list[int]:
        return [q.size for q in self.queues]

    def members(self) -> np.ndarray:
        """Every free block, queue by queue, each in queue order."""
        parts = [q.items() for q in self.queues]
        return np.concatenate(parts) if parts else _EMPTY
