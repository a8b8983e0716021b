"""Decode-run demand and per-step slot sums for the Python KV managers, and the holder set.

Decode-run demand
-----------------
During a decode run every request in the batch gains one token slot per step. An allocator whose
holding grows by ``chunk`` blocks each time a request's slot count ``s`` passes
``threshold + m * period`` (m = 0, 1, ...) needs, at step ``j`` (slots ``c + j``), a new chunk for
every request with ``c + j - 1 >= threshold`` and ``(c + j - 1 - threshold) % period == 0``::

    paged    threshold 0,         period block_size,           chunk 1
    elastic  threshold base*bs,   period growth*bs,            chunk growth   (base held already)

:func:`run_demand` returns the blocks needed by steps ``2..k_max`` in O(n + k_max): each request's
first crossing step lands in a histogram, which a strided cumulative sum then repeats every
``period`` steps. Step 1 is the policy's allocation, so it is never counted. Both functions here
are array-returning faces of kernels in :mod:`servesim.kv.kernels` (one rule for the kernel
allocators and the prefix-caching manager).
"""

from __future__ import annotations

import numpy as np

from servesim.kv.kernels import run_demand_into, slots_per_step


def run_demand(c: np.ndarray, k_max: int, threshold: int, period: int, chunk: int = 1) -> np.ndarray:
    """Blocks newly needed at decode steps ``j = 2..k_max`` (array of ``k_max - 1``) for requests
    with ``c`` computed tokens each (see module docstring)."""
    if k_max <= 1:
        return np.zeros(0, dtype=np.int64)
    out = np.empty(k_max - 1, dtype=np.int64)
    run_demand_into(np.ascontiguousarray(c, dtype=np.int64), k_max, threshold, period, chunk, out)
    return out


class Holders:
    """The set of request ids holding KV memory, as a dense array (O(1) add/remove by swapping
    with the last entry), so per-step usage sums are one vectorized gather."""

    def __init__(self, n: int):
        self._arr = np.empty(16, dtype=np.int64)
        self._pos = np.full(n, -1, dtype=np.int32)
        self.size = 0

    def __contains__(self, rid: int) -> bool:
        return self._pos[rid] >= 0

    def add(self, rid: int) -> None:
        if self._pos[rid] >= 0:
            return
        if self.size == len(self._arr):
            self._arr = np.concatenate([self._arr, np.empty(len(self._arr), dtype=np.int64)])
        self._arr[self.size] = rid
        self._pos[rid] = self.size
        self.size += 1

    def remove(self, rid: int) -> None:
        i = int(self._pos[rid])
        if i < 0:
            return
        last = int(self._arr[self.size - 1])
        self._arr[i] = last
        self._pos[last] = i
        self._pos[rid] = -1
        self.size -= 1

    @property
    def ids(self) -> np.ndarray:
        return self._arr[: self.size]

    def reset(self, ids: np.ndarray) -> None:
        """Replace the set (for code that changed holdings without the manager's calls, such as
        the compiled engine core working on a pool's ``held`` directly)."""
        self._pos[self._arr[: self.size]] = -1
        ids = np.asarray(ids, dtype=np.int64)
        if len(ids) > len(self._arr):
            self._arr = np.empty(2 * len(ids), dtype=np.int64)
        self._arr[: len(ids)] = ids
        self._pos[ids] = np.arange(len(ids))
        self.size = len(ids)



def step_slots(computed: np.ndarray, holders: np.ndarray, ids: np.ndarray, num_new: np.ndarray,
               k: int, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Written slots and touched blocks per step of an iteration (``k == 1``) or decode run.

    Scheduled requests ``ids`` (all holders) write ``computed + num_new`` slots in step 1 and one
    more each later step; other holders keep ``computed``. Returns ``(used_slots[k],
    touched_blocks[k])`` summed over holders."""
    written, touched = np.empty(k, dtype=np.int64), np.empty(k, dtype=np.int64)
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    holders = np.ascontiguousarray(holders, dtype=np.int64)
    slots_per_step(computed, holders, len(holders), ids, np.ascontiguousarray(num_new, dtype=np.int64), len(ids),
                   k, block_size, written, touched)
    return written, touched
