"""The prefix cache's invariants (kv/pcache.py's pool), as a code, and their texts."""

from __future__ import annotations

import numpy as np

from servesim.jit import kernel
from servesim.kv.pcache import px_table
from servesim.kv.ptiers import tiers_check
from servesim.kv.radix import rx_check
from servesim.kv.runs import blocks_for

# px_check codes (kernels.check_message gives the text)
NEG_REF = 30  # a negative ref count
FREE_STATE = 31  # a block is both in use and free, or neither
QUEUE_SIZES = 32  # free queue sizes disagree with the free count or the queues' contents
REF_TABLES = 33  # ref counts differ from the block tables
TWICE = 34  # a request holds a block twice
UNDER_HELD = 35  # a request holds fewer blocks than its tokens need
CACHE_MAP = 36  # the cache map and the blocks' hashes disagree
RADIX_TREE = 37  # sglang: a hash's cached-children count disagrees with the cache map


@kernel
def px_check(kv, computed):
    """0, or the first violated invariant's code (NEG_REF .. CACHE_MAP, or a tier code)."""
    nb = kv.num_blocks
    if kv.counted:  # (kv/pcache.py, chainless pools: counts, no block ids)
        total = 0
        for i in range(kv.ps[0].n_hold):
            r = kv.h_arr[i]
            total += kv.held[r]
            if kv.held[r] < blocks_for(np.int64(computed[r]), kv.block_size):
                return UNDER_HELD
        return 0 if total + kv.s[0].free == nb else REF_TABLES
    for b in range(nb):
        if kv.ref[b] < 0:
            return NEG_REF
        if (kv.ref[b] > 0) == (kv.qid[b] >= 0):
            return FREE_STATE
    total = 0
    for q in range(kv.qends.shape[1]):
        n = 0
        b = kv.qends[0, q]
        while b >= 0 and n <= nb:
            if kv.qid[b] != q:
                return QUEUE_SIZES
            n += 1
            b = kv.qnext[b]
        if n != kv.qsize[q]:
            return QUEUE_SIZES
        total += n
    if total != kv.s[0].free:
        return QUEUE_SIZES
    refs = np.zeros(nb, dtype=np.int64)
    seen = np.full(nb, -1, dtype=np.int64)
    table = np.empty(nb + 1, dtype=np.int64)
    for i in range(kv.ps[0].n_hold):
        r = kv.h_arr[i]
        n = px_table(kv, r, table)
        if n != kv.held[r]:
            return REF_TABLES
        for j in range(n):
            if seen[table[j]] == r:
                return TWICE
            seen[table[j]] = r
            refs[table[j]] += 1
        if kv.held[r] < blocks_for(np.int64(computed[r]), kv.block_size):
            return UNDER_HELD
    for b in range(nb):
        if refs[b] != kv.ref[b]:
            return REF_TABLES
        h = kv.bhash[b]
        if h >= 0 and kv.cache_blk[h] != b:
            return CACHE_MAP
    for h in range(kv.cache_blk.shape[0]):
        b = kv.cache_blk[h]
        if b >= 0 and kv.bhash[b] != h:
            return CACHE_MAP
    if not rx_check(kv):
        return RADIX_TREE
    return tiers_check(kv)


def check_text(code: int) -> str | None:
    """The AssertionError text of a px_check code (None: not one of its codes)."""
    from servesim.kv import ptiers

    return {
        NEG_REF: "KV invariant violated: negative ref count",
        FREE_STATE: "KV invariant violated: a block is both in use and free, or neither",
        QUEUE_SIZES: "KV invariant violated: free queue sizes disagree",
        REF_TABLES: "KV invariant violated: ref counts differ from block tables",
        TWICE: "KV invariant violated: a request holds a block twice",
        UNDER_HELD: "KV invariant violated: a request holds fewer blocks than its tokens need",
        CACHE_MAP: "KV invariant violated: cache map and hashed blocks disagree",
        RADIX_TREE: "KV invariant violated: the radix tree's child counts disagree with the cache map",
        ptiers.TIER_FLOW: "KV tier invariant violated: blocks sent down a level != stored + refreshed there",
        ptiers.TIER_DROPPED: "KV tier invariant violated: the last tier's evictions != blocks dropped",
        ptiers.TIER_CAPACITY: "KV tier invariant violated: a tier holds more blocks than its capacity",
        ptiers.TIER_COUNT: "KV tier invariant violated: a tier's inserted - evicted != blocks held",
        ptiers.TIER_ORDER: "KV tier invariant violated: a shared link saw a fetch requested before one already "
                           "served (the replicas' fetches were not in time order)",
    }.get(code)
