"""Vectorized arithmetic shared by the allocators: decode-run demand and the holder set.

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
``period`` steps. Step 1 is the policy's allocation, so it is never counted.
"""

from __future__ import annotations

import numpy as np


def run_demand(c: np.ndarray, k_max: int, threshold: int, period: int, chunk: int = 1) -> np.ndarray:
    """Blocks newly needed at decode steps ``j = 2..k_max`` (array of ``k_max - 1``) for requests
    with ``c`` computed tokens each (see module docstring)."""
    if k_max <= 1:
        return np.zeros(0, dtype=np.int64)
    x = np.asarray(c, dtype=np.int64) + 1  # c + j - 1 at j = 2
    if threshold == 0 or x.min() >= threshold:  # all periodic from step 2: residues (as paged)
        cnt = np.bincount((threshold - x) % period, minlength=period)
        per_step = cnt[_steps(k_max - 1) % period] if period > 1 else np.full(k_max - 1, cnt[0])
        return per_step * chunk if chunk != 1 else per_step
    first = np.where(x >= threshold, 2 + (threshold - x) % period, 2 + threshold - x)
    first = first[first <= k_max]
    length = k_max - 1  # index j - 2
    rows = -(-length // period)
    hist = np.bincount(first - 2, minlength=rows * period)[: rows * period]
    per_step = np.cumsum(hist.reshape(rows, period), axis=0).reshape(-1)[:length]
    return per_step * chunk


_ARANGE = np.arange(1 << 14, dtype=np.int64)


def _steps(n: int) -> np.ndarray:
    """``arange(n)``, cached for the engine's usual run lengths."""
    return _ARANGE[:n] if n <= len(_ARANGE) else np.arange(n, dtype=np.int64)


def touched_per_step(s1: np.ndarray, k: int, block_size: int) -> np.ndarray:
    """``sum(ceil(s_j / block_size))`` for ``s_j = s1 + j - 1``, ``j = 1..k``: blocks that hold at
    least one written slot, per step of a decode run."""
    bs = block_size
    base = int((-(-np.asarray(s1, dtype=np.int64) // bs)).sum())
    out = np.full(k, base, dtype=np.int64)
    if k > 1:
        out[1:] += np.cumsum(run_demand(np.asarray(s1) - 1, k, 0, bs))
    return out


def slack(slots: np.ndarray, block_size: int) -> int:
    """Unwritten slots in partly written blocks: ``sum((-s) mod block_size)``."""
    return int(((-np.asarray(slots, dtype=np.int64)) % block_size).sum())


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
        the compiled engine core working on ``PagedKV.held`` directly)."""
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
    bs = block_size
    c_all = computed[holders]
    used0 = int(c_all.sum())
    touched_all = int((-(-c_all // bs)).sum())
    if len(ids) == 0:
        return np.full(k, used0, dtype=np.int64), np.full(k, touched_all, dtype=np.int64)
    c = computed[ids]
    s1 = c + num_new
    used = used0 + int(num_new.sum()) + len(ids) * np.arange(k, dtype=np.int64)
    touched = touched_all - int((-(-c // bs)).sum()) + touched_per_step(s1, k, bs)
    return used, touched
