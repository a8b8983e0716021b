"""Paged KV allocation (vLLM PagedAttention, SGLang): fixed-size blocks allocated as context grows.

A request whose KV occupies ``s`` token slots holds exactly ``ceil(s / block_size)`` blocks; the
last block is partly empty (internal fragmentation, at most ``block_size - 1`` slots). Without prefix
caching any free block is as good as any other, so this allocator keeps *counts* (blocks held per
request, blocks free) rather than block ids: O(1) per request and vectorizable over a decode batch.
The prefix-caching allocator, where block identity matters, tracks ids.

Token slots: during an iteration a request computing ``n`` new tokens on top of ``c`` computed
ones needs ``c + n`` slots. The last sampled token never needs a slot before it is fed back.

A decode run takes a new block at step ``j`` for every request with ``(c + j - 1) % block_size
== 0``. The rules are kernels (:mod:`servesim.kv.kernels`); this class is their Python face.
"""

from __future__ import annotations

import numpy as np

from servesim.kv.counting import KernelKV
from servesim.kv.kernels import PAGED, make_kv


class PagedKV(KernelKV):
    name = "paged"

    def __init__(self, num_blocks: int, block_size: int, computed: np.ndarray, pure: bool = False):
        super().__init__(make_kv(PAGED, num_blocks, block_size, len(computed)), computed, pure)

    def blocks_needed(self, slots: int) -> int:
        """``ceil(slots / block_size)``."""
        return int(self._k.kv_blocks_needed(self.state, slots))
