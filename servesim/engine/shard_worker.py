"""The worker side of a sharded fleet (servesim/engine/shard.py): a Dask actor holding the
engines of a contiguous range of replicas.

It lives apart from the coordinator because the two hold different things and run in different
processes: the coordinator holds the arrival stream and the router and knows nothing of an
engine's state; a worker holds engines and knows nothing of routing. Their only contract is
:meth:`ShardWorker.window` (take a window's routed requests, advance to its end, return the loads
there), :meth:`ShardWorker.status` and :meth:`ShardWorker.finish` (the rows, recorders and tallies
the Result is built from). What makes the split exact is argued in shard.py's docstring; what a
worker must reproduce of one process's fleet loop (engine/cluster.py: when an engine is called,
how a routed arrival keys it, a pipeline replica's choice of virtual engine) is argued here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from servesim.engine import kernel as K

INF = float("inf")


@dataclass
class EngineOut:
    """What the Result needs of one engine that ran in a worker (engine/driver.py ``Engine``)."""

    recorder: object
    plan: object
    tab: object = None  # the step table's extrapolation tallies (kind, pk_ex)
    kv: object = None
    st: object = None  # (its waits are closed in the worker: run_built skips it)


@dataclass
class _Tab:
    kind: int
    pk_ex: np.ndarray


@dataclass
class _NoPrefix:
    prefix_caching: bool = False


#: the request table's columns the engines write (servesim/request.py RequestTable)
ROW_COLUMNS = ("computed", "num_output", "t_first_sched", "t_first_token", "t_finish", "t_last_token",
               "preemptions", "status", "reject_reason", "blocked")


class ShardWorker:
    """The engines of replicas ``lo..hi-1`` of a fleet, in a worker process (a pipeline replica:
    its ``pp`` virtual engines, consecutive, as in one process)."""

    def __init__(self, sc, seed: int, workload, lo: int, hi: int, reasons: list, buffers: tuple,
                 stop_when_drained: bool, new_recorder):
        import time

        import simpy

        from servesim.engine.fleet_build import build_fleet

        cpu0 = time.process_time()
        import sys

        #: how this process started: the fork server's preload state (servesim/shard_preload.py:
        #: forked with servesim, and the compiled engine where it says so), or None (spawned, or a
        #: worker of a cluster started apart: it imported and loaded all itself)
        self.start = getattr(sys.modules.get("servesim.shard_preload"), "STATE", None)
        from servesim.request import RequestTable
        from servesim.sched.custom import user_policy_loader

        self.table = table = RequestTable(workload)
        why = {id(g.scenario): reasons[i] for i, g in enumerate(sc.replica_groups)}
        user = user_policy_loader()  # (one line too where a remote worker cannot import what the coordinator did)
        _, built, infos = build_fleet(sc, table, workload, seed, simpy.Environment(), new_recorder=new_recorder,
                                      force_python=lambda gsc: why[id(gsc)], user=user, buffers=buffers,
                                      stop_when_drained=stop_when_drained, only=range(lo, hi))
        self.lo, self.hi = lo, hi
        self.infos = [replace(infos[r], model=None) for r in range(lo, hi)]
        first = self.infos[0].engines[0]  # (engines of a replica are consecutive, replicas in order)
        self.engines = [built[e] for info in self.infos for e in info.engines]
        self.groups = [[e - first for e in info.engines] for info in self.infos]  # local engines per replica
        self.starts = np.array([g[0] for g in self.groups], dtype=np.int64)
        self.pipelines = any(len(g) > 1 for g in self.groups)
        m = len(self.engines)
        self.done = [False] * m
        self.key = np.zeros(m)  # each engine's next event (engine/driver.py next_key): called when due
        self.routed = np.zeros(m, dtype=np.int64)
        self.ended = np.zeros(m, dtype=np.int64)
        self.rids: list[np.ndarray] = []
        self._refs = None
        if all(e.path == "compiled" for e in self.engines):
            from numba.typed import List

            from servesim.engine.driver import entry_point

            refs = List()
            for e in self.engines:
                refs.append(e._ref)
            self._refs = refs
            self._work_out = np.zeros(len(self.engines), dtype=np.int64)
            self._fleet_work = entry_point(K.fleet_work, refs, 0.0, self._work_out)
        self.cpu = {"build": time.process_time() - cpu0, "windows": 0.0}  # this process's CPU seconds

    def _advance_all(self, bound: float, touched=None) -> None:
        """Every engine up to ``bound``: those whose next event is at or before it, and those
        ``touched`` (sent requests: an idle one wakes, a decode run may be cut), as the fleet
        loop calls an engine only at its events (engine/cluster.py)."""
        todo = np.flatnonzero(self.key <= bound).tolist()
        if touched is not None and len(touched):
            todo = sorted(set(todo).union(touched))
        for i in todo:
            self._advance(i, bound)

    def _advance(self, i: int, bound: float) -> None:
        if self.done[i]:
            return
        eng = self.engines[i]
        while True:
            code = eng.advance(bound)
            if code == K.DONE:
                self.done[i] = True
                self.key[i] = INF
                break
            if code == K.UNTIL:
                self.key[i] = eng.next_key(code)
                break
        self.ended[i] = eng.s.get_i("ended")

    def _engine_for(self, rid: int, group: list) -> int:
        """A pipeline replica's virtual engine for ``rid``: the fewest unfinished requests at its
        arrival (vLLM's rule; engine/fleet_events.py ``_route``): its engines first commit what ends
        before the arrival, as the fleet loop has when it routes."""
        if len(group) == 1:
            return group[0]
        b = math.nextafter(float(self.table.arrival[rid]), -INF)
        best, e = None, group[0]
        for i in group:
            if self.key[i] <= b:
                self._advance(i, b)
            o = int(self.routed[i] - self.ended[i])
            if best is None or o < best:
                best, e = o, i
        return e

    def window(self, rids: np.ndarray, reps: np.ndarray, h: float, shut_at: float | None, warm):
        """Route ``rids`` (arrival order) to replicas ``reps``, advance every engine to ``h`` and
        return the loads at ``h`` (requests, tokens per replica; ``h`` inf: to the end).
        ``shut_at``: the last arrival of the run (the engines learn no more come then);
        ``warm``: (id, arrival, replica) of the warm-up request when it is among ``rids``."""
        import time

        cpu0 = time.process_time()
        try:
            return self._window(rids, reps, h, shut_at, warm)
        finally:
            self.cpu["windows"] += time.process_time() - cpu0

    def _window(self, rids, reps, h, shut_at, warm):
        engines, lo, groups = self.engines, self.lo, self.groups
        w_rid = -1
        if warm is not None:  # inter-token gaps count from its arrival on (engine/fleet_events.py _route)
            w_rid, t_w, r_w = warm
            for r, g in enumerate(groups):  # (the warm replica's other engines: once it is routed)
                if r + lo != r_w:
                    for i in g:
                        engines[i].s.set_f("itl_from", float(t_w))
        touched = None
        if len(rids):
            self.rids.append(rids)
            touched = set()
            for rid, r in zip(rids.tolist(), (reps - lo).tolist()):
                i = self._engine_for(rid, groups[r])
                if self.done[i]:
                    raise RuntimeError(f"request {rid} was routed to replica {r + lo}, which has ended (a bug)")
                eng = engines[i]
                eng.route_in(rid)
                self.routed[i] += 1
                touched.add(i)
                if eng.s.get_i("inflight"):  # its next event, as engine/fleet_events.py _route keys it
                    self.key[i] = eng.s.get_f("t_end")  # (route_in may have cut its decode run)
                elif eng.s.get_i("idle"):
                    self.key[i] = min(self.key[i], float(self.table.arrival[rid]))
                if rid == w_rid:
                    for k in groups[r]:
                        if k != i:
                            engines[k].s.set_f("itl_from", float(t_w))
        if shut_at is not None:  # as one process: after routing the last arrival, before planning at it
            self._advance_all(math.nextafter(shut_at, -INF), touched)
            for eng in engines:
                eng.s.set_i("inbox_shut", 1)
            touched = range(len(engines))  # (an idle engine may now end)
        self._advance_all(h, touched)
        if h == INF:
            return None
        req = self.routed - self.ended
        if self._refs is not None:
            self._fleet_work(self._refs, h, self._work_out)
            tok = self._work_out.copy()
        else:
            tok = np.array([e.work(h) for e in engines], dtype=np.int64)
        if self.pipelines:  # (a pipeline replica's load is its virtual engines' sum)
            req, tok = np.add.reduceat(req, self.starts), np.add.reduceat(tok, self.starts)
        return req, tok

    def status(self):
        """(engines ended, the latest engine clock, CPU seconds of the build and the windows, how
        the process started: :attr:`start`)."""
        return sum(self.done), max(e.s.get_f("now") for e in self.engines), dict(self.cpu), self.start

    def finish(self, end: float):
        """After every worker ended: the recorders drained, waits still open closed at ``end``
        (the fleet's final instant); the rows this worker's engines wrote, and its engines."""
        from servesim.engine.waits import close_open_waits

        for e in self.engines:
            e.finish()
        for e in self.engines:
            close_open_waits(e.st, end)
        rows = np.concatenate(self.rids) if self.rids else np.empty(0, dtype=np.int64)
        cols = {name: getattr(self.table, name)[rows] for name in ROW_COLUMNS}
        tabs: dict[int, _Tab] = {}
        outs = []
        for e in self.engines:
            t = e.tab
            if id(t) not in tabs:
                tabs[id(t)] = _Tab(int(t.kind), np.asarray(t.pk_ex).copy())
            kv = e.kv if getattr(e.kv, "prefix_caching", False) else _NoPrefix()  # (its counters: the summary's kv)
            outs.append(EngineOut(e.recorder, e.plan, tabs[id(t)], kv))
        return rows, cols, outs, self.infos
