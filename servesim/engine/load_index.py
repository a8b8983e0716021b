"""Replica loads kept incrementally, so a load-reading router answers without a scan of the fleet.

A fleet of N replicas used to compute every replica's load on each arrival (N kernel reads) and
scan them for the least (engine/router.py ``Router.least``): the cost per request grew with N.
Here each load lives in a min segment tree (:class:`MinTree`) and only replicas whose load may
have changed since the last read are read again:

* a replica is *touched* when the fleet loop advances one of its engines, routes a request to
  it, or restarts it (engine/cluster.py calls :meth:`FleetLoads.touch`); nothing else changes
  its outstanding requests, and nothing else changes its outstanding tokens --
* -- except time inside a decode run: ``outstanding_work`` (engine/inbox.py) counts the steps of a
  run under way that ended by the instant asked, so a replica's tokens also change at each step
  end of its run. After reading a replica at ``t`` its next step end after ``t`` goes on a heap;
  a read at a later instant first reads again every replica whose step end came.

The least-loaded query keeps ``Router.least``'s rule exactly: the minimum, ties to the first
replica at or after the router's pointer, else the first from the start. So the decisions are
the scan's, request by request (tests/test_fleet_scale.py), at O(log N) per read and per touched
replica instead of O(N) per arrival.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right

import numpy as np

from servesim.engine.fleet_engine import SCALAR_INDEX
from servesim.engine.inbox import INFLIGHT_RUN

INF = float("inf")
_INFLIGHT = SCALAR_INDEX["inflight"]
_RUN_K = SCALAR_INDEX["run_k"]


class MinTree:
    """Values of ``n`` slots under a min segment tree: point update, and the first slot at or
    after a position holding the minimum, in O(log n)."""

    def __init__(self, values):
        n = len(values)
        size = 1
        while size < max(n, 1):
            size *= 2
        self.n, self.size = n, size
        t = [INF] * (2 * size)
        t[size:size + n] = [v for v in (values.tolist() if isinstance(values, np.ndarray) else values)]
        for i in range(size - 1, 0, -1):
            a, b = t[2 * i], t[2 * i + 1]
            t[i] = a if a <= b else b
        self.t = t
        self.total = sum(t[size:size + n])  # (affinity's load cap reads the fleet's sum)

    def __getitem__(self, i: int):
        return self.t[self.size + i]

    def set(self, i: int, v) -> None:
        t = self.t
        i += self.size
        if t[i] == v:
            return
        self.total += v - t[i]
        t[i] = v
        i >>= 1
        while i:
            a, b = t[2 * i], t[2 * i + 1]
            m = a if a <= b else b
            if t[i] == m:
                break
            t[i] = m
            i >>= 1

    def first_at_most(self, lo: int, x) -> int:
        """The first slot at or after ``lo`` whose value is <= ``x`` (-1: none)."""
        t, size = self.t, self.size
        if lo >= self.n:
            return -1
        i = lo + size
        if t[i] <= x:
            return lo
        while i > 1:
            if not i & 1 and t[i + 1] <= x:
                i += 1
                while i < size:
                    i = 2 * i if t[2 * i] <= x else 2 * i + 1
                return i - size
            i >>= 1
        return -1

    def least_from(self, ptr: int) -> int:
        """``Router.least``'s choice: a slot holding the minimum, the first at or after ``ptr``,
        else the first from the start."""
        low = self.t[1]
        best = self.first_at_most(ptr, low)
        return best if best >= 0 else self.first_at_most(0, low)


class FleetLoads:
    """Per-replica outstanding requests and tokens of a fleet (engine/cluster.py ``Fleet``),
    brought up to date at each read from the replicas touched since the last one."""

    def __init__(self, fleet):
        self.fleet = fleet
        n_rep = len(fleet.replicas)
        self.rep_of = np.zeros(len(fleet.engines), dtype=np.int64)
        for r, members in enumerate(fleet.replicas):
            self.rep_of[members] = r
        self.members = fleet.replicas
        self.dirty: set[int] = set(range(n_rep))
        self.req = MinTree([0] * n_rep)
        self.tok = MinTree([0] * n_rep)
        self.tok_dirty: set[int] = set(range(n_rep))  # (tokens also go stale with time: the heap)
        self.steps: list = []  # (next step end, replica): its tokens change then
        self.step_at = [INF] * n_rep

    def touch(self, e: int) -> None:
        r = int(self.rep_of[e])
        self.dirty.add(r)
        self.tok_dirty.add(r)

    def requests(self) -> MinTree:
        if self.dirty:
            f = self.fleet
            vec = f._vector
            for r in self.dirty:
                v = 0
                for e in self.members[r]:
                    if vec is not None:
                        v += int(f.routed[e] - vec[e, SCALAR_INDEX["ended"]])
                    else:
                        v += f.engines[e].outstanding()
                self.req.set(r, v)
            self.dirty = set()
        return self.req

    def one(self, kind: str, r: int, t: float) -> int:
        """Replica ``r``'s load of ``kind`` at ``t``, read alone (the trees' value once brought
        up to date; neither tree changes): what a sampling router compares."""
        f = self.fleet
        vec = f._vector
        v = 0
        for e in self.members[r]:
            if kind == "requests":
                v += int(f.routed[e] - vec[e, SCALAR_INDEX["ended"]]) if vec is not None else f.engines[e].outstanding()
            else:
                v += f.engines[e].work(t)
        return v

    def tokens(self, t: float) -> MinTree:
        steps, dirty = self.steps, self.tok_dirty
        while steps and steps[0][0] <= t:  # a step of its decode run ended since its last read
            at, r = heapq.heappop(steps)
            if self.step_at[r] == at:
                dirty.add(r)
        if dirty:
            f = self.fleet
            vec = f._vector
            for r in dirty:
                w = 0
                nxt = INF
                for e in self.members[r]:
                    eng = f.engines[e]
                    w += eng.work(t)
                    if vec is not None:
                        run = vec[e, _INFLIGHT] == INFLIGHT_RUN
                        k = int(vec[e, _RUN_K]) if run else 0
                    else:
                        run = eng.s.get_i("inflight") == INFLIGHT_RUN
                        k = eng.s.get_i("run_k") if run else 0
                    if run:
                        ends = eng.st.ends
                        done = bisect_right(ends, t, 0, k)  # (np.searchsorted's wrapper: 3x the time)
                        if done < k and ends[done] < nxt:
                            nxt = float(ends[done])
                self.tok.set(r, w)
                self.step_at[r] = nxt
                if nxt < INF:
                    heapq.heappush(steps, (nxt, r))
            self.tok_dirty = set()
        return self.tok


class StaticLoads:
    """A load snapshot (``cluster.router_refresh_s``): both trees built once per refresh."""

    def __init__(self, requests: np.ndarray, tokens: np.ndarray):
        self.req, self.tok = MinTree(requests), MinTree(tokens)

    def requests(self) -> MinTree:
        return self.req

    def tokens(self, t: float) -> MinTree:
        return self.tok
