"""The indexed heap (servesim/engine/iheap.py), run as plain Python: after any sequence of key
moves, insertions and removals its top is the least (key, id), and popping gives the members in
(key, id) order -- the order the fleet's Python loops get from heapq's (key, id) tuples."""

import numpy as np

from servesim.engine import iheap
from servesim.jit import pure


def test_the_heap_pops_members_in_key_then_id_order_after_random_updates():
    put = pure(iheap.iheap_set)
    rng = np.random.default_rng(5)
    for trial in range(200):
        m = int(rng.integers(1, 24))
        key = np.full(m, np.inf)
        heap = np.zeros(m, dtype=np.int64)
        hpos = np.full(m, -1, dtype=np.int64)
        n = 0
        for _ in range(int(rng.integers(1, 60))):
            i = int(rng.integers(m))
            v = np.inf if rng.random() < 0.25 else float(rng.integers(0, 5))  # (many equal keys)
            n = put(key, heap, hpos, n, i, v)
            live = sorted((key[j], j) for j in range(m) if key[j] < np.inf)
            assert n == len(live)
            assert all(hpos[heap[p]] == p for p in range(n))
            assert all(hpos[j] == -1 for j in range(m) if key[j] == np.inf)
            if n:
                assert heap[0] == live[0][1]
        popped = []
        while n:
            top = int(heap[0])
            popped.append((key[top], top))
            n = put(key, heap, hpos, n, top, np.inf)
        assert popped == live
