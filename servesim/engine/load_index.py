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

The trees and the re-read of a compiled fleet are kernels (engine/load_kernels.py): a read is one
compiled call given the engines touched since the last read. A fleet of Python engines re-reads
in Python, into the same trees.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right

import numpy as np

from servesim.engine import load_kernels as LK
from servesim.engine.inbox import INFLIGHT_RUN
from servesim.jit import Dispatcher

INF = float("inf")
_NONE = np.zeros(0, dtype=np.int64)


def _entry(k, *args):
    """Kernel ``k``'s compiled entry for these arguments' types (engine/driver.py ``entry_point``:
    no per-call typing), or ``k`` itself where numba is off."""
    if not isinstance(k, Dispatcher):
        return k
    from servesim.engine.driver import entry_point

    return entry_point(k, *args)


class MinTree:
    """Values of ``n`` slots under a min segment tree (int64; engine/load_kernels.py): point
    update, and the first slot at or after a position holding the minimum, in O(log n)."""

    def __init__(self, values):
        vals = np.asarray(values, dtype=np.int64).reshape(-1)
        n = len(vals)
        size = 1
        while size < max(n, 1):
            size *= 2
        self.n, self.size = n, size
        t = np.full(2 * size, LK.BIG, dtype=np.int64)
        t[size:size + n] = vals
        h = size // 2
        while h >= 1:  # (each level from the one below)
            np.minimum(t[2 * h:4 * h:2], t[2 * h + 1:4 * h:2], out=t[h:2 * h])
            h //= 2
        t[0] = vals.sum()  # (affinity's load cap reads the fleet's sum)
        self.t = t
        self._least = _entry(LK.tree_least_from, t, size, n, 0)

    @property
    def total(self) -> int:
        return int(self.t[0])

    def __getitem__(self, i: int) -> int:
        return int(self.t[self.size + i])

    def set(self, i: int, v) -> None:
        LK.tree_set(self.t, self.size, i, v)

    def least_from(self, ptr: int) -> int:
        """``Router.least``'s choice: a slot holding the minimum, the first at or after ``ptr``,
        else the first from the start."""
        return self._least(self.t, self.size, self.n, ptr)


class FleetLoads:
    """Per-replica outstanding requests and tokens of a fleet (engine/cluster.py ``Fleet``),
    brought up to date at each read from the replicas touched since the last one.

    ``touch(e)``: engine ``e`` was advanced, routed to or restarted (a list's append: the fleet
    loop calls it at every engine call)."""

    def __init__(self, fleet):
        self.fleet = fleet
        n_rep = len(fleet.replicas)
        self.rep_of = np.zeros(len(fleet.engines), dtype=np.int64)
        for r, members in enumerate(fleet.replicas):
            self.rep_of[members] = r
        self.members = fleet.replicas
        self.touched: list = []
        self.touch = self.touched.append
        self.req = MinTree(np.zeros(n_rep, dtype=np.int64))
        self.tok = MinTree(np.zeros(n_rep, dtype=np.int64))
        self._ref = None  # the compiled fleet's load state (LoadsRef), made at the first read
        self._compiled = None  # (None: not decided yet; False: Python engines)
        # a fleet of Python engines: re-read in Python
        self.dirty: set[int] = set(range(n_rep))
        self.tok_dirty: set[int] = set(range(n_rep))  # (tokens also go stale with time: the heap)
        self.steps: list = []  # (next step end, replica): its tokens change then
        self.step_at = [INF] * n_rep

    walk = False  # True: a replica due by time alone is read in full too (load_kernels.reread_tokens)

    def _kernels(self) -> bool:
        """Whether the reads are kernels (every engine compiled, each replica's engines
        consecutive); makes the LoadsRef the first time."""
        if self._compiled is None:
            f = self.fleet
            n = len(self.members)
            first = np.array([m[0] for m in self.members] + [len(f.engines)], dtype=np.int64)
            consecutive = all(list(m) == list(range(first[r], first[r + 1])) for r, m in enumerate(self.members))
            self._compiled = f._vector is not None and consecutive
            if self._compiled:
                from servesim.engine.kernel import _Owner

                arrays = [first, self.rep_of, f.routed, self.tok.t, self.req.t,
                          np.ones((2, n), dtype=np.uint8), np.tile(np.arange(n, dtype=np.int64), (2, 1)),
                          np.full(n, INF), np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64),
                          np.array([n, n, 0, int(self.walk)], dtype=np.int64),
                          np.zeros(len(f.engines), dtype=np.int64), np.zeros(len(f.engines), dtype=np.int64)]
                arrays[4] = np.asarray(_Owner(self.req.t, (f._refs, arrays[:])))  # (holds the rest: unowned)
                ref = LK.make_loads_borrowed(f._refs, *arrays[:5], self.tok.size, *arrays[5:])
                self._ref = ref
                self._tok_fn = _entry(LK.refresh_tokens, ref, _NONE, 0.0)
                self._req_fn = _entry(LK.refresh_requests, ref, _NONE)
                self._one_tok = _entry(LK.replica_tokens, ref, 0, 0.0)
                self._one_req = _entry(LK.replica_requests, ref, 0)
        return self._compiled

    def _absorb(self) -> None:
        """(Python engines) the touched engines' replicas become stale for both kinds."""
        rep_of = self.rep_of
        for e in self.touched:
            r = int(rep_of[e])
            self.dirty.add(r)
            self.tok_dirty.add(r)
        self.touched.clear()

    def _touched(self) -> np.ndarray:
        tt = self.touched
        if not tt:
            return _NONE
        a = np.array(tt, dtype=np.int64)
        tt.clear()
        return a

    def requests(self) -> MinTree:
        if self._kernels():
            self._req_fn(self._ref, self._touched())
            return self.req
        self._absorb()
        if self.dirty:
            f = self.fleet
            for r in self.dirty:
                v = 0
                for e in self.members[r]:
                    v += f.engines[e].outstanding()
                self.req.set(r, v)
            self.dirty = set()
        return self.req

    def one(self, kind: str, r: int, t: float) -> int:
        """Replica ``r``'s load of ``kind`` at ``t``, read alone (the trees' value once brought
        up to date; neither tree changes): what a sampling router compares."""
        if self._kernels():
            return int(self._one_req(self._ref, r) if kind == "requests" else self._one_tok(self._ref, r, t))
        f = self.fleet
        v = 0
        for e in self.members[r]:
            v += f.engines[e].outstanding() if kind == "requests" else f.engines[e].work(t)
        return v

    def tokens(self, t: float) -> MinTree:
        if self._kernels():
            self._tok_fn(self._ref, self._touched(), t)
            return self.tok
        self._absorb()
        steps, dirty = self.steps, self.tok_dirty
        while steps and steps[0][0] <= t:  # a step of its decode run ended since its last read
            at, r = heapq.heappop(steps)
            if self.step_at[r] == at:
                dirty.add(r)
        if dirty:
            f = self.fleet
            for r in dirty:
                w = 0
                nxt = INF
                for e in self.members[r]:
                    eng = f.engines[e]
                    w += eng.work(t)
                    run = eng.s.get_i("inflight") == INFLIGHT_RUN
                    if run:
                        k = eng.s.get_i("run_k")
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
