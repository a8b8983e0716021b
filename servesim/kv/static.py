"""Static contiguous reservation: the pre-paging baseline (FasterTransformer, Orca).

An admitted request reserves its whole maximum sequence length at once, as one contiguous extent
of the pool (in units of ``block_size`` slots; ``block_size: 1`` gives token granularity). It
never asks again; the extent is released when the request finishes or is preempted. The pool is a
real address space (:mod:`~servesim.kv.extents`, first or best fit), so all three kinds of waste
of the vLLM paper's Figure 2 appear::

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
bounded by the reservations' ends, which admission control makes unreachable. The rules are
kernels (:mod:`servesim.kv.kernels`); this class is their Python face.
"""

from __future__ import annotations

import numpy as np

from servesim.kv.counting import KernelKV
from servesim.kv.extents import ExtentAllocator
from servesim.kv.base import KVUsage
from servesim.kv.kernels import STATIC, make_kv


class StaticKV(KernelKV):
    name = "static"

    def __init__(self, num_blocks: int, block_size: int, computed: np.ndarray, reserve_tokens: np.ndarray,
                 fit: str = "first", pure: bool = False):
        """``reserve_tokens[rid]``: slots request ``rid`` reserves on admission."""
        if fit not in ("first", "best"):
            raise ValueError(f"fit {fit!r} is not 'first' or 'best'")
        state = make_kv(STATIC, num_blocks, block_size, len(computed), reserve_tokens=reserve_tokens, fit=fit)
        super().__init__(state, computed, pure)
        self.extents = ExtentAllocator.view(state, pure)

    @property
    def reserve(self) -> np.ndarray:
        """Blocks each request reserves on admission (int32)."""
        return self.state.reserve

    @property
    def start(self) -> np.ndarray:
        """First block of each request's reservation (-1: none)."""
        return self.state.start

    @property
    def next_need(self) -> int:
        """Blocks of the latest reservation attempt (what external fragmentation is measured against)."""
        return int(self.state.s[0].next_need)

    @property
    def failed(self) -> int:
        """Allocation attempts that found no hole (with enough free blocks: fragmentation)."""
        return int(self.state.s[0].failed)

    def capacity_of(self, rid: int) -> int:
        return int(self.state.held[rid]) * self.block_size

    def external_slots(self) -> int:
        return self.extents.unusable(self.next_need) * self.block_size

    def usage(self) -> KVUsage:
        total, alloc, used, reserved, largest, free, external = (int(x) for x in self._usage_numbers())
        return KVUsage(total_slots=total, allocated_slots=alloc, used_slots=used, reserved_unused_slots=reserved,
                       largest_free_extent=largest, free_slots=free, external_slots=external)
