"""The KV manager contract: the only owner of KV blocks.

Policies ask; they never touch blocks. The engine advances decode runs through the same object.
Every allocator (paged, static reservation, elastic, prefix caching, tiered) implements this::

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
    usage()                       a KVUsage snapshot for fragmentation metrics

Token slots: a request computing ``n`` new tokens on top of ``c`` computed needs ``c + n`` slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class PrefixHit:
    tokens: int = 0  # known tokens whose KV is reusable (computed[rid] is set to this)
    ready_at: float = 0.0  # when the reusable KV is on the GPU (> now: a tier transfer is under way)


NO_HIT = PrefixHit()


@dataclass(frozen=True)
class KVUsage:
    """Token-slot accounting at one instant, for fragmentation metrics (see docs/kv.md)."""

    total_slots: int  # num_blocks * block_size
    allocated_slots: int  # slots in blocks held by requests (or reserved for them)
    used_slots: int  # slots holding KV of computed tokens
    reserved_unused_slots: int  # reserved ahead of need (static/elastic reservations), never yet written
    largest_free_extent: int  # largest contiguous free run, in slots (== free slots when paged)
    free_slots: int
    external_slots: int = 0  # free slots that cannot hold the next allocation (extents; 0 when paged)


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

    def usage(self) -> KVUsage: ...
