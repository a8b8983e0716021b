"""Processes on the run's clock: what users (and the built-in dynamics) write, and the fleet handle.

One SimPy ``Environment`` is the run's clock. The fleet (a lone replica is a fleet of one) is a
SimPy process that runs the compiled hot path -- arrivals, routing, iterations -- up to the time
of the next event in SimPy's queue, then yields to it (engine/cluster.py ``Fleet.process``). Any other process on the environment therefore runs at its
exact time with the replicas' state as of that instant: every iteration that ended by then is
committed, none that ends later is. SimPy events grow with what the processes do (a wake-up every
few seconds), never with the number of requests::

    time ──────────────────────────────────────────────────────────────────►
    fleet    ██ iterations ██▌         ██ iterations ██▌         ██ ...
    process                 ▲ t=5: observe, act       ▲ t=10
                            (env.peek() was 5: the fleet committed what ended by 5, yielded)

A process is a SimPy generator function ``fn(env, fleet)`` given the environment and a
:class:`FleetHandle`, from ``servesim.simulate(sc, processes=[fn])`` or the scenario's
``processes: ["package.module:function"]``. docs/processes.md has examples.

The run ends when the fleet does; processes still waiting then are not run further.
"""

from __future__ import annotations

import importlib
from typing import Callable, Iterable

import numpy as np

from servesim.jit import pure
from servesim.kv import kernels as kvk
from servesim.request import FINISHED
from servesim.sched.queues import num_waiting

INF = float("inf")


class FleetHandle:
    """What a process sees of the fleet and may do to it. Replica ``r`` is the router's ``r``
    (a lone replica is replica 0 of a fleet of one); observations are per replica, as of
    ``env.now`` (iterations ended by then are committed; one ending later is not)."""

    def __init__(self, env, fleet, table):
        self.env = env
        self._table = table
        self._groups = fleet.replicas
        self._fleet = fleet  # (engine/cluster.py)
        self._delay = float(fleet.delay_in)
        n = len(self._groups)
        # provisioned replicas (GPUs held: loading, serving or draining) and their spells
        self._up = np.ones(n, dtype=bool)
        self._loading = np.zeros(n, dtype=bool)
        self._since = np.zeros(n)
        self._replica_s = np.zeros(n)  # seconds of spells already ended
        self._timeline: list[tuple[float, int]] = [(0.0, n)]
        self._gpus = np.ones(n, dtype=np.int64)  # GPUs per replica (set by ``start``)
        self._down_since = np.full(n, np.nan)  # failed replicas: since when
        self.faults = {"failures": 0, "repairs": 0, "lost": 0, "retried": 0, "skipped": 0, "down_s": 0.0}
        self.release_poll_s = 1.0  # a stopped replica is released at the first such poll that finds it empty
        self._base: np.ndarray | None = None  # open-loop client send times at factor 1
        self._warp = (0.0, 0.0, 1.0)  # (client time, base time, factor) of the last rate change
        self.actions: list[tuple[float, str, object]] = []  # (time, action, argument), for the summary

    @property
    def _reps(self) -> list:
        """Each engine (engine/driver.py), as it is now (a failed replica's engines are new ones)."""
        return self._fleet.engines

    # -- observe ------------------------------------------------------------------------------
    @property
    def now(self) -> float:
        return float(self.env.now)

    @property
    def replicas(self) -> int:
        return len(self._groups)

    def completed(self) -> int:
        """Requests finished so far (rejections not counted)."""
        return int(np.count_nonzero(self._table.status == FINISHED))

    def completed_ids(self) -> np.ndarray:
        """Ids (request rows) of the requests finished so far."""
        return np.flatnonzero(self._table.status == FINISHED)

    def _per_replica(self, per_engine: list) -> np.ndarray:
        return np.array([sum(per_engine[e] for e in g) for g in self._groups])

    def queue_lengths(self) -> np.ndarray:
        """Requests waiting at each replica (queued, fetching from a KV tier, in a static batch
        forming); requests routed there that its next iteration boundary will pull are not yet."""
        wait = pure(num_waiting)
        return self._per_replica([int(wait(r.st)) for r in self._reps])

    def running(self) -> np.ndarray:
        """Requests in each replica's running batch."""
        return self._per_replica([int(r.st.s.run_len) for r in self._reps])

    def kv_used(self) -> np.ndarray:
        """Share of each replica's KV blocks in use (0..1)."""
        used, total = [], []
        for r in self._reps:
            kv = r.kv_object if r.kv_object is not None else None
            used.append(int(kv.used_blocks) if kv is not None else int(pure(kvk.kv_used_blocks)(r.kstate)))
            total.append(int(r.kstate.num_blocks))
        u, t = self._per_replica(used), self._per_replica(total)
        return u / np.maximum(t, 1)

    def outstanding(self) -> np.ndarray:
        """Requests sent to each replica and not yet ended (the least-requests router's load)."""
        return np.asarray(self._fleet._loads_requests(), dtype=np.int64).copy()

    def active(self) -> np.ndarray:
        """Which replicas the router sends new requests to."""
        if self._fleet.router.active is None:
            return np.ones(self.replicas, dtype=bool)
        return self._fleet.router.active.copy()

    # -- act ----------------------------------------------------------------------------------
    def drain(self, r: int) -> None:
        """The router sends replica ``r`` no new request; it finishes what it holds."""
        self._set_active(r, False)
        self.actions.append((self.now, "drain", int(r)))

    def resume(self, r: int) -> None:
        """Replica ``r`` takes new requests again."""
        self._set_active(r, True)
        self.actions.append((self.now, "resume", int(r)))

    def _set_active(self, r: int, on: bool) -> None:
        if self._fleet.lone:
            raise ValueError("drain/resume: a lone replica has no router (give hardware.replicas > 1)")
        if not 0 <= int(r) < self.replicas:
            raise ValueError(f"replica {r!r}: the fleet has replicas 0..{self.replicas - 1}")
        self._fleet.router.set_active(int(r), on)

    def provisioned(self) -> np.ndarray:
        """Which replica slots hold their GPUs (loading, serving, or draining before release)."""
        return self._up.copy()

    def loading(self) -> int:
        """Replicas started and still loading their model (not yet serving)."""
        return int(self._loading.sum())

    def serving(self) -> np.ndarray:
        """Which replicas are provisioned and take new requests."""
        return self._up & self.active()

    def add_replica(self, delay_s: float = 0.0) -> int:
        """Start a replica in the lowest free slot: its GPUs count from now, it takes requests
        ``delay_s`` later (the model loads). Returns its index; ValueError when every slot is
        provisioned (the fleet's ``hardware.replicas`` are the slots)."""
        free = np.flatnonzero(~self._up)
        if not len(free):
            raise ValueError(f"add_replica: all {self.replicas} replica slots are provisioned "
                             f"(hardware.replicas is the most the fleet can grow to)")
        r = int(free[0])
        self._provision(r, True)
        self._loading[r] = True
        self.actions.append((self.now, "add_replica", r))
        self.env.process(self._ready(r, float(delay_s)))
        return r

    def _ready(self, r: int, delay_s: float):
        if delay_s > 0:
            yield self.env.timeout(delay_s)
        self._loading[r] = False
        if self._up[r]:
            self._set_active(r, True)

    def remove_replica(self, r: int | None = None) -> int:
        """Stop replica ``r`` (default: the highest-numbered serving one): drained now, released
        (its GPUs no longer counted) once it holds no request."""
        if r is None:
            on = np.flatnonzero(self.serving())
            if not len(on):
                raise ValueError("remove_replica: no replica is serving")
            r = int(on[-1])
        self._set_active(int(r), False)
        self.actions.append((self.now, "remove_replica", int(r)))
        self.env.process(self._release(int(r)))
        return int(r)

    def _release(self, r: int):
        while self.outstanding()[r] > 0:
            yield self.env.timeout(self.release_poll_s)
        if self._up[r] and not self.active()[r]:
            self._provision(r, False)

    def _provision(self, r: int, on: bool) -> None:
        if self._up[r] == on:
            return
        self._up[r] = on
        if on:
            self._since[r] = self.now
        else:
            self._replica_s[r] += self.now - self._since[r]
        self._timeline.append((self.now, int(self._up.sum())))

    def scaling(self, end: float) -> dict:
        """``summary.scaling``: provisioned replicas over time and what they cost, to ``end``."""
        spells = self._replica_s + np.where(self._up, end - self._since, 0.0)
        timeline: list[list] = []
        for t, k in self._timeline:  # (several changes at one instant: the last count)
            if timeline and timeline[-1][0] == t:
                timeline[-1][1] = int(k)
            else:
                timeline.append([float(t), int(k)])
        return {"replicas_over_time": timeline,
                "replica_seconds": float(spells.sum()),
                "gpu_hours": float((spells * self._gpus).sum() / 3600.0),
                "replicas_max": int(max(k for _, k in self._timeline)),
                "replicas_min": int(min(k for _, k in self._timeline))}

    def fail(self, r: int, retry: bool = True) -> bool:
        """Replica ``r`` fails now: the router stops sending to it, it restarts empty (queues,
        batch, KV cache lost), and the requests it held are sent again through the router
        (``retry``) or lost (rejected, reason ``replica_failed``). It serves again after
        :meth:`repair`. False (nothing done) when it is not serving, or is the last replica
        serving (the router would have nowhere to send requests)."""
        if self._fleet.lone:
            raise ValueError("fail: a lone replica has no router to send its requests elsewhere "
                             "(give hardware.replicas > 1)")
        on = self.serving()
        if not on[r] or on.sum() <= 1:
            self.faults["skipped"] += 1
            return False
        self._set_active(r, False)
        lost, retried = self._fleet.fail_replica(int(r), self.now, retry)
        self.faults["failures"] += 1
        self.faults["lost"] += lost
        self.faults["retried"] += retried
        self._down_since[r] = self.now
        self.actions.append((self.now, "fail", int(r)))
        return True

    def repair(self, r: int) -> None:
        """Replica ``r`` (failed) serves again."""
        if np.isnan(self._down_since[r]):
            return
        self.faults["down_s"] += self.now - self._down_since[r]
        self._down_since[r] = np.nan
        self.faults["repairs"] += 1
        if self._up[r]:
            self._set_active(int(r), True)
        self.actions.append((self.now, "repair", int(r)))

    def finish(self, end: float) -> None:
        """After the run: retried requests' arrivals back to their first; downtime to ``end``."""
        self._fleet.restore_arrivals()
        down = ~np.isnan(self._down_since)
        self.faults["down_s"] += float(np.sum(end - self._down_since[down]))

    def refresh_loads(self) -> None:
        """The router's view of the replicas' loads becomes their loads now
        (``cluster.router_refresh_s``)."""
        self._fleet.refresh_loads(self.now)

    def set_rate(self, factor: float) -> None:
        """From now on open-loop requests are sent at ``factor`` times the workload's own rate
        (1: as generated). The requests not yet sent move in time: a client that would have
        sent at base time ``b`` sends at ``t0 + (b - b0) / factor``, ``(t0, b0)`` the time of
        this change and its base time -- the same requests, in the same order, a time-warped
        arrival process (a Poisson process stays Poisson at the new rate). Closed-loop clients
        send on their own and are not moved."""
        factor = float(factor)
        if not np.isfinite(factor) or factor <= 0:
            raise ValueError(f"set_rate factor {factor!r}: a rate factor is a finite number > 0")
        table = self._table
        cursor = int(self._fleet.arrival_cursor())
        d = self._delay
        queue = table.api_queue  # engine.api_server_count: send times are the queue's (engine/api_queue.py)
        if self._base is None:  # (a copy: client send times at factor 1)
            self._base = queue.sent.copy() if queue is not None else table.arrival - d
        t_prev, b_prev, f_prev = self._warp
        now = self.now  # client time: a request sent by now is on its way and does not move
        b_now = b_prev + (now - t_prev) * f_prev
        rows = np.arange(cursor, table.n)
        rows = rows[np.isfinite(table.arrival[rows])]
        if queue is not None:  # those sent by now wait for a server, or were served: kept
            rows = rows[queue.sent[rows] > now]
            queue.resend(rows, now + (self._base[rows] - b_now) / factor, table.arrival, d)
        else:
            rows = rows[table.arrival[rows] - d > now]
            table.arrival[rows] = now + (self._base[rows] - b_now) / factor + d
        self._warp = (now, b_now, factor)
        self.actions.append((now, "set_rate", factor))


def rate_schedule_process(steps: Iterable[tuple[float, float]]) -> Callable:
    """A process that sets the arrival-rate factor at each ``(time, factor)`` step."""
    steps = sorted((float(t), float(f)) for t, f in steps)

    def rates(env, fleet: FleetHandle):
        for t, f in steps:
            if t > env.now:
                yield env.timeout(t - env.now)
            fleet.set_rate(f)

    rates.__qualname__ = 'rate_schedule'
    return rates


def refresh_process(every_s: float) -> Callable:
    """The router reads the replicas' loads as of its last refresh, every ``every_s`` seconds."""

    def refresh(env, fleet: FleetHandle):
        while True:
            fleet.refresh_loads()
            yield env.timeout(every_s)

    refresh.__qualname__ = 'router_refresh'
    return refresh


def load_process(path: str) -> Callable:
    """Import ``package.module:function`` (a scenario's ``processes`` entry). ValueError, one
    line, when it cannot be imported or is not a function."""
    module, _, name = path.partition(":")
    if not module or not name:
        raise ValueError(f"processes: {path!r}: a process is named 'package.module:function'")
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's module
        raise ValueError(f"processes: {path!r}: cannot import {module!r} ({type(exc).__name__}: {exc})") from None
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise ValueError(f"processes: {path!r}: {module} has no function {name!r}")
    return fn


def start_processes(env, runner, table, fns: list[Callable]) -> FleetHandle:
    """Put each ``fn(env, handle)`` on ``env`` after the fleet's own process; the fleet yields
    to their events from now on."""
    handle = FleetHandle(env, runner, table)
    runner.dynamic = True
    for fn in fns:
        gen = fn(env, handle)
        if not hasattr(gen, "send"):
            raise ValueError(f"process {getattr(fn, '__name__', fn)!r} is not a generator function "
                             f"(it must yield SimPy events, e.g. env.timeout(5))")
        env.process(gen)
    return handle


def fault_processes(cfg, n: int, seed: int) -> list[Callable]:
    """``cluster.faults``: one process per replica with random failures, one for the schedule."""
    from servesim.workload.streams import stream

    retry = cfg.on_failure == "retry"
    fns: list[Callable] = []
    if cfg.mtbf_s is not None:
        rng = stream(seed, "faults")
        first = rng.exponential(cfg.mtbf_s, n)  # (drawn up front per replica: the order of events
        seeds = rng.integers(0, 2**63 - 1, n)     # never changes which replica gets which draws)

        def replica_faults(r: int):
            def faults(env, fleet: FleetHandle):
                own = np.random.default_rng(int(seeds[r]))
                wait = float(first[r])
                while True:
                    yield env.timeout(wait)
                    if fleet.fail(r, retry):
                        yield env.timeout(cfg.mttr_s)
                        fleet.repair(r)
                    wait = float(own.exponential(cfg.mtbf_s))
            faults.__qualname__ = f"faults[{r}]"
            return faults

        fns.extend(replica_faults(r) for r in range(n))
    if cfg.schedule is not None:
        events = sorted((e.at_s, e.replica, e.down_s) for e in cfg.schedule)

        def scheduled(env, fleet: FleetHandle):
            for at, r, down in events:
                if at > env.now:
                    yield env.timeout(at - env.now)
                if fleet.fail(r, retry):
                    env.process(_repair_after(env, fleet, r, down))

        scheduled.__qualname__ = "fault_schedule"
        fns.append(scheduled)
    return fns


def _repair_after(env, fleet: FleetHandle, r: int, down: float):
    yield env.timeout(down)
    fleet.repair(r)


def scenario_processes(sc, processes: list | None = None, seed: int | None = None) -> list[Callable]:
    """The processes a run of ``sc`` puts on its clock: the rate schedule, the router's load
    refreshes, the scenario's ``processes`` and the caller's (empty: none, and the fleet runs
    undisturbed). ValueError, one line, for a process that cannot be loaded."""
    fns: list[Callable] = []
    rs = sc.rate_schedule
    if rs is not None:
        if rs.steps is not None:
            fns.append(rate_schedule_process((s.at_s, s.factor) for s in rs.steps))
        else:
            fns.append(diurnal_process(rs.diurnal))
    if sc.cluster.router_refresh_s > 0 and sc.is_fleet and sc.cluster.router not in ("round-robin", "random"):
        fns.append(refresh_process(sc.cluster.router_refresh_s))
    auto = sc.cluster.autoscale
    if auto is not None:
        from servesim.engine.autoscale import autoscale_process

        if not sc.is_fleet or auto.initial > sc.num_replicas or auto.min_replicas > sc.num_replicas:
            raise ValueError(f"cluster.autoscale: min_replicas {auto.min_replicas} and initial_replicas "
                             f"{auto.initial} must be at most the fleet's {sc.num_replicas} replica slots "
                             f"(hardware.replicas or the groups' replicas)")
        fns.append(autoscale_process(auto))
    faults = sc.cluster.faults
    if faults is not None:
        bad = [e.replica for e in faults.schedule or () if e.replica >= sc.num_replicas]
        if not sc.is_fleet or sc.num_replicas < 2 or bad:
            raise ValueError(f"cluster.faults: needs a fleet of 2 or more replicas"
                             + (f"; replica {bad[0]} is not one of 0..{sc.num_replicas - 1}" if bad else "")
                             + (f" (this one has {sc.num_replicas})" if not bad else ""))
        fns.extend(fault_processes(faults, sc.num_replicas, sc.seed if seed is None else seed))
    fns.extend(load_process(p) for p in sc.processes)
    for fn in processes or ():
        if not callable(fn):
            raise ValueError(f"processes: {fn!r} is not a function (a SimPy generator function fn(env, fleet))")
        fns.append(fn)
    return fns


def diurnal_process(d) -> Callable:
    """A diurnal curve (servesim/config/dynamics.py), one rate factor per ``step_s``."""

    def diurnal(env, fleet: FleetHandle):
        while True:
            fleet.set_rate(d.factor(env.now + d.step_s / 2))
            yield env.timeout(d.step_s)

    diurnal.__qualname__ = 'diurnal'
    return diurnal


def start(sc, env, runner, table, fns: list[Callable]) -> FleetHandle | None:
    """Start ``fns`` (scenario_processes) on ``env`` next to the fleet's process; None if none."""
    if not fns:
        return None
    if sc.cluster.router_refresh_s > 0 and sc.is_fleet:
        runner.stale_loads()
    handle = start_processes(env, runner, table, fns)
    handle._gpus = np.array([g.scenario.gpus_per_replica for g in sc.replica_groups for _ in range(g.replicas)],
                            dtype=np.int64)
    auto = sc.cluster.autoscale
    if auto is not None:  # the slots beyond the initial replicas start unprovisioned
        for r in range(auto.initial, handle.replicas):
            handle._set_active(r, False)
            handle._up[r] = False
        handle._timeline = [(0.0, int(handle._up.sum()))]
    return handle


def processes_summary(handle: FleetHandle, fns: list[Callable]) -> dict:
    """``summary.processes``: which ran, and what they did (counts per action)."""
    counts: dict[str, int] = {}
    for _, what, _ in handle.actions:
        counts[what] = counts.get(what, 0) + 1
    return {"names": [getattr(f, "__qualname__", repr(f)) for f in fns], "actions": counts}


def faults_summary(handle: FleetHandle) -> dict | None:
    """``summary.faults`` (None when no replica failed nor was asked to)."""
    f = handle.faults
    if not (f["failures"] or f["skipped"]):
        return None
    return {**{k: int(v) for k, v in f.items() if k != "down_s"}, "down_s": float(f["down_s"])}
