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
and a decode run's demand is one pass over first crossings (threshold ``base*bs``, period
``growth*bs``, chunk ``growth``; :mod:`servesim.kv.kernels`, whose Python face this class is).
"""

from __future__ import annotations

import numpy as np

from servesim.kv.counting import KernelKV
from servesim.kv.kernels import ELASTIC, make_kv


class ElasticKV(KernelKV):
    name = "elastic"

    def __init__(self, num_blocks: int, block_size: int, computed: np.ndarray, base_blocks: int,
                 growth_blocks: int, pure: bool = False):
        state = make_kv(ELASTIC, num_blocks, block_size, len(computed), base_blocks=base_blocks,
                        growth_blocks=growth_blocks)
        super().__init__(state, computed, pure)

    @property
    def base(self) -> int:
        return self.state.base

    @property
    def growth(self) -> int:
        return self.state.growth

    def blocks_needed(self, slots: int) -> int:
        """Blocks reserved for a sequence of ``slots`` token slots (0 for 0)."""
        return int(self._k.kv_blocks_needed(self.state, int(slots)))

    def hold_for(self, slots):
        """:meth:`blocks_needed`, of a scalar or elementwise of an array."""
        if np.ndim(slots) == 0:
            return self.blocks_needed(slots)
        s = np.asarray(slots)
        return np.array([self.blocks_needed(x) for x in s.ravel()], dtype=np.int64).reshape(s.shape)
