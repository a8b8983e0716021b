"""The KV manager contract: the only owner of KV blocks.

Policies ask; they never touch blocks. The engine advances decode runs through the same calls.
The paged, static and elastic allocators and the prefix cache (with its tiers and preload)
implement them as kernels over one pool state (kv/kernels.py: ``kv_allocate(kv, computed, rid, n)``
and so on; kv/pcache.py). The Python reference prefix cache (tests/reference_kv/prefix.py), kept for the kernels'
equivalence tests, implements them as an object whose methods the engine binds in place of the
kernels::

    name, prefix_caching          the allocator's name; whether it is a prefix cache (block ids and
                                  hashes: hit rates and tier traffic to report)
    num_blocks, block_size        pool geometry (blocks of ``block_size`` token slots)
    free_blocks                   blocks an allocation could take right now (free + evictable)
    used_blocks                   blocks holding live KV of requests
    max_slots()                   the most token slots one request can ever hold (admission check)
    reuse_prefix(rid, now)        before a waiting request is considered: how many of its known
                                  tokens already have KV it can reuse (prefix cache, or its own
                                  swapped-out KV); sets ``computed[rid]`` to that count and
                                  returns a PrefixHit (tokens, and the time a lower-tier copy will
                                  have reached the GPU, if any). 0 tokens for plain allocators.
    allocate(rid, num_new)        room for ``num_new`` more tokens on top of ``computed[rid]``;
                                  False if the pool cannot provide it (nothing changes then)
    allocate_decodes(ids)         one more token for each of ``ids``, all or nothing
    free(rid)                     the request finished or was preempted: release (or cache) its blocks
    decode_run(ids, k_max)        the engine's fast path: how many more decode steps of ``ids`` the
                                  pool can serve (step 1 already allocated), and blocks in use per step
    commit_decodes(ids)           after a run advanced ``computed[ids]``, take the blocks it used
    stable_steps(ids, k)          of a fast-path run's ``k`` steps, how many can run before a policy
                                  decision could differ (all ``k`` but for the prefix cache, which
                                  cuts before an eviction that changes a blocked request's lookup)
    check()                       invariants (raise AssertionError); called when invariants are on
    step_usage(ids, new, k, used) token slots of the pool during each of the next ``k`` steps
                                  (a StepUsage: fragmentation metrics, servesim/kv/frag.py)

Token slots: a request computing ``n`` new tokens on top of ``c`` computed needs ``c + n`` slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from servesim.kv.frag import StepUsage


@dataclass(frozen=True)
class PrefixHit:
    tokens: int = 0  # known tokens whose KV is reusable (computed[rid] is set to this)
    ready_at: float = 0.0  # when the reusable KV is on the GPU (> now: a tier transfer is under way)


NO_HIT = PrefixHit()


class KVManager(Protocol):
    name: str
    prefix_caching: bool
    num_blocks: int
    block_size: int
    free_blocks: int

    @property
    def used_blocks(self) -> int: ...

    def max_slots(self) -> int: ...

    def reuse_prefix(self, rid: int, now: float) -> PrefixHit: ...

    def allocate(self, rid: int, num_new: int) -> bool: ...

    def allocate_decodes(self, ids: np.ndarray) -> bool: ...

    def free(self, rid: int) -> None: ...

    def decode_run(self, ids: np.ndarray, k_max: int) -> tuple[int, np.ndarray]: ...

    def commit_decodes(self, ids: np.ndarray) -> None: ...

    def stable_steps(self, ids: np.ndarray, k: int) -> int: ...

    def check(self) -> None: ...

    def step_usage(self, ids: np.ndarray, num_new: np.ndarray, k: int = 1,
                   used: np.ndarray | None = None) -> "StepUsage": ...
