"""Read-only: how much of a request's prefix a prefix-cache pool holds now (for routers).

A fleet's prefix-aware router (engine/prefix_router.py) asks each candidate replica how many
leading blocks of a request's chain its pool would hit if the request arrived there now. The
answer is read from the pool's own structures (kv/pstate.py): the request's chain of hash ids
(``chain[off[rid]:]``, bounded by the lookup's own rule, pcache ``_chain_len``), looked up in the
cache map ``cache_blk`` (L1: a block in use or cached-free), then, where the L1 run ends, in the
lower tiers' membership ``t_in`` (kv/ptiers.py ``tier_of``) -- the run :func:`px_lookup` would
take, L1 first, then what a fetch would bring. Nothing is scanned but the request's own chain,
and nothing is written: no hit is counted, no LRU order moves (as a router's read of a cache
index, llm-d's KV-block index for instance, touches nothing in the engine).

The lookup's other conditions (a fetch only when the pool can hold the whole prefill, a hit
evicted before the request is scheduled) are the engine's at lookup time, not the router's: the
answer is what is resident at the routing instant.
"""

from __future__ import annotations

import numpy as np

from servesim.jit import pure
from servesim.kv.pcache import _chain_len

_chain = pure(_chain_len)


def resident_blocks(kv, rid: int) -> tuple[int, int]:
    """``(l1, total)``: the leading blocks of ``rid``'s chain that ``kv`` (a prefix-cache pool's
    state, ``prefix`` 1) holds in L1, and in L1 followed by its lower tiers. ``(0, 0)`` for a
    pool without a prefix cache. Cost: O(1) when the first block misses, else O(chain) in numpy."""
    if not kv.prefix:
        return 0, 0
    n = int(_chain(kv, rid))
    if n <= 0:
        return 0, 0
    a = int(kv.off[rid])
    chain, cache_blk = kv.chain, kv.cache_blk
    tiers = kv.t_cap.shape[0] > 0
    h0 = chain[a]
    if cache_blk[h0] < 0 and not (tiers and kv.t_in[:, h0].any()):
        return 0, 0  # (most candidates of a request: one read)
    ids = chain[a:a + n]
    in_l1 = cache_blk[ids] >= 0
    m = n if in_l1.all() else int(np.argmin(in_l1))
    if not tiers or m == n:
        return m, m
    rest = ids[m:]
    below = ~in_l1[m:] & kv.t_in[:, rest].any(axis=0)  # (the fetch stops at a block back in L1)
    w = len(rest) if below.all() else int(np.argmin(below))
    return m, m + w
