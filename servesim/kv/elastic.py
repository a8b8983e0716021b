"""Elastic reservation (Spark): a base reservation per active sequence, grown in chunks on demand.

When a sequence starts it reserves ``base`` blocks at once, enough for a typical prompt plus some
output, so the common request never asks the pool again. When its context outgrows the base, the
reservation grows by ``growth`` blocks at a time; when the sequence ends (finishes or is
preempted) the whole reservation is released and the next sequence in that batch slot starts
again from the base. Blocks are paged underneath (no contiguity), so there is no external
fragmentation; the cost is *reservation waste*: reserved blocks not yet written::

    slots s:   0      1 .. base*bs     base*bs+1 .. (base+growth)*bs   ...
    held H(s): 0      base             base + growth                   base + 2*growth ...

    request with s = 9 slots, bs = 4, base = 4, growth = 2:
    [ab cd ef gh][i . . .][. . . .][. . . .]     written 9, internal 3, reserved-unused 8
     block 0     block 1   block 2  block 3

Like the paged allocator it keeps counts, not block ids, so every operation is O(1) per request
and a decode run's demand is one vectorized pass (:func:`servesim.kv.steps.run_demand` with
threshold ``base*bs``, period ``growth*bs`` and chunk ``growth``).
"""

from __future__ import annotations

import numpy as np

from servesim.kv.base import KVUsage
from servesim.kv.counting import CountingKV
from servesim.kv.frag import StepUsage
from servesim.kv.steps import run_demand, step_slots


class ElasticKV(CountingKV):
    name = "elastic"

    def __init__(self, num_blocks: int, block_size: int, computed: np.ndarray, base_blocks: int,
                 growth_blocks: int):
        if num_blocks < 1 or block_size < 1 or base_blocks < 1 or growth_blocks < 1:
            raise ValueError(f"need num_blocks, block_size, base_blocks, growth_blocks >= 1, got "
                             f"{num_blocks}, {block_size}, {base_blocks}, {growth_blocks}")
        super().__init__(num_blocks, block_size, computed, np.int32)
        self.base = int(base_blocks)
        self.growth = int(growth_blocks)

    # -- geometry -----------------------------------------------------------------------------
    def hold_for(self, slots):
        """Blocks reserved for a sequence of ``slots`` token slots (0 for 0), scalar or array."""
        s = np.asarray(slots, dtype=np.int64)
        base_slots = self.base * self.block_size
        grow = -(-np.maximum(s - base_slots, 0) // (self.growth * self.block_size))
        h = np.where(s > 0, self.base + self.growth * grow, 0)
        return int(h) if h.ndim == 0 else h

    def _hold_pos(self, s: np.ndarray) -> np.ndarray:
        """:meth:`hold_for` of positive slot counts (the decode path: no zero case)."""
        over = s - self.base * self.block_size
        p = self.growth * self.block_size
        return self.base + self.growth * (-(-np.maximum(over, 0) // p))

    def max_slots(self) -> int:
        """The longest sequence whose reservation fits the pool (0 if not even the base fits)."""
        if self.num_blocks < self.base:
            return 0
        return (self.base + (self.num_blocks - self.base) // self.growth * self.growth) * self.block_size

    # -- allocation -----------------------------------------------------------------------------
    def blocks_needed(self, slots: int) -> int:
        """:meth:`hold_for` of one slot count, in scalars (the admission path)."""
        if slots <= 0:
            return 0
        over = slots - self.base * self.block_size
        return self.base + (self.growth * (-(-over // (self.growth * self.block_size))) if over > 0 else 0)

    def allocate_decodes(self, ids: np.ndarray) -> bool:
        if len(ids) == 0:
            return True
        need = self._hold_pos(self._computed[ids] + 1) - self.held[ids]
        if need.max() <= 0:
            return True
        need = np.maximum(need, 0)
        total = int(need.sum())
        if total > self.free_blocks:
            return False
        self.held[ids] += need
        self.free_blocks -= total
        return True

    # -- decode runs ----------------------------------------------------------------------------
    def _run_used(self, ids: np.ndarray, k_max: int) -> np.ndarray:
        used = np.full(k_max, self.num_blocks - self.free_blocks, dtype=np.int64)
        if k_max > 1:
            d = run_demand(self._computed[ids], k_max, self.base * self.block_size,
                           self.growth * self.block_size, self.growth)
            used[1:] += np.cumsum(d)
        return used

    def decode_run(self, ids: np.ndarray, k_max: int) -> tuple[int, np.ndarray]:
        """As :meth:`PagedKV.decode_run`, with growth chunks instead of single blocks."""
        if k_max <= 1:
            return k_max, np.full(k_max, self.num_blocks - self.free_blocks, dtype=np.int64)
        used = self._run_used(ids, k_max)
        k = int(np.searchsorted(used, self.num_blocks, side="right"))
        return k, used[:k]

    def commit_decodes(self, ids: np.ndarray) -> None:
        extra = self._hold_pos(self._computed[ids]) - self.held[ids]
        if extra.max() > 0:
            extra = np.maximum(extra, 0)
            self.held[ids] += extra
            self.free_blocks -= int(extra.sum())

    # -- metrics ----------------------------------------------------------------------------------
    def step_usage(self, ids: np.ndarray, num_new: np.ndarray, k: int = 1,
                   used: np.ndarray | None = None) -> StepUsage:
        bs = self.block_size
        slots, touched = step_slots(self._computed, self.holders.ids, ids, num_new, k, bs)
        if used is None:
            used = self._run_used(ids, k)
        alloc = np.asarray(used[:k], dtype=np.int64) * bs
        return StepUsage(total_slots=self.num_blocks * bs, allocated=alloc, used=slots,
                         reserved_unused=alloc - touched * bs, external=np.zeros(k, dtype=np.int64))

    def usage(self) -> KVUsage:
        bs = self.block_size
        c = self._computed[self.holders.ids]
        alloc = int(self.held.sum()) * bs
        touched = int((-(-c // bs)).sum()) * bs
        free = self.free_blocks * bs
        return KVUsage(total_slots=self.num_blocks * bs, allocated_slots=alloc, used_slots=int(c.sum()),
                       reserved_unused_slots=alloc - touched, largest_free_extent=free, free_slots=free)

    def check(self) -> None:
        self.check_counts()
        h = self.holders.ids
        if (self.held[h] < self.hold_for(self._computed[h])).any():
            raise AssertionError("KV invariant violated: a sequence holds less than its reservation")
