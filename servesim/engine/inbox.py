"""Where a replica's requests come from, in arrival order.

Open-loop arrivals are known in advance: a sorted array and a cursor, so the engine can ask "when
is the next arrival?" without an event per request. Closed-loop arrivals are created during the
run: when a client's request ends (finished or rejected) the client thinks, then sends its next
request; those go into a heap.
"""

from __future__ import annotations

import heapq

import numpy as np

INF = float("inf")


class Inbox:
    def __init__(self, arrivals: np.ndarray, closed_clients: int = 0, think_s: float = 0.0,
                 think_rng: np.random.Generator | None = None, think_exponential: bool = False):
        self._arrivals = arrivals  # the request table's arrival column (filled in for closed loop)
        self._n = len(arrivals)
        self._closed = closed_clients > 0
        self._heap: list[tuple[float, int]] = []
        self._cursor = 0
        # think times, drawn up front: the i-th answer (in time order) starts the think time of
        # request ``clients + i``, so one pre-drawn column serves every engine identically
        self.think = np.empty(0)  # open loop: no think times
        if self._closed:
            self.think = np.full(self._n, float(think_s))
            if think_exponential and think_s > 0:
                self.think = think_rng.exponential(think_s, self._n)
        if self._closed:
            first = min(closed_clients, self._n)
            for rid in range(first):
                arrivals[rid] = 0.0
                self._heap.append((0.0, rid))
            self._next_id = first
        else:
            self._next_id = self._n

    def next_time(self) -> float:
        if self._closed:
            return self._heap[0][0] if self._heap else INF
        return float(self._arrivals[self._cursor]) if self._cursor < self._n else INF

    def pop_until(self, t: float) -> np.ndarray:
        """Ids of every request arriving at or before ``t``, in arrival order."""
        if self._closed:
            out = []
            while self._heap and self._heap[0][0] <= t:
                out.append(heapq.heappop(self._heap)[1])
            return np.asarray(out, dtype=np.int64)
        hi = int(np.searchsorted(self._arrivals, t, side="right"))
        lo = self._cursor
        self._cursor = max(lo, hi)
        return np.arange(lo, self._cursor, dtype=np.int64)

    def request_ended(self, t: float) -> None:
        """A closed-loop client got its answer at ``t``: it thinks, then sends the next request."""
        if not self._closed or self._next_id >= self._n:
            return
        rid = self._next_id
        think = float(self.think[rid])
        self._next_id += 1
        self._arrivals[rid] = t + think
        heapq.heappush(self._heap, (t + think, rid))

    def exhausted(self) -> bool:
        return self.next_time() == INF
