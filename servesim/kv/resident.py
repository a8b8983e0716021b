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

Compiled, a call takes the pool's StructRef (the engine's ``kkv``: one pointer, ~4 us a call on
the project's VM against ~50 us for the same walk in numpy); an uncompiled engine's router calls
``jit.pure(px_resident)`` on its ``KVState``.

The lookup's other conditions (a fetch only when the pool can hold the whole prefill, a hit
evicted before the request is scheduled) are the engine's at lookup time, not the router's: the
answer is what is resident at the routing instant.
"""

from __future__ import annotations

from servesim.jit import kernel
from servesim.kv.pcache import _chain_len
from servesim.kv.ptiers import tier_of


@kernel
def px_resident(kv, rid):
    """``(l1, total)``: the leading blocks of ``rid``'s chain that ``kv`` (a prefix-cache pool,
    ``prefix`` 1) holds in L1, and in L1 followed by its lower tiers -- the run ``px_lookup`` walks
    (its ``_chain_len`` bound, the cache map, then ``tier_of`` until a block is in neither or back
    in L1). Reads only; O(the run + 1)."""
    n = _chain_len(kv, rid)
    if n <= 0:
        return 0, 0
    a = kv.off[rid]
    chain, cache_blk = kv.chain, kv.cache_blk
    m = 0
    while m < n and cache_blk[chain[a + m]] >= 0:
        m += 1
    w = m
    if kv.t_cap.shape[0]:
        t_in = kv.t_in
        while w < n:
            h = chain[a + w]
            if cache_blk[h] >= 0 or tier_of(t_in, h) < 0:
                break
            w += 1
    return m, w
