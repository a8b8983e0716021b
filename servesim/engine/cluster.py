"""A fleet: replicas behind a router, interleaved in time order on the steppable engine. Every
run is a fleet: a lone replica (a scenario without ``cluster:``) is a fleet of one.

A fleet of one engine with no cluster delay is *solo* (``_run_solo``): the router has nothing
to decide, so the engine's own inbox holds the arrivals -- open-loop cursor, closed loops, the
arrival cap (engine/inbox.py) -- and one kernel call runs it up to SimPy's next event (the whole
run when no other process is on the clock): no return to Python per arrival or completion wave.
Everything below is the routed loop of the other fleets.

Every replica is the same kernel as a lone one (engine/kernel.py) with a *routed* inbox: the
router sends it requests one at a time (``route_in``). A pipeline-parallel replica is ``pp``
kernel instances -- vLLM's virtual engines (docs/cluster.md) -- so "engine" below means one
kernel instance and "replica" what the router sees (one or ``pp`` engines).

The routed loop -- every engine's next event in a heap, arrivals routed before an engine plans
at their instant, the order of commits, routing and plans at one instant for closed loops --
and its routing steps are in engine/fleet_events.py (``EventLoop``). When other
processes share the clock (engine/processes.py), the loop runs every fleet event up to the time of
SimPy's next event, yields to it and goes on: the same steps, paused (``process``).

A duration stop ends each engine at its own first boundary at or after the duration; the fleet's
final instant is the latest of them. What arrives by then -- a closed loop's successors sent at
a final boundary, theirs in turn (rejections without think time), or a request that reaches a
replica after that replica stopped -- is in the system when the run ends, as a lone replica takes
in what arrives at its final boundary: an engine that has ended takes in what is routed to it at
its arrival (rejected, or waiting), its clock moving on to the arrival (never back), and plans
nothing (``Fleet._take_in``; the routing-first loop does the same).

Cost: one kernel call per engine event (an iteration, a decode run, a wake-up) plus the router's
reads: the load-reading routers read loads kept incrementally (engine/load_index.py: only the
replicas touched since the last read are read again; ``scan = True`` reads every replica, as
before), so a routing costs O(log N) (benchmarks/fleet.py, benchmarks/RESULTS.md). For an open
loop behind least-tokens or least-requests the whole loop is one kernel (``_run_compiled`` in
engine/fleet_compiled.py, engine/fleet_loop.py ``fleet_run``): the same steps, without a return
to Python per event. Replica failures (``fail_replica``) are in engine/fleet_faults.py.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from servesim.engine import kernel as K
from servesim.engine.driver import SCALAR_INDEX, Engine, HeldInterrupt, entry_point
from servesim.engine.fleet_compiled import CompiledLoop
from servesim.engine.fleet_engine import FleetInbox
from servesim.engine.fleet_events import EventLoop
from servesim.engine.fleet_faults import ReplicaFaults
from servesim.engine.fleet_finish import finish_engines
from servesim.engine.load_index import FleetLoads, StaticLoads
from servesim.engine.router import LoadView, Router
from servesim.request import PENDING

INF = float("inf")


class Fleet(EventLoop, CompiledLoop, ReplicaFaults):
    """Engines, the replicas they form, the router, the inbox; ``run()`` simulates. The routed
    event loop with its routing steps (engine/fleet_events.py), the compiled loop's driver
    (engine/fleet_compiled.py) and replica failures (engine/fleet_faults.py) are parts of it
    written apart.

    ``scalars``: every engine's scalar record in one array (compiled engines), so the router's
    loads are read in one vectorized step; engines of a replica are consecutive."""

    def __init__(self, engines: list[Engine], replicas: list[list[int]], router: Router, inbox: FleetInbox,
                 table, *, closed: bool, delay_in: float = 0.0, delay_out: float = 0.0, warmup_id: int = -1,
                 progress: Callable[[int], None] | None = None, scalars: np.ndarray | None = None,
                 solo: bool = False):
        self.engines, self.replicas, self.router, self.inbox = engines, replicas, router, inbox
        self.table, self.closed = table, closed
        self._p1 = 1 if closed else 0  # the heap phase of a boundary to plan (``_phase``)
        self.delay_in, self.delay_out = delay_in, delay_out
        self.warmup_id, self.progress = warmup_id, progress
        self.replica_of = np.full(table.n, -1, dtype=np.int32)
        self.loads = FleetLoads(self)  # (engine/load_index.py: the loads kept incrementally)
        self.view = LoadView(len(replicas), self._loads_requests, self._loads_tokens, self._tree,
                             lambda kind, r: self.loads.one(kind, r, self._t))
        self._t = 0.0
        paths = {e.path for e in engines}
        self.path = "compiled" if paths == {"compiled"} else "python"
        whys = sorted({e.why for e in engines if e.why})
        self.why = "; ".join(whys)
        self.decisions: list | None = None  # (rid, replica, loads) per routing when recording
        self._scalars = scalars
        self.factories: list | None = None  # engine i afresh (fleet_build), for restarts after a failure
        self._rekey: list[int] = []  # engines restarted while the loop was paused
        self._retry: list[int] = []  # requests to route again when the loop resumes
        self.first_arrival: dict[int, float] = {}  # a retried request's arrival before its retry
        self._is_shut = False
        self.retired_kv: list = []  # KV managers of engines restarted after a failure (their counters count)
        self.routed = np.zeros(len(engines), dtype=np.int64)
        self._starts = np.array([r[0] for r in replicas], dtype=np.int64)
        self._vector = None
        self.solo = solo  # one engine that keeps its arrivals in its own inbox (``_run_solo``)
        if self.path == "compiled" and scalars is not None and not solo:
            from numba.typed import List

            self._vector = scalars.view(np.ndarray).view(np.int64).reshape(len(engines), -1)
            refs = List()
            for e in engines:
                refs.append(e._ref)
            self._work_out = np.zeros(len(engines), dtype=np.int64)
            self._refs = refs
            self._fleet_work = entry_point(K.fleet_work, refs, 0.0, self._work_out)
        self._loop_entry = None
        from servesim.engine.router import LeastRequests, LeastTokens

        if type(router) in (LeastTokens, LeastRequests) and self._vector is not None and self.loads._kernels():
            self._loop_entry = self._fleet_run_entry()  # (loads the cached kernel at build, as the engines')

    # -- what the router sees ---------------------------------------------------------------
    def _per_replica(self, x: np.ndarray) -> np.ndarray:
        return x if len(x) == len(self._starts) else np.add.reduceat(x, self._starts)

    def _loads_requests(self) -> np.ndarray:
        if self.solo:  # (what reached its inbox and did not end: nothing is routed ahead)
            s = self.engines[0].s
            return np.array([s.get_i("arrived") - s.get_i("ended")], dtype=np.int64)
        if self._vector is not None:
            return self._per_replica(self.routed - self._vector[:, SCALAR_INDEX["ended"]])
        return self._per_replica(np.array([e.outstanding() for e in self.engines], dtype=np.int64))

    def _loads_tokens(self) -> np.ndarray:
        t = self._t
        if self._vector is not None:
            self._fleet_work(self._refs, t, self._work_out)
            return self._per_replica(self._work_out.copy())
        return self._per_replica(np.array([e.work(t) for e in self.engines], dtype=np.int64))

    scan = False  # True: routers read every replica's load on each arrival (the exact scan, for tests)

    def _tree(self, kind: str):
        if self.scan:
            return None
        return self.loads.requests() if kind == "requests" else self.loads.tokens(self._t)

    def stale_loads(self) -> None:
        """The router reads the loads of the last :meth:`refresh_loads` (``cluster.router_refresh_s``),
        as a real router polls its replicas, instead of the exact loads at each arrival."""
        zero = np.zeros(len(self.replicas), dtype=np.int64)
        self._stale = (zero, zero)
        self._stale_trees = None
        self.view = LoadView(len(self.replicas), lambda: self._stale[0], lambda: self._stale[1], self._stale_tree)

    def refresh_loads(self, t: float) -> None:
        self._t = t
        self._stale = (self._loads_requests().copy(), self._loads_tokens().copy())
        self._stale_trees = None

    def _stale_tree(self, kind: str):
        """The last refresh's loads as trees (built at the first read after a refresh)."""
        if self.scan:
            return None
        if self._stale_trees is None:
            self._stale_trees = StaticLoads(*self._stale)
        return self._stale_trees.requests() if kind == "requests" else self._stale_trees.tokens(self._t)

    @property
    def now(self) -> float:
        return max(e.s.get_f("now") for e in self.engines)

    lone = False  # built from a scenario without ``cluster:`` (set by fleet_build)

    @property
    def kv_object(self):
        """The Python KV manager of a fleet of one engine (None: the compiled pool, or several)."""
        return self.engines[0].kv_object if len(self.engines) == 1 else None

    def arrival_cursor(self) -> int:
        """The first open-loop row not yet sent (the fleet inbox's, or a solo engine's own)."""
        return (self.engines[0] if self.solo else self.inbox).s.get_i("cursor")

    # -- the loop ----------------------------------------------------------------------------
    stop_on_interrupt = False  # Ctrl-C: end the run at the next engine return (``interrupted``)
    interrupted = False

    dynamic = False  # processes share the clock: yield to SimPy's next event (``process``)
    _env = None

    def run(self) -> None:
        """The whole fleet, with nothing else on the clock (``process`` interleaves other
        SimPy processes: the same steps, paused at their events)."""
        for _ in self._steps():
            raise AssertionError("the fleet paused with no SimPy environment to yield to")

    def _steps(self):
        """The whole fleet. Ctrl-C is held while a kernel runs, as for a lone replica
        (engine/driver.py): the loop stops after the engine call under way returns -- every
        engine is then at an iteration boundary -- and every engine finishes from there, so the
        partial run is consistent; then KeyboardInterrupt, or, with ``stop_on_interrupt``, the
        run ends with ``interrupted`` set. (Routing first, the engines run one after another: a
        partial run then has the first engines' requests ended and the later ones' waiting.)"""
        self._left_early = False
        with HeldInterrupt() as held:
            self._held = held
            if self.solo:
                yield from self._run_solo()
            elif self.prerouted and not self.dynamic:
                self._run_prerouted()
            elif self._loop_compiles():
                self._run_compiled()
            else:
                yield from self._run_events()
            finish_engines(self.engines)  # (engine/fleet_finish.py: the final folds in one pass)
            pending = self.table.status == PENDING
            if self.solo:  # every request that reached the engine's inbox was its
                self.replica_of[~pending] = 0
            # a request the router sent that never reached its replica (the run ended first) was
            # served by none: the same in both loops, whichever requests each sent beyond the end
            self.replica_of[pending] = -1
        self._held = None
        if self._left_early and self.stop_on_interrupt:
            self.interrupted = True
        elif held.hit and not self.stop_on_interrupt:
            raise KeyboardInterrupt  # from the consistent state (a run that completed meanwhile too)

    _held = None
    _left_early = False

    def _interrupt_now(self) -> bool:
        """A Ctrl-C was noted: the loop leaves now (every engine is between calls)."""
        if self._held is not None and self._held.hit:
            self._left_early = True
            return True
        return False

    prerouted = False
    coupled = False  # engines share a KV-tier link (kv/ptiers.py link_transfer): advance in time order

    def _run_solo(self):
        """One engine, nothing to route: its own inbox holds the arrivals (open-loop cursor,
        closed loops, the cap), so one kernel call runs it up to the time of SimPy's next event
        (the whole run when there is none) -- arrivals and completion waves stay inside the
        kernel. Yields that time, as ``_run_events`` does; a lone replica's calls, exactly."""
        eng = self.engines[0]
        while True:
            h = self._horizon()
            code = eng.advance(h)
            if code == K.DONE:
                return
            if self._interrupt_now():
                return
            if code == K.UNTIL:
                yield h
            elif code == K.PROGRESS and self.progress is not None:
                self.progress(eng.s.get_i("ended"))

    def _run_prerouted(self) -> None:
        """Open loop, a router that reads no load, one engine per replica: the routes do not
        depend on the replicas, so every request is routed first and each engine then runs
        alone to its end -- the same results as the event loop (tests/test_cluster_identity.py)
        at a lone replica's cost per request."""
        ids = self.inbox.due(INF)  # every request, in (time, id) order
        choice = self.router.choose_many(len(ids))
        self.replica_of[ids] = choice
        w = self.warmup_id
        for r, members in enumerate(self.replicas):
            eng = self.engines[members[0]]
            mine = ids[choice == r]
            eng.append_inbox(mine)
            self.routed[eng.index] += len(mine)
            if w >= 0 and self.replica_of[w] != r:  # (the replica it reached sets its own at the pull)
                eng.s.set_f("itl_from", float(self.table.arrival[w]))
        for eng in self.engines:
            eng.s.set_i("inbox_shut", 1)
        done = 0
        for eng in self.engines:
            if self._interrupt_now():
                return
            while eng.advance(INF) != K.DONE:
                if self._interrupt_now():
                    return
            done += eng.s.get_i("ended")
            if self.progress is not None:
                self.progress(done)
        # a duration stop: each engine ran to its own final boundary; what reached an engine by
        # the fleet's final instant is in the system, as in the event loop (``_take_in``)
        end = self.now
        for eng in self.engines:
            t = eng.last_arrival_by(end)
            if t is not None:
                self._take_in(eng.index, t)

    def _horizon(self) -> float:
        return self._env.peek() if self._env is not None else INF

    def process(self, env):
        """SimPy process: the whole fleet, then the clock catches up to its final instant.
        ``dynamic`` (other processes on the clock: engine/processes.py): the loop runs every
        fleet event up to the time of SimPy's next event, yields to it, and goes on from there
        -- results equal the undisturbed run's bit for bit, because engines commit exactly what
        ends by a bound and plan the same whatever the bound (tests/test_processes.py)."""
        if not self.dynamic:
            self.run()
        else:
            self._env = env
            try:
                for h in self._steps():
                    yield env.timeout(max(0.0, h - env.now))
            finally:
                self._env = None
        yield env.timeout(max(0.0, self.now - env.now))

