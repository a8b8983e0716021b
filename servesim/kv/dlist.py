"""Doubly linked lists over array indices: the one list rule of the prefix cache's structures.

The free-block queues (kv/pqueue.py), each request's own blocks (kv/pcache.py), each lower
tier's LRU order and the hot hashes missing from L1 (kv/ptiers.py, kv/pqueue.py) are FIFO lists
with O(1) append and O(1) removal from the middle. Each is a pair of link arrays (``nxt``,
``prv``: -1 ends a list) over the items (block ids, hash ids) and an ``ends`` array whose column
``k`` holds list ``k``'s head (row 0) and tail (row 1), -1 when empty::

    ends[:, k] = (3, 5)      3 ─► 9 ─► 5        nxt[3] = 9, nxt[9] = 5, nxt[5] = -1
                                                prv[5] = 9, prv[9] = 3, prv[3] = -1
"""

from __future__ import annotations

from servesim.jit import kernel


@kernel(inline=True)
def dl_append(nxt, prv, ends, k, x):
    """Append item ``x`` at the tail of list ``k``."""
    t = ends[1, k]
    prv[x] = t
    nxt[x] = -1
    if t >= 0:
        nxt[t] = x
    else:
        ends[0, k] = x
    ends[1, k] = x


@kernel(inline=True)
def dl_unlink(nxt, prv, ends, k, x):
    """Take item ``x`` out of list ``k`` (its links are left stale)."""
    p = prv[x]
    n = nxt[x]
    if p >= 0:
        nxt[p] = n
    else:
        ends[0, k] = n
    if n >= 0:
        prv[n] = p
    else:
        ends[1, k] = p
