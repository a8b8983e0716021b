"""One fleet over several processes: replicas partitioned over Dask workers, in windows of the
router's refresh interval (``sim.workers``; issue 30). This module is the coordinator's side (what
may be refused, how replicas are partitioned, the window loop that routes and gathers); the
workers' side, the engines of a range of replicas, is engine/shard_worker.py.

With ``cluster.router_refresh_s = R`` a router decides on the replicas' loads as of its last
refresh, at ``0, R, 2R, ...`` (engine/processes.py ``refresh_process``; the times accumulate as
SimPy's clock does, ``h + R``). In one process the refresh at ``h`` runs after every arrival at or
before ``h`` is routed and every engine has committed what ends by ``h`` (engine/cluster.py
``_run_events`` yields to the refresh only when both the next arrival and the next engine event
are after it). So the arrivals in ``(h, h + R]`` are routed on the snapshot taken at ``h``, and
nothing that happens inside the window changes a routing decision in it. That is what makes the
fleet shardable without changing a result:

* the coordinator (:func:`run_sharded`) holds the arrival stream and the router (its random
  stream, pointer and counters): for each window it routes the window's arrivals on the last
  snapshot and sends each worker the requests of its replicas;
* each worker (engine/shard_worker.py :class:`ShardWorker`, a Dask actor) holds the engines of
  a contiguous range of replicas, built exactly as in one process (engine/fleet_build.py
  ``build_fleet(only=...)``: the same engine indices, buffers and seeds); it routes the requests into its engines' inboxes
  (``route_in``, in time order: a decode run planned before an arrival was known is cut where it
  would have been cut had it been known), advances every engine to the window's end and returns
  its replicas' loads at that instant -- the values ``Fleet.refresh_loads`` reads;
* the snapshot is the workers' loads side by side; windows without arrivals are skipped (their
  snapshot is never read).

An engine's results do not depend on the bounds it is advanced to (engine/cluster.py
``Fleet.process``), nor on when a routed arrival entered its inbox before its time
(``Fleet._run_prerouted`` sends every request first), so each engine runs as in one process.
The end of the arrivals is told to the engines where one process tells them: after the last
arrival is routed and before any engine plans at its instant (every engine is first advanced
to just before it). At the end each worker returns its requests' rows, its engines' recorders
and step-table tallies; ``servesim.simulate`` builds the Result from them as from one process's
fleet. tests/test_shard.py compares requests.parquet with one process's, 2 and 4 workers.

What this cannot reproduce exactly is refused before anything runs (:func:`shard_refusal`):
closed loops, processes on the clock (rate schedules, autoscaling, faults, your own), KV tiers on
a shared link, routers other than the built-in ones, a load-reading router without a refresh
interval, and arrivals at or after a duration stop (this one in :func:`run_sharded`, still before
any worker starts). With prefix caching each engine's cache manager comes back whole (its counters feed the
summary). A pipeline replica's virtual engine is picked where one process picks it: at the
arrival, after its engines committed what ended before it (``ShardWorker._engine_for``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

INF = float("inf")

#: routers whose decisions read nothing but the load view (engine/router.py): shardable
SHARDABLE_ROUTERS = ("round-robin", "random", "least-requests", "least-tokens", "affinity", "priority")


def shard_refusal(sc, workers: int | None) -> str | None:
    """Why ``sc`` cannot run over ``workers`` processes with the results of one (one line naming
    the field, its value and what is allowed), or None. ``workers`` None: a scheduler's, however many."""
    c = sc.cluster
    head = f"sim.workers = {workers}" if workers is not None else "--scheduler"
    if not sc.is_fleet:
        return f"{head}: a lone replica has nothing to shard (give hardware.replicas > 1, or sim.workers: 1)"
    if workers is not None and sc.num_replicas < workers:
        return f"{head}: more workers than the fleet's {sc.num_replicas} replicas (allowed: 1..{sc.num_replicas})"
    if c.router not in SHARDABLE_ROUTERS:
        return (f"{head}: cluster.router {c.router!r} is not shardable (allowed: "
                f"{', '.join(SHARDABLE_ROUTERS)}: routers that read only the load snapshot)")
    reads = c.router not in ("round-robin", "random")
    if reads and not c.router_refresh_s > 0:
        return (f"{head}: cluster.router_refresh_s = {c.router_refresh_s}: router {c.router!r} reads live loads; "
                f"a sharded fleet needs load snapshots (allowed: router_refresh_s > 0)")
    w = sc.workload
    from servesim.config.arrivals import ClosedArrival

    if isinstance(w.arrival, ClosedArrival) or any(isinstance(s.arrival, ClosedArrival) for s in w.streams or ()):
        return (f"{head}: workload.arrival is a closed loop (allowed: open-loop arrivals; clients react to live "
                f"completions)")
    for name, value in (("rate_schedule", sc.rate_schedule), ("cluster.autoscale", c.autoscale),
                        ("cluster.faults", c.faults)):
        if value is not None:
            return f"{head}: {name} is set (processes on the clock act on live state; allowed: none)"
    if sc.processes:
        return f"{head}: processes {list(sc.processes)!r} (act on live state; allowed: none)"
    for g in sc.replica_groups:
        gsc = g.scenario
        if any(getattr(t, "shared_link", False) for t in gsc.kv_tiers or ()):
            return f"{head}: kv_tiers with shared_link (engines on one link advance in time order; allowed: none)"
    return None


def partition(n: int, parts: int) -> list[range]:
    """``n`` replicas in ``parts`` contiguous ranges, as even as can be."""
    q, r = divmod(n, parts)
    out, lo = [], 0
    for i in range(parts):
        hi = lo + q + (1 if i < r else 0)
        out.append(range(lo, hi))
        lo = hi
    return out


@dataclass
class ShardedRun:
    """One process's ``Fleet`` as ``simulate.run_built`` reads it, filled by :func:`run_sharded`."""

    router: object
    replica_of: np.ndarray
    engines: list = field(default_factory=list)
    replicas: list = field(default_factory=list)
    now: float = 0.0
    retired_kv: list = field(default_factory=list)
    windows: int = 0
    description: str = ""
    seconds: dict = field(default_factory=dict)  # wall seconds: start (cluster), build (workers), windows, gather
    worker_cpu: list = field(default_factory=list)  # each worker's CPU seconds: {"build", "windows"}
    worker_start: list = field(default_factory=list)  # each worker's ShardWorker.start (None: spawned)
    path: str = "compiled"  # the engines' (the run header's simulator line)
    why: str = ""
    interrupted: bool = False  # (Ctrl-C is not held across workers: the run stops with a KeyboardInterrupt)
    workers: int = 0  # how many worker processes held replicas
    scheduler: str | None = None  # the Dask scheduler's address (None: a local cluster)
    window_s: float | None = None  # the router's refresh interval (None: a router that reads no loads)

    def sharding(self) -> dict:
        """The summary's ``sharded`` block: what a reader of summary.json needs to know the fleet
        ran over several processes (the results are one process's with the same refresh interval)."""
        return {"workers": self.workers, "scheduler": self.scheduler, "window_s": self.window_s,
                "windows": self.windows}


#: modules the fork server imports before it forks a local run's workers (servesim/shard_preload.py:
#: servesim, Dask's worker, the compiled engine loaded)
FORK_PRELOAD = ["servesim.shard_preload"]
#: the fork server's environment variable saying what its warm-up loads: "compiled" the engine too,
#: anything else imports only (a run of the Python engine loads no compiled kernel)
WARM_ENV = "SERVESIM_SHARD_WARM"


def start_fork_server(compiled: bool) -> bool:
    """Start (if not yet running) the fork server a local cluster's workers are forked from, with
    servesim and, for a ``compiled`` run, its compiled engine loaded in it (servesim/shard_preload.py);
    called as soon as a local sharded run is built, so the server's loading overlaps the
    coordinator's own preparation. Once per process: a second run forks from the same server
    (whatever the first one loaded). False where this platform has no fork server (Windows):
    the workers are then spawned, each importing servesim itself."""
    import multiprocessing
    import os

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    from multiprocessing import forkserver

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(FORK_PRELOAD)
    before = os.environ.get(WARM_ENV)
    os.environ[WARM_ENV] = "compiled" if compiled else "python"  # (the server inherits this environment)
    try:
        forkserver.ensure_running()
    finally:
        if before is None:
            os.environ.pop(WARM_ENV, None)
        else:
            os.environ[WARM_ENV] = before
    return True


def connect(workers: int, scheduler: str | None, compiled: bool = True):
    """(client, cluster or None): a LocalCluster of ``workers`` single-threaded processes, or the
    scheduler at ``scheduler`` (ValueError, one line, when it is not an address or nothing answers
    there: an empty host would otherwise be tried as localhost and reported as unreachable)."""
    import logging
    import socket
    from urllib.parse import urlparse

    from distributed import Client, LocalCluster

    if scheduler is not None:
        u = urlparse(scheduler if "://" in scheduler else f"tcp://{scheduler}")
        try:
            port = u.port
        except ValueError:  # (a port that is not a number in 0..65535)
            port = -1
        if not u.hostname or port == -1 or port == 0:
            raise ValueError(f"--scheduler {scheduler!r}: not a scheduler address (allowed: host:port or "
                             f"tcp://host:port, e.g. tcp://10.0.0.5:8786; the port defaults to 8786)")
        try:
            socket.create_connection((u.hostname, port or 8786), timeout=5).close()
            return Client(scheduler, timeout="10s"), None
        except (OSError, TimeoutError, ValueError) as exc:
            raise ValueError(f"--scheduler {scheduler}: cannot reach a dask scheduler there "
                             f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no answer'})"
                             ) from None
    # no memory limit: a worker's replicas cannot be spilled to disk, and a nanny pausing or
    # restarting an actor past a share of the machine's memory would lose the run
    try:
        from distributed import get_worker

        get_worker()
        inside = True
    except ValueError:  # (not in a Dask worker: the usual case)
        inside = False
    if inside:
        raise ValueError(f"sim.workers = {workers}: this run is itself a task on a Dask worker (a sweep's), "
                         f"which cannot start worker processes of its own (allowed there: sim.workers: 1)")
    # workers forked from a fork server that has servesim and the compiled engine loaded, instead of
    # spawned (Dask's default), each importing and loading them itself (servesim/shard_preload.py)
    import dask

    try:
        method = "forkserver" if start_fork_server(compiled) else \
            dask.config.get("distributed.worker.multiprocessing-method")
        with dask.config.set({"distributed.worker.multiprocessing-method": method}):
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                                   memory_limit=0, silence_logs=logging.CRITICAL)
    except Exception as exc:  # noqa: BLE001 - Dask's own error is pages of worker tracebacks (sweep/executor.py)
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        raise ValueError(f"sim.workers = {workers}: could not start {workers} local worker processes ({first}); "
                         f"in a script, call servesim under if __name__ == \"__main__\": (each worker re-imports "
                         f"the script), or use sim.workers: 1") from None
    return Client(cluster), cluster


def run_sharded(sc, seed: int, workload, table, run: ShardedRun, *, workers: int | None, scheduler: str | None,
                reasons: list, buffers: tuple, stop_when_drained: bool, new_recorder, warmup_id: int) -> None:
    """Run the fleet of ``sc`` over ``workers`` Dask worker processes (module docstring); fills
    ``run`` and the rows of ``table`` (arrival times as routed: the cluster's ``delay_in`` added)."""
    from servesim.engine.load_index import StaticLoads
    from servesim.engine.router import LoadView
    from servesim.engine.shard_worker import ShardWorker

    n_rep = sc.num_replicas
    arr = table.arrival
    n = len(arr)
    if n and not (np.all(np.isfinite(arr)) and np.all(np.diff(arr) >= 0)):
        raise ValueError("sim.workers: the open-loop arrivals are not finite and sorted (a bug)")
    dur = sc.stop.duration_s
    if dur is not None and n and arr[-1] >= dur:
        head = f"sim.workers = {workers}" if workers else "--scheduler"
        raise ValueError(f"{head}: an arrival at {arr[-1]:.6g} s is not before stop.duration_s = {dur} (requests "
                         f"reaching replicas that ended: allowed only in one process)")
    import time

    R = sc.cluster.router_refresh_s if run.router.reads_load else INF
    t0 = time.perf_counter()
    client, cluster = connect(workers or 1, scheduler, compiled=run.path == "compiled")
    try:
        addrs = sorted(client.scheduler_info()["workers"])
        k = min(workers or n_rep, len(addrs), n_rep)
        if k < 1:
            raise ValueError(f"--scheduler {scheduler}: the cluster has no workers")
        parts = partition(n_rep, k)
        wl = client.scatter(workload, broadcast=True)
        t1 = time.perf_counter()
        run.seconds["start"] = t1 - t0
        futs = [client.submit(ShardWorker, sc, seed, wl, p.start, p.stop, reasons, buffers, stop_when_drained,
                              new_recorder, actor=True, workers=[addrs[i]], pure=False) for i, p in enumerate(parts)]
        actors = [f.result() for f in futs]  # (each worker builds its replicas meanwhile)
        run.description = f"{k} workers ({cluster and 'local processes' or scheduler})"
        run.workers, run.scheduler, run.window_s = k, scheduler, (R if R < INF else None)
        bounds = np.array([p.start for p in parts] + [n_rep])
        snap: list = [np.zeros(n_rep, dtype=np.int64), np.zeros(n_rep, dtype=np.int64), None]

        def tree(kind: str):
            if snap[2] is None:
                snap[2] = StaticLoads(snap[0], snap[1])
            return snap[2].requests() if kind == "requests" else snap[2].tokens(0.0)

        for a in [a.status() for a in actors]:  # (the builds are done: the actors answer)
            a.result()
        t2 = time.perf_counter()
        run.seconds["build"] = t2 - t1
        view = LoadView(n_rep, lambda: snap[0], lambda: snap[1], tree)
        router, klass = run.router, table.klass

        def call(rids, h: float, shut_at):
            reps = run.replica_of[rids]
            warm = None
            if 0 <= warmup_id < n and len(rids) and rids[0] <= warmup_id <= rids[-1]:
                warm = (int(warmup_id), float(arr[warmup_id]), int(run.replica_of[warmup_id]))
            futs = []
            for w, a in enumerate(actors):
                sel = (reps >= bounds[w]) & (reps < bounds[w + 1])
                futs.append(a.window(rids[sel], reps[sel], h, shut_at, warm))
            out = [f.result() for f in futs]
            run.windows += 1
            if h < INF:
                snap[0] = np.concatenate([o[0] for o in out])
                snap[1] = np.concatenate([o[1] for o in out])
                snap[2] = None

        def route(i: int, j: int) -> np.ndarray:
            rids = np.arange(i, j, dtype=np.int64)
            if router.reads_load:
                for rid in rids.tolist():
                    run.replica_of[rid] = router.choose(rid, int(klass[rid]), view)
            else:
                run.replica_of[rids] = router.choose_many(j - i)
            return rids

        h, i = 0.0, 0
        while True:
            j = int(np.searchsorted(arr, h, side="right")) if h < INF else n
            rids = route(i, j)
            if j == n:
                call(rids, INF, float(arr[-1]) if n else -INF)
                break
            call(rids, h, None)
            i = j
            nh = h + R
            if arr[i] > nh:  # windows without arrivals: only the snapshot before the next one counts
                while nh + R < arr[i]:
                    nh += R
                call(np.empty(0, dtype=np.int64), nh, None)
                nh += R
            h = nh
        t3 = time.perf_counter()
        run.seconds["windows"] = t3 - t2
        stats = [a.status().result() for a in actors]
        run.now = max(s[1] for s in stats)
        run.worker_cpu = [s[2] for s in stats]
        run.worker_start = [s[3] for s in stats]
        for a in [a.finish(run.now) for a in actors]:
            rows, cols, outs, infos = a.result()
            for name, v in cols.items():
                getattr(table, name)[rows] = v
            run.engines.extend(outs)
            run.replicas.extend(infos)
        run.seconds["gather"] = time.perf_counter() - t3
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
