"""Static contiguous reservation: the pre-paging baseline (FasterTransformer, Orca).

An admitted request reserves its whole maximum sequence length at once, as one contiguous extent
of the pool (in units of ``block_size`` slots; ``block_size: 1`` gives token granularity). It
never asks again; the extent is released when the request finishes or is preempted. The pool is a
real address space (:class:`~servesim.kv.extents.ExtentAllocator`, first or best fit), so all
three kinds of waste of the vLLM paper's Figure 2 appear::

    reserve = max_model_len = 8 blocks, request with 9 written slots, bs = 4:
    [abcd][efgh][i...][....][....][....][....][....]   used 9, internal 3, reservation 20
                                                        (20 reserved slots never written yet)
    pool: [ A A A A A A A A | . . . . . | B B B B B B B B | . . . ]  free 8 blocks in two holes
          a new 8-block reservation fits in neither: 8 free blocks are external fragmentation

``reserve``: ``max_model_len`` (every request reserves the engine's limit: the classic) or
``request`` (prompt + output: a client that sets ``max_tokens`` to exactly what it will generate;
reservations then differ in size, which is what fragments the pool).

External fragmentation is measured against the *next* reservation: free slots in holes smaller
than it. The next size is the reservation of the latest allocation attempt (with ``reserve:
max_model_len``, always the same size).

Decodes never allocate (they write into the reservation), so the fast path's run length is only
bounded by the reservations' ends, which admission control makes unreachable.
"""

from __future__ import annotations

import numpy as np

from servesim.kv.base import NO_HIT, KVUsage, PrefixHit
from servesim.kv.extents import ExtentAllocator
from servesim.kv.frag import ExtentUsage, StepUsage
from servesim.kv.steps import Holders, step_slots


class StaticKV:
    name = "static"

    def __init__(self, num_blocks: int, block_size: int, computed: np.ndarray, reserve_tokens: np.ndarray,
                 fit: str = "first"):
        """``reserve_tokens[rid]``: slots request ``rid`` reserves on admission."""
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = int(num_blocks)
        self.block_size = int(block_size)
        self._computed = computed
        self.reserve = (-(-np.asarray(reserve_tokens, dtype=np.int64) // block_size)).astype(np.int32)  # blocks
        self.extents = ExtentAllocator(num_blocks, fit)
        self.start = np.full(len(computed), -1, dtype=np.int32)
        self.held = np.zeros(len(computed), dtype=np.int32)
        self.holders = Holders(len(computed))
        big = self.reserve[self.reserve <= self.num_blocks]
        self.next_need = int(big.min()) if len(big) else self.num_blocks + 1
        self.failed = 0  # allocation attempts that found no hole (with enough free blocks: fragmentation)

    @property
    def free_blocks(self) -> int:
        return self.extents.free

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self.extents.free

    def max_slots(self) -> int:
        """A request is admissible when its reservation fits the empty pool (the engine rejects
        ``total - 1 > max_slots()``); with uniform reservations larger than the pool nothing is."""
        if (self.reserve > self.num_blocks).all():
            return 0
        return self.num_blocks * self.block_size - 1

    def capacity_of(self, rid: int) -> int:
        return int(self.held[rid]) * self.block_size

    # -- allocation -------------------------------------------------------------------------------
    def reuse_prefix(self, rid: int, now: float) -> PrefixHit:
        return NO_HIT

    def allocate(self, rid: int, num_new: int) -> bool:
        slots = int(self._computed[rid]) + num_new
        if self.held[rid] == 0:
            n = int(self.reserve[rid])
            self.next_need = n
            if n > self.num_blocks or slots > n * self.block_size:
                return False
            start = self.extents.alloc(n)
            if start < 0:
                self.failed += 1
                return False
            self.start[rid] = start
            self.held[rid] = n
            self.holders.add(rid)
        return slots <= self.held[rid] * self.block_size

    def allocate_decodes(self, ids: np.ndarray) -> bool:
        return bool((self._computed[ids] + 1 <= self.held[ids] * self.block_size).all())

    def free(self, rid: int) -> None:
        if self.held[rid]:
            self.extents.release(int(self.start[rid]), int(self.held[rid]))
            self.held[rid] = 0
            self.start[rid] = -1
            self.holders.remove(rid)

    def decode_run(self, ids: np.ndarray, k_max: int) -> tuple[int, np.ndarray]:
        """Step ``j`` needs ``computed + j`` slots inside each reservation."""
        used = self.num_blocks - self.extents.free
        if k_max >= 1 and len(ids):
            room = int((self.held[ids] * self.block_size - self._computed[ids]).min())
            k_max = max(1, min(k_max, room))
        return k_max, np.full(k_max, used, dtype=np.int64)

    def commit_decodes(self, ids: np.ndarray) -> None:
        """Nothing to take: decodes write into the reservation."""

    # -- metrics ----------------------------------------------------------------------------------
    def external_slots(self) -> int:
        return self.extents.unusable(self.next_need) * self.block_size

    def step_usage(self, ids: np.ndarray, num_new: np.ndarray, k: int = 1,
                   used: np.ndarray | None = None) -> StepUsage:
        bs = self.block_size
        slots, touched = step_slots(self._computed, self.holders.ids, ids, num_new, k, bs)
        alloc = np.full(k, (self.num_blocks - self.extents.free) * bs, dtype=np.int64)
        return StepUsage(total_slots=self.num_blocks * bs, allocated=alloc, used=slots,
                         reserved_unused=alloc - touched * bs,
                         external=np.full(k, self.external_slots(), dtype=np.int64))

    def usage(self) -> KVUsage:
        bs = self.block_size
        c = self._computed[self.holders.ids]
        alloc = (self.num_blocks - self.extents.free) * bs
        touched = int((-(-c // bs)).sum()) * bs
        return ExtentUsage(total_slots=self.num_blocks * bs, allocated_slots=alloc, used_slots=int(c.sum()),
                           reserved_unused_slots=alloc - touched, largest_free_extent=self.extents.largest * bs,
                           free_slots=self.extents.free * bs, external_slots=self.external_slots())

    def check(self) -> None:
        self.extents.check()
        if int(self.held.sum()) + self.extents.free != self.num_blocks:
            raise AssertionError("KV invariant violated: reserved + free != total")
        h = self.holders.ids
        if (self._computed[h] > self.held[h] * self.block_size).any():
            raise AssertionError("KV invariant violated: a request wrote past its reservation")
        # live extents must not overlap each other
        order = np.argsort(self.start[h])
        s, n = self.start[h][order], self.held[h][order]
        if len(s) > 1 and (s[1:] < s[:-1] + n[:-1]).any():
            raise AssertionError("KV invariant violated: overlapping reservations")
