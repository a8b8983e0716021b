"""Arrivals decided during the run: closed loops with a ramp-up, several closed-loop streams, and
closed and open loops together.

The engine asks its inbox three things: when is the next arrival (``next_time``), which requests
have arrived by ``t`` (``pop_until``), and it reports every request that ended
(``request_ended``). The engine's own inbox (servesim/engine/inbox.py) serves open loops and one
closed loop whose clients all start at 0 (the compiled core mirrors it). :class:`StreamInbox`
serves the rest, on the Python engine:

* each closed-loop group (a :class:`~servesim.request.ClosedGroup`: one stream's clients) starts
  client ``c`` at ``start_s[c]`` and, when one of *its* requests ends, sends its next row
  ``think_s`` later, so each stream keeps its own concurrency;
* open-loop rows (after the groups, sorted by time) arrive at their times;
* ``max_requests`` (``stop.requests``) caps the arrivals of all of them together; rows that never
  arrive keep a NaN arrival time (as a closed loop's unsent rows always did).

Which group a reported end belongs to: the engine reports only the time, after setting the
request's status, so the inbox looks at the statuses of its groups' requests in flight (at most
the number of clients; ``ended`` reads them). Several requests ending at the same instant release
their successors in row order, deterministically.
"""

from __future__ import annotations

import heapq
from typing import Callable, Sequence

import numpy as np

from servesim.request import ClosedGroup

INF = float("inf")


class StreamInbox:
    def __init__(self, arrivals: np.ndarray, groups: Sequence[ClosedGroup],
                 ended: Callable[[np.ndarray], np.ndarray], max_requests: int | None = None):
        self._arrivals = arrivals  # the request table's arrival column: closed rows are written here
        self._groups = list(groups)
        self._ended = ended
        self._n = len(arrivals)
        self._open_lo = max((g.hi for g in self._groups), default=0)
        self._cursor = self._open_lo
        self._cap = INF if max_requests is None else max_requests
        self._arrived = 0
        self._closed_for_good = False
        self._heap: list[tuple[float, int]] = []
        self._next = [g.lo for g in self._groups]
        self._in_flight: list[list[int]] = [[] for _ in self._groups]
        # one group and nothing else: every end is that group's, no status look-up needed
        self._one_group = len(self._groups) == 1 and self._open_lo == self._n
        for gi, g in enumerate(self._groups):
            first = min(g.clients, g.hi - g.lo)
            for c in range(first):
                self._send(gi, g.lo + c, float(g.start_s[c]))
            self._next[gi] = g.lo + first

    def _send(self, gi: int, rid: int, t: float) -> None:
        self._arrivals[rid] = t
        heapq.heappush(self._heap, (t, rid))
        if not self._one_group:
            self._in_flight[gi].append(rid)

    # -- the engine's inbox protocol ----------------------------------------------------------
    def next_time(self) -> float:
        if self._closed_for_good:
            return INF
        t = self._heap[0][0] if self._heap else INF
        if self._cursor < self._n:
            t = min(t, float(self._arrivals[self._cursor]))
        return t

    def pop_until(self, t: float) -> np.ndarray:
        """Ids of every request arriving at or before ``t``, in (time, id) order."""
        due: list[tuple[float, int]] = []
        while self._heap and self._heap[0][0] <= t:
            due.append(heapq.heappop(self._heap))
        hi = int(np.searchsorted(self._arrivals[self._cursor:], t, side="right")) + self._cursor
        if hi > self._cursor:
            due.extend(zip(self._arrivals[self._cursor:hi].tolist(), range(self._cursor, hi)))
            self._cursor = hi
        due.sort()
        room = self._cap - self._arrived
        if len(due) >= room:
            kept = [rid for _, rid in due[: int(room)]]
            cancelled = [rid for _, rid in due[int(room):]] + [rid for _, rid in self._heap]
            self._stop_arrivals(cancelled)
            due_ids = kept
        else:
            due_ids = [rid for _, rid in due]
        self._arrived += len(due_ids)
        return np.asarray(due_ids, dtype=np.int64)

    def request_ended(self, t: float) -> None:
        """A request ended at ``t``: the closed-loop clients whose requests ended think, then send
        their group's next row."""
        if self._closed_for_good:
            return
        if self._one_group:
            self._release(0, t)
            return
        for gi, flying in enumerate(self._in_flight):
            if not flying:
                continue
            ids = np.asarray(flying, dtype=np.int64)
            done = self._ended(ids)
            if not done.any():
                continue
            self._in_flight[gi] = ids[~done].tolist()
            for _ in range(int(done.sum())):
                self._release(gi, t)

    def exhausted(self) -> bool:
        return self.next_time() == INF

    # -- internals --------------------------------------------------------------------------
    def _release(self, gi: int, t: float) -> None:
        g = self._groups[gi]
        rid = self._next[gi]
        if rid >= g.hi:
            return
        self._next[gi] = rid + 1
        self._send(gi, rid, t + float(g.think_s[rid - g.lo]))

    def _stop_arrivals(self, cancelled: list[int]) -> None:
        """``max_requests`` reached: nothing else arrives; unsent rows keep no arrival time."""
        self._closed_for_good = True
        if cancelled:
            self._arrivals[np.asarray(cancelled, dtype=np.int64)] = np.nan
        self._arrivals[self._cursor:] = np.nan
        self._cursor = self._n
        self._heap.clear()
