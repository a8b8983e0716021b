"""Paged KV allocation (vLLM PagedAttention, SGLang): fixed-size blocks allocated as context grows.

A request whose KV occupies ``s`` token slots holds exactly ``ceil(s / block_size)`` blocks; the
last block is partly empty (internal fragmentation, at most ``block_size - 1`` slots). Without prefix
caching any free block is as good as any other, so this allocator keeps *counts* (blocks held per
request, blocks free) rather than block ids: O(1) per request and vectorizable over a decode batch.
The prefix-caching allocator, where block identity matters, tracks ids.

Token slots: during an iteration a request computing ``n`` new tokens on top of ``c`` computed
ones needs ``c + n`` slots. The last sampled token never needs a slot before it is fed back.
"""

from __future__ import annotations

import numpy as np

from servesim.kv.base import KVUsage
from servesim.kv.counting import CountingKV
from servesim.kv.frag import StepUsage
from servesim.kv.steps import run_demand


class PagedKV(CountingKV):
    name = "paged"

    def __init__(self, num_blocks: int, block_size: int, computed: np.ndarray):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        super().__init__(num_blocks, block_size, computed, np.int64)

    # -- queries ----------------------------------------------------------------------------
    def blocks_needed(self, slots: int) -> int:
        return -(-slots // self.block_size)

    def blocks_for(self, slots):
        return -(-slots // self.block_size)

    def max_slots(self) -> int:
        """The most token slots one request can ever hold (the whole pool)."""
        return self.num_blocks * self.block_size

    def used_slots_of(self, ids: np.ndarray) -> np.ndarray:
        return self._computed[ids]

    # -- allocation -------------------------------------------------------------------------
    def allocate_decodes(self, ids: np.ndarray) -> bool:
        """One more token for each of ``ids``, all or nothing."""
        if len(ids) == 0:
            return True
        want = -(-(self._computed[ids] + 1) // self.block_size)
        need = want - self.held[ids]
        total = int(need.sum())  # need is 0 or 1 for requests allocated exactly so far
        if total > self.free_blocks:
            return False
        if total:
            self.held[ids] = np.maximum(self.held[ids], want)
            self.free_blocks -= total
        return True

    # -- decode runs (the engine's fast path) -------------------------------------------------
    def decode_run(self, ids: np.ndarray, k_max: int) -> tuple[int, np.ndarray]:
        """How many consecutive decode steps of ``ids`` fit, and blocks in use during each.

        Step 1 is already allocated (the policy did it). Step ``j`` needs ``c + j`` slots for a
        request with ``c`` computed tokens, so it takes a new block exactly when
        ``(c + j - 1) % block_size == 0``: the new blocks of step ``j`` are the number of requests
        with ``(1 - c) mod block_size == j mod block_size``. Returns ``k <= k_max`` such that steps
        ``2..k`` all get their blocks, and ``used[j-1]`` = blocks in use during step ``j``.
        """
        bs = self.block_size
        used0 = self.num_blocks - self.free_blocks
        if k_max <= 1:
            return k_max, np.full(k_max, used0, dtype=np.int64)
        c = self._computed[ids]
        if bs == 1:
            per_step = np.full(k_max - 1, len(ids), dtype=np.int64)
        else:
            residue_count = np.bincount((1 - c) % bs, minlength=bs)
            per_step = residue_count[np.arange(2, k_max + 1) % bs]
        demand = np.cumsum(per_step)  # blocks needed by steps 2..j, j = 2..k_max
        if demand[-1] <= self.free_blocks:
            k = k_max
        else:
            k = int(np.searchsorted(demand, self.free_blocks, side="right")) + 1
            demand = demand[: k - 1]
        used = np.empty(k, dtype=np.int64)
        used[0] = used0
        used[1:] = used0 + demand
        return k, used

    def commit_decodes(self, ids: np.ndarray) -> None:
        """After a decode run advanced ``computed``, take the blocks its steps used."""
        want = -(-self._computed[ids] // self.block_size)
        extra = want - self.held[ids]
        self.held[ids] = want
        self.free_blocks -= int(extra.sum())

    def step_usage(self, ids: np.ndarray, num_new: np.ndarray, k: int = 1,
                   used: np.ndarray | None = None) -> StepUsage:
        """Slot accounting during each of the ``k`` steps that ``ids`` are about to run (called
        after the policy's allocation, before ``computed`` advances; ``k > 1``: a decode run, with
        ``used`` from :meth:`decode_run` when at hand). See :mod:`servesim.kv.frag`.

        Paged blocks are allocated exactly as slots are needed, so every held block is touched:
        nothing is reserved unused, and internal slots = allocated - written. Written slots grow by
        one per scheduled request each step of a run (the compiled core uses the same sums)."""
        bs = self.block_size  # holders: kept by allocate/free (resync with holders.reset after compiled code)
        if used is None:
            used = np.full(k, self.num_blocks - self.free_blocks, dtype=np.int64)
            if k > 1:
                used[1:] += np.cumsum(run_demand(self._computed[ids], k, 0, bs))
        alloc = np.asarray(used[:k], dtype=np.int64) * bs
        written0 = int(self._computed[self.holders.ids].sum()) + int(num_new.sum())
        slots = written0 + len(ids) * np.arange(k, dtype=np.int64)
        zeros = np.zeros(k, dtype=np.int64)
        return StepUsage(total_slots=self.num_blocks * bs, allocated=alloc, used=slots,
                         reserved_unused=zeros, external=zeros)

    def usage(self) -> KVUsage:
        held = int(self.held.sum())
        bs = self.block_size
        alloc = held * bs
        used = int(self._computed[self.held > 0].sum())  # a snapshot: robust to the compiled core
        free = self.free_blocks * bs
        return KVUsage(total_slots=self.num_blocks * bs, allocated_slots=alloc, used_slots=used,
                       reserved_unused_slots=0, largest_free_extent=free, free_slots=free)

    # -- invariants -------------------------------------------------------------------------
    def check(self) -> None:
        """Blocks in use + free = total; no negative counts."""
        self.check_counts()