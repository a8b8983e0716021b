"""The bookkeeping shared by allocators that keep *counts*, not block ids.

Without prefix caching any free block serves any request equally, so the paged and elastic
allocators track only how many blocks each request holds and how many are free. They differ in
one rule, :meth:`CountingKV.blocks_needed`: how many blocks a request with ``s`` token slots holds
(paged: ``ceil(s / block_size)``; elastic: a base reservation grown in chunks). Everything else --
taking and returning blocks, the holders set, the count invariants -- lives here once.
"""

from __future__ import annotations

import numpy as np

from servesim.kv.base import NO_HIT, PrefixHit
from servesim.kv.steps import Holders


class CountingKV:
    def __init__(self, num_blocks: int, block_size: int, computed: np.ndarray, held_dtype=np.int64):
        self.num_blocks = int(num_blocks)
        self.block_size = int(block_size)
        self.free_blocks = int(num_blocks)
        self._computed = computed  # shared view of the request table's num_computed column
        self.held = np.zeros(len(computed), dtype=held_dtype)
        self.holders = Holders(len(computed))  # requests with held > 0 (for usage sums)

    def blocks_needed(self, slots: int) -> int:
        """Blocks a request holding ``slots`` token slots needs (scalar; subclasses decide)."""
        raise NotImplementedError

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self.free_blocks

    def reuse_prefix(self, rid: int, now: float) -> PrefixHit:
        """No prefix cache: nothing is reusable beyond what the request already computed."""
        return NO_HIT

    def allocate(self, rid: int, num_new: int) -> bool:
        """Make room for ``num_new`` more tokens of request ``rid``; False if the pool is short
        (then nothing changes)."""
        need = self.blocks_needed(int(self._computed[rid]) + num_new) - int(self.held[rid])
        if need <= 0:
            return True
        if need > self.free_blocks:
            return False
        if self.held[rid] == 0:
            self.holders.add(rid)
        self.held[rid] += need
        self.free_blocks -= need
        return True

    def free(self, rid: int) -> None:
        self.free_blocks += int(self.held[rid])
        self.held[rid] = 0
        self.holders.remove(rid)

    def check_counts(self) -> None:
        """Blocks held + free = total, and no count is negative."""
        held_total = int(self.held.sum())
        if held_total + self.free_blocks != self.num_blocks:
            raise AssertionError(
                f"KV invariant violated: held {held_total} + free {self.free_blocks} != total {self.num_blocks}")
        if self.free_blocks < 0 or (self.held < 0).any():
            raise AssertionError("KV invariant violated: negative block count")
