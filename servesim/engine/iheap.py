"""An indexed binary min-heap as kernels, written once for the fleet's two heaps.

The fleet keys two sets by time and must move any member's key in place: the replicas whose
tokens change with time alone, by their next step end (engine/load_kernels.py), and the engines
of the compiled routed loop, by their next event (engine/fleet_loop.py). ``heapq`` over tuples
cannot move an entry (the Python loops push a new one and skip stale pops); an indexed heap can,
so each set keeps exactly one entry a member and never grows past its size.

A heap is three arrays and a length: ``key[i]`` member ``i``'s key (float64; inf: not in the
heap), ``heap[:n]`` the members in heap order, ``hpos[i]`` member ``i``'s place (-1: none).
Members are ordered by ``(key[i], i)``: equal keys go to the lower id, as ``heapq`` orders the
Python loops' ``(key, id)`` tuples, so the order is total and the heap's top never depends on
the order of earlier updates.
"""

from __future__ import annotations

import numpy as np

from servesim.jit import kernel


@kernel(inline=True)
def iheap_less(key, a, b):
    """Member ``a`` comes before member ``b``: ``(key[a], a) < (key[b], b)``."""
    return key[a] < key[b] or (key[a] == key[b] and a < b)


@kernel(inline=True)
def iheap_up(key, heap, hpos, i):
    """The member at place ``i`` moves up to its place."""
    e = heap[i]
    while i > 0:
        p = (i - 1) >> 1
        q = heap[p]
        if not iheap_less(key, e, q):
            break
        heap[i] = q
        hpos[q] = i
        i = p
    heap[i] = e
    hpos[e] = i


@kernel(inline=True)
def iheap_down(key, heap, hpos, i, n):
    """The member at place ``i`` moves down to its place in ``heap[:n]``."""
    e = heap[i]
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and iheap_less(key, heap[c + 1], heap[c]):
            c += 1
        q = heap[c]
        if not iheap_less(key, q, e):
            break
        heap[i] = q
        hpos[q] = i
        i = c
    heap[i] = e
    hpos[e] = i


@kernel(inline=True)
def iheap_set(key, heap, hpos, n, i, v):
    """Member ``i``'s key is ``v`` (inf: none): its entry in ``heap[:n]`` moved, made or removed.
    Returns the heap's new length."""
    j = hpos[i]
    key[i] = v
    if v == np.inf:
        if j >= 0:
            hpos[i] = -1
            n -= 1
            if j < n:
                q = heap[n]  # (the last entry takes the place: up or down from there)
                heap[j] = q
                hpos[q] = j
                iheap_up(key, heap, hpos, j)
                iheap_down(key, heap, hpos, hpos[q], n)
        return n
    if j < 0:
        heap[n] = i
        hpos[i] = n
        iheap_up(key, heap, hpos, n)
        return n + 1
    iheap_up(key, heap, hpos, j)
    iheap_down(key, heap, hpos, hpos[i], n)
    return n
