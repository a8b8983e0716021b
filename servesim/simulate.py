"""build -> run -> post-process -> Result. No I/O here; the CLI and report write files."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import simpy

from servesim.engine.waits import close_open_waits
from servesim.errors import ScenarioError
from servesim.memory import MemoryPlan
from servesim.metrics.collect import Recorder, table_arrivals
from servesim.metrics.flat import flat_metrics
from servesim.metrics.runfiles import (  # noqa: F401 (the run folder's rules: callers import them from here too)
    REPLICATED_FILES,
    RUN_FILES,
    _finite,
    clear_earlier_run,
    holds_run,
    stale_charts,
    summary_json,
)
from servesim.metrics.sketch import LogSketch
from servesim.metrics.summary import (Labels, build_summary, latency_sketches, pool_slots, request_frame, request_labels,
                                      timeseries_columns, timeseries_frame)
from servesim.perf.base import StepTimeModel
from servesim.perf.extrapolation import report as extrapolation_report
from servesim.perf.select import provenance as step_provenance
from servesim.policy_catalog import python_only_reasons
from servesim.fields import MAX_SECONDS
from servesim.request import TIME_BOUND_WHY, RequestTable, Workload
from servesim.resolved import resolved_info
from servesim.scenario import Scenario
from servesim.config.arrivals import ClosedArrival
from servesim.workload.generate import FASTEST_REQUEST_S, generate_workload
from servesim.config.streams import StreamSpec

if TYPE_CHECKING:
    import pandas as pd

    from servesim.engine.cluster import Fleet


@dataclass
class Result:
    """What one simulation produced. ``requests`` is one row per request; ``summary`` the dict
    written to ``summary.json``; ``timeseries`` the binned KV/queue signals."""

    scenario: Scenario
    summary: dict
    table: RequestTable = field(repr=False)
    recorder: Recorder = field(repr=False)
    memory: MemoryPlan
    step_model: str
    workload_notes: tuple[str, ...] = ()
    labels: Labels | None = field(default=None, repr=False)
    resolved_yaml: str = field(default="", repr=False)  # scenario.resolved.yaml (servesim/resolved.py)
    kv_slots: int | None = None  # the pool's token slots (a fleet: each engine's blocks × its own block size)

    @property
    def pool_slots(self) -> int:
        """Token slots of the KV pool the time series' fragmentation shares are of."""
        if self.kv_slots is not None:
            return self.kv_slots
        return self.memory.num_blocks * self.scenario.engine.block_size

    @cached_property
    def requests(self) -> "pd.DataFrame":
        return request_frame(self.table, self.labels)

    @cached_property
    def timeseries(self) -> "pd.DataFrame":
        return timeseries_frame(self.recorder, self.memory.num_blocks, self.scenario.engine.block_size,
                                self.pool_slots)

    @cached_property
    def sketches(self) -> dict[str, LogSketch]:
        """Mergeable quantile sketches (1 % relative error) of the measured latencies, for sweeps."""
        return latency_sketches(self.table, self.recorder, self.scenario.stop.warmup_requests)

    def summary_frame(self) -> "pd.DataFrame":
        """The summary as one row of flat metrics (``ttft_p99``, ``req_per_s``, ... see
        :mod:`servesim.metrics.flat`), the row format of sweeps and ``simulate_many``."""
        import pandas as pd

        return pd.DataFrame([{"scenario": self.scenario.name, "seed": self.summary["seed"],
                              **flat_metrics(self.summary), "wall_s": self.summary["wall_s"]}])

    def write(self, out_dir: str | Path) -> Path:
        """Write the run's files into ``out_dir`` (created if needed). Files of an earlier run
        there are replaced as a set: all are removed first, so two runs' files never mix; each
        file is written under a temporary name and renamed when complete. Nothing is written
        outside ``out_dir``: a symlink in the way (a run file or a temporary name) is replaced,
        never followed."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        clear_earlier_run(out)
        from servesim.metrics.output import write_columns_parquet, write_requests_parquet  # (pyarrow)

        writers = {
            "requests.parquet": lambda p: write_requests_parquet(self.table, p, self.labels),
            "timeseries.parquet": lambda p: write_columns_parquet(
                timeseries_columns(self.recorder, self.memory.num_blocks, self.scenario.engine.block_size,
                                   self.pool_slots), p),
            "summary.json": lambda p: p.write_text(summary_json(self.summary)),
            "sketches.json": lambda p: p.write_text(
                json.dumps(_finite({k: v.to_dict() for k, v in self.sketches.items()}), allow_nan=False) + "\n"),
        }
        if self.resolved_yaml:
            writers["scenario.resolved.yaml"] = lambda p: p.write_text(self.resolved_yaml)
        for name, write in writers.items():
            tmp = out / f".{name}.partial"
            tmp.unlink(missing_ok=True)  # a leftover (or planted symlink) is removed, never written through
            write(tmp)
            tmp.replace(out / name)
        return out


IterationHook = Callable[[float, float, np.ndarray, np.ndarray], None]


@dataclass
class Built:
    """A simulation ready to run (exposed for tests that want to observe iterations)."""

    scenario: Scenario
    env: simpy.Environment
    replica: "Fleet"  # the run's fleet (a lone replica is a fleet of one: ``Fleet.solo``)
    table: RequestTable
    recorder: Recorder
    memory: MemoryPlan
    model: StepTimeModel
    workload: Workload
    kv: object  # one engine's KV pool (kv/kernels.py KVState) or prefix-cache manager (None: several engines)
    fleet: "FleetParts | None" = None  # ``cluster:`` runs: engines and replicas (the summary's cluster block)
    main: object = None  # the fleet's SimPy process: the run ends with it
    processes: list = field(default_factory=list)  # other processes on the clock (engine/processes.py)
    handle: object = None  # their FleetHandle


@dataclass
class FleetParts:
    engines: list  # servesim.engine.fleet_build.EngineInfo per engine
    replicas: list  # ReplicaInfo per replica


def engine_reasons(sc: Scenario, *, custom_model: bool, on_iteration: bool, user_policy: bool) -> list[str]:
    """Why this run needs the uncompiled engine (empty: every piece is built in and compiles).
    Declared capabilities (servesim/policy_catalog.py), not guesses from the objects."""
    why = python_only_reasons(sc.engine, bool(sc.kv_tiers))
    if custom_model:
        why.append("a step-time model of your own")
    if on_iteration:
        why.append("an iteration hook")
    if user_policy:
        why.append(f"policy parts of your own ({sc.engine.scheduler})")
    return why


def build(scenario: Scenario, seed: int | None = None, workload: Workload | None = None,
          step_model: StepTimeModel | None = None, on_iteration: IterationHook | None = None,
          progress: Callable[[int], None] | None = None, *, cold: str = "compile",
          buffers: tuple[int, int] | None = None, kernel_overrides: dict | None = None,
          processes: list | None = None, workers: int | None = None, scheduler: str | None = None) -> Built:
    """Everything one run needs. ``cold``: what ``sim.engine: auto`` does when the compiled
    engine is not yet built on this machine (servesim/jit.py ``compiled_ready``) -- ``compile``
    it now (one to two minutes, once per kernel version; the library's default), run ``python``
    (the same source uncompiled: builds that only print a header), or ``auto``: Python for a run
    of at most :data:`SMALL_RUN_REQUESTS` requests, else compile (the CLI's choice; the header
    says which). ``workers`` (default ``sim.workers``) over 1, or a Dask ``scheduler``
    (``tcp://HOST:PORT``): the fleet runs sharded over that many worker processes, with the
    results of one process (:func:`build_sharded`)."""
    from servesim.fields import MAX_SEED

    if cold not in ("compile", "python", "auto"):
        raise ValueError(f"cold {cold!r}: one of compile, python, auto")
    sc = scenario
    seed = sc.seed if seed is None else seed

    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed <= MAX_SEED:
        raise ScenarioError(f"seed {seed!r}: a seed is an integer in 0..{MAX_SEED}")
    seed = int(seed)
    n_workers = sc.sim.workers if workers is None else workers
    if n_workers > 1 or scheduler is not None:
        extra = [what for what, given in (("a step-time model of your own", step_model),
                                          ("an iteration hook", on_iteration), ("kernel overrides", kernel_overrides),
                                          ("processes", processes)) if given]
        if extra:
            raise ScenarioError(f"sim.workers = {n_workers}: {extra[0]} cannot be sent to worker processes "
                                f"(allowed: none; or sim.workers: 1)")
        if scheduler is not None and n_workers == 1:  # (all of the scheduler's workers, up to one per replica)
            n_workers = None
        return build_sharded(sc, seed, workload, workers=n_workers, scheduler=scheduler, cold=cold, buffers=buffers)
    from servesim.engine.processes import scenario_processes

    try:
        fns = scenario_processes(sc, processes, seed)
    except ValueError as exc:
        raise ScenarioError(str(exc)) from None
    return _with_processes(_build(sc, seed, workload, step_model, on_iteration, progress, cold=cold,
                                  buffers=buffers, kernel_overrides=kernel_overrides, own_arrivals=bool(fns)),
                           fns)


def _with_processes(b: Built, fns: list) -> Built:
    """Start the run's other processes (engine/processes.py) beside its fleet process."""
    from servesim.engine.processes import start

    try:
        b.handle = start(b.scenario, b.env, b.replica, b.table, fns)
    except ValueError as exc:
        raise ScenarioError(str(exc)) from None
    b.processes = fns
    return b


# a cold machine's ``servesim run`` of at most this many requests takes the Python engine: at
# ~700 requests per CPU second (scenarios/quickstart.yaml on the roofline) it ends sooner than numba compiles the
# engine (1-2 min on two cores); a larger run compiles it first (benchmarks/RESULTS.md, 2026-12-05)
SMALL_RUN_REQUESTS = 20_000


def python_reasons(sc: Scenario, *, custom_model: bool, on_iteration: bool, user, kernel_overrides,
                   cold: str, n_requests: int) -> list[str]:
    """Why one replica of ``sc`` runs uncompiled (empty: compiled); ScenarioError when
    ``sim.engine: compiled`` cannot be honoured."""
    from servesim.jit import compiled_ready

    why = engine_reasons(sc, custom_model=custom_model, on_iteration=on_iteration, user_policy=user is not None)
    if sc.sim.engine == "compiled" and why:
        raise ScenarioError(f"sim.engine = 'compiled': this run needs the Python engine ({'; '.join(why)}); "
                            f"use sim.engine: auto or python")
    if kernel_overrides:
        why.append("kernels bound to Python callables")
    if sc.sim.engine == "python":
        why.append("sim.engine: python")
    elif not why and sc.sim.engine == "auto" and cold != "compile" and not compiled_ready():
        if cold == "python":
            why.append("the compiled engine is not built on this machine yet")
        elif n_requests <= SMALL_RUN_REQUESTS:
            why.append(f"the compiled engine is not built on this machine yet; {n_requests:,} requests run "
                       f"sooner uncompiled than it compiles (1-2 min, once; runs over {SMALL_RUN_REQUESTS:,} "
                       f"requests compile it)")
    return why


def _build(sc: Scenario, seed: int, workload, step_model, on_iteration, progress, *, cold: str,
           buffers, kernel_overrides, own_arrivals: bool = False) -> Built:
    """Everything one run needs (servesim/engine/fleet_build.py): replicas behind a router, or a lone
    replica -- a fleet of one, whose engine keeps its arrivals in its own inbox (``Fleet.solo``)."""
    from servesim.engine.fleet_build import build_fleet
    from servesim.perf.base import KernelModel
    from servesim.sched.custom import user_policy_loader

    wl = workload
    if wl is None:
        from servesim.perf.build import build_step_model

        models = None  # (built only for a closed loop that needs them: fleet_build builds its own)
        if _duration_only_closed_loop(sc):
            models = [step_model] if step_model is not None else [build_step_model(g.scenario)
                                                                   for g in sc.replica_groups]
        wl = scenario_workload(sc, seed, models)
    table = RequestTable(wl)
    if own_arrivals and np.shares_memory(table.arrival, wl.arrival_s):
        table.arrival = table.arrival.copy()  # a rate change moves arrivals: not the caller's workload's
    env = simpy.Environment()
    user = user_policy_loader()

    reasons: dict = {}

    def force_python(gsc):
        k = id(gsc)
        if k not in reasons:
            why = python_reasons(gsc, custom_model=step_model is not None and not isinstance(step_model, KernelModel),
                                 on_iteration=on_iteration is not None, user=user(gsc),
                                 kernel_overrides=kernel_overrides, cold=cold, n_requests=len(wl))
            reasons[k] = "; ".join(why) if why else None
        return reasons[k]

    drained = sc.stop.requests is not None and len(wl) >= sc.stop.requests
    try:
        fleet, engines, replicas = build_fleet(
            sc, table, wl, seed, env, new_recorder=lambda rows=None: Recorder(sc.metrics.timeseries_bin_s, rows),
            force_python=force_python,
            step_model=step_model, on_iteration=on_iteration, user=user, kernel_overrides=kernel_overrides,
            buffers=buffers, stop_when_drained=drained, progress=progress)
    except ValueError as exc:  # a model that does not fit, a router that needs what the workload lacks
        raise ScenarioError(f"{sc.name}: {exc}") from None
    if fleet.solo:  # waits during a step count the arrivals the engine's inbox holds (metrics/collect.py)
        engines[0].recorder.arrivals_between = table_arrivals(table, closed_rows(wl))
    main = env.process(fleet.process(env))
    model = step_model if step_model is not None else \
        replicas[0].model if len(replicas) == 1 else _FleetModel(replicas)
    return Built(sc, env, fleet, table, engines[0].recorder, engines[0].plan, model, wl,
                 engines[0].kv if len(engines) == 1 else None,
                 FleetParts(engines, replicas) if sc.is_fleet else None, main=main)


def build_sharded(sc: Scenario, seed: int, workload: Workload | None = None, *, workers: int | None,
                  scheduler: str | None = None, cold: str = "compile", buffers: tuple[int, int] | None = None) -> Built:
    """A fleet run sharded over ``workers`` Dask worker processes (a LocalCluster, or those of
    ``scheduler``): replicas partitioned, synchronised in windows of ``cluster.router_refresh_s``,
    the results of one process with that refresh interval (servesim/engine/shard.py). The
    workers start when the run does (``run_built``). ScenarioError (one line) for what sharding
    cannot reproduce exactly. ``workers`` None: every worker of ``scheduler`` (at most one per replica)."""
    from functools import partial

    from servesim.engine.api_queue import queue_arrivals
    from servesim.engine.fleet_build import fleet_buffers
    from servesim.engine.router import make_router
    from servesim.engine.shard import ShardedRun, run_sharded, shard_refusal
    from servesim.memory import plan_memory
    from servesim.sched.custom import user_policy_loader
    from servesim.workload.streams import stream

    if workers is None and scheduler is None:
        raise ScenarioError("workers None: give a number of worker processes, or a scheduler")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ScenarioError(f"workers {workers!r}: a number of worker processes, at least 1")
    why = shard_refusal(sc, workers)
    if why is not None:
        raise ScenarioError(why)
    wl = workload if workload is not None else scenario_workload(sc, seed)
    table = RequestTable(wl)
    queue_arrivals(sc, table)  # (as engine/fleet_build.py: requests reach the router delay_in after their send)
    user = user_policy_loader()  # (a bad policy: its one line here, before any worker starts)
    reasons = []
    for g in sc.replica_groups:
        gw = python_reasons(g.scenario, custom_model=False, on_iteration=False, user=user(g.scenario),
                            kernel_overrides=None, cold=cold, n_requests=len(wl))
        reasons.append("; ".join(gw) if gw else None)
    n_engines = sum(g.replicas * g.scenario.pp for g in sc.replica_groups)
    buffers = buffers if buffers is not None else fleet_buffers(n_engines, len(wl))
    try:
        router = make_router(sc.cluster, sc.num_replicas, wl, stream(seed, "router"))
        plan = plan_memory(sc.replica_groups[0].scenario)
    except ValueError as exc:
        raise ScenarioError(f"{sc.name}: {exc}") from None
    run = ShardedRun(router, np.full(table.n, -1, dtype=np.int32))
    py = sorted({w for w in reasons if w})
    run.path = "python" if py else "compiled"
    windows = (f"in windows of cluster.router_refresh_s = {sc.cluster.router_refresh_s:g} s" if router.reads_load
               else f"in one window (router {sc.cluster.router!r} reads no loads)")
    run.why = "; ".join(py + [f"sharded over {workers} Dask worker processes {windows}" if scheduler is None
                              else f"sharded over {workers or 'the'} workers of {scheduler} {windows}"])
    warmup = sc.stop.warmup_requests
    drained = sc.stop.requests is not None and len(wl) >= sc.stop.requests
    if scheduler is None:  # (its loading overlaps what is left of this build: servesim/shard_preload.py)
        from servesim.engine.shard import start_fork_server

        try:
            start_fork_server(run.path == "compiled")
        except (RuntimeError, OSError):  # (a script's worker re-importing it: the cluster's start says so)
            pass

    def go():
        from servesim.request import PENDING

        try:
            run_sharded(sc, seed, wl, table, run, workers=workers, scheduler=scheduler, reasons=reasons,
                        buffers=buffers, stop_when_drained=drained,
                        new_recorder=partial(Recorder, sc.metrics.timeseries_bin_s),
                        warmup_id=warmup if 0 < warmup < table.n else -1)
        except ValueError as exc:
            raise ScenarioError(str(exc)) from None
        run.replica_of[table.status == PENDING] = -1  # (sent by the router, never reached its replica)

    b = Built(sc, _ShardClock(go), run, table, Recorder(sc.metrics.timeseries_bin_s), plan, _ShardModel(run),
              wl, None, FleetParts(run.engines, run.replicas))
    from servesim.engine.processes import scenario_processes

    fns = scenario_processes(sc, None, seed)  # (the router's refreshes only: shard_refusal)
    if fns:  # the summary's processes and scaling blocks, as one process writes them
        from servesim.engine.processes import FleetHandle

        handle = FleetHandle(None, _HandleFleet(sc), table)
        handle._gpus = np.array([g.scenario.gpus_per_replica for g in sc.replica_groups for _ in range(g.replicas)],
                                dtype=np.int64)
        b.handle, b.processes = handle, fns
    return b


class _HandleFleet:
    """What a FleetHandle reads of a sharded fleet: its replicas and delay; no retried arrivals."""

    def __init__(self, sc):
        self.replicas = [[r] for r in range(sc.num_replicas)]
        self.delay_in = sc.delay_in_s

    def restore_arrivals(self) -> None:
        pass


class _ShardClock:
    """``Built.env`` of a sharded run: ``run()`` runs it (there is no SimPy clock to share)."""

    def __init__(self, go):
        self._go = go

    def run(self, until=None):
        self._go()


class _ShardModel:
    """The step-time line of a sharded fleet: its replicas' models, known once the workers built them."""

    name = "fleet"

    def __init__(self, run):
        self._run = run

    def describe(self) -> str:
        reps = self._run.replicas
        return "; ".join(dict.fromkeys(r.step_model for r in reps)) if reps else "built in the workers"


class _FleetModel:
    """The run header's step-time line for a fleet: each distinct replica model."""

    name = "fleet"

    def __init__(self, replicas):
        self._text = "; ".join(dict.fromkeys(r.step_model for r in replicas))

    def describe(self) -> str:
        return self._text


def scenario_workload(sc: Scenario, seed: int | None = None, models: list | None = None) -> Workload:
    """The workload of ``sc`` (the workload package takes the workload block and the stop limits).
    ``models``: the run's step-time models; a closed loop stopped by duration alone draws enough
    requests for the fastest one they can serve (:func:`fastest_request_s`)."""
    fastest = fastest_request_s(sc, models) if models and _duration_only_closed_loop(sc) else FASTEST_REQUEST_S
    return generate_workload(sc.workload, seed=sc.seed if seed is None else seed, base_dir=sc.base_dir,
                             max_requests=sc.stop.requests, duration_s=sc.stop.duration_s, fastest_request_s=fastest)


def _duration_only_closed_loop(sc: Scenario) -> bool:
    w = sc.workload
    closed = isinstance(w.arrival, ClosedArrival) or any(isinstance(s.arrival, ClosedArrival) for s in w.streams or ())
    return closed and sc.stop.requests is None


def fastest_request_s(sc: Scenario, models: list) -> float:
    """The shortest time a request can take: one iteration of one token, the cheapest of the
    run's step-time models, plus the engine's CPU overhead of an iteration of one request (the
    lowest over the replica groups). A closed loop's clients send at most one request each per
    this plus a think time, which bounds what it must draw up front."""
    one, zero = np.ones(1, dtype=np.int64), np.zeros(1, dtype=np.int64)
    step = min(float(m.predict(one, zero)) for m in models)
    cpu = min(g.scenario.engine.cpu_overhead_s + g.scenario.engine.cpu_overhead_per_seq_s for g in sc.replica_groups)
    return max(step + cpu, 1e-6)


def stream_specs(sc: Scenario, wl: Workload) -> tuple[StreamSpec, ...]:
    """The streams results are reported by: the scenario's, or (a workload handed in by the caller)
    one unlabelled stream per name the workload carries."""
    specs = sc.workload.stream_specs()
    if tuple(s.name for s in specs) == wl.stream_names:
        return specs
    return tuple(StreamSpec(i, name, None, None) for i, name in enumerate(wl.stream_names))


def closed_rows(wl: Workload) -> int:
    """How many leading rows are closed-loop requests (their arrivals decided during the run)."""
    if wl.closed_groups:
        return max(g.hi for g in wl.closed_groups)
    return len(wl) if len(wl) and np.isnan(wl.arrival_s[0]) else 0


def run_built(b: Built, seed: int | None = None) -> Result:
    from servesim.metrics.cluster import cluster_summary, fleet_kv_report, merge_recorders, restore_client_times

    sc = b.scenario
    fleet = b.replica  # (a lone replica: a fleet of one)
    engines = fleet.engines
    t0 = time.perf_counter()
    b.env.run(until=b.main if b.handle is not None else None)  # (other processes may run forever)
    wall = time.perf_counter() - t0
    if b.handle is not None:
        b.handle.finish(fleet.now)  # (retried requests' first arrivals back)
    restore_client_times(b.table, sc.delay_in_s, sc.delay_out_s)
    if b.fleet is not None:  # (``cluster:``: the replica each request went to)
        b.table.replica = fleet.replica_of
    several = len(engines) > 1
    rec = merge_recorders([e.recorder for e in engines]) if several else engines[0].recorder
    memory = replace(b.memory, num_blocks=sum(e.plan.num_blocks for e in engines)) if several else b.memory
    specs = stream_specs(sc, b.workload)
    sim_time = fleet.now
    b.table.end_s = sim_time
    for e in engines:
        if e.st is not None:  # (a sharded run's engines closed theirs in their workers)
            close_open_waits(e.st, sim_time)  # requests still waiting: blocked seconds up to the end
    if not sim_time <= MAX_SECONDS:  # (a closed loop's arrivals are decided during the run)
        raise ScenarioError(f"the run reached simulated time {sim_time:.4g} s; {TIME_BOUND_WHY} (shorten the run: "
                            f"stop.requests, stop.duration_s, think times)")
    # a fleet's groups may differ in engine.block_size: KV slots count per engine
    pools = [(e.recorder, e.plan.num_blocks, e.plan.block_size) for e in engines] if several else None
    summary = build_summary(
        name=sc.name, seed=sc.seed if seed is None else seed, req=b.table, rec=rec,
        num_blocks=memory.num_blocks, sim_time=sim_time, wall_s=wall,
        warmup=sc.stop.warmup_requests, slo_ttft=sc.slo.ttft_s, slo_tpot=sc.slo.tpot_s,
        block_size=sc.engine.block_size, streams=specs,
        named_streams=sc.workload.streams is not None or len(specs) > 1, pools=pools,
    )
    if several:
        summary["engine"]["busy_fraction"] = float(rec.busy_s / max(sim_time, 1e-300) / len(engines))
    if any(g.scenario.engine.enable_prefix_caching for g in sc.replica_groups):  # hit rates, tiers, the TTFT effect
        from servesim.metrics.summary import latency_column, measured_mask

        meas = np.flatnonzero(measured_mask(b.table, sc.stop.warmup_requests))
        ttft = np.full(b.table.n, np.nan)
        ttft[meas] = latency_column(b.table, meas, "ttft")
        kvs = [e.kv for e in engines] + fleet.retired_kv  # (+ failed replicas')
        summary["kv"].update(fleet_kv_report(kvs, ttft))
    if b.fleet is not None:
        summary["cluster"] = cluster_summary(sc, fleet, engines, b.fleet.replicas, b.table, sim_time)
    if sc.engine.api_server_count is not None:  # the API servers' queue (engine/api_queue.py)
        from servesim.engine.api_queue import queue_summary

        summary["request_path"] = queue_summary(sc, b.table, sim_time)
    sharding = getattr(fleet, "sharding", None)
    if sharding is not None:  # (a fleet over Dask workers: servesim/engine/shard.py ShardedRun)
        summary["sharded"] = sharding()
    summary["step_model"] = step_provenance(sc)  # which model priced the iterations (servesim/perf/select.py)
    if b.handle is not None:
        from servesim.engine.processes import faults_summary, processes_summary

        summary["processes"] = processes_summary(b.handle, b.processes)
        summary["scaling"] = b.handle.scaling(sim_time)
        faults = faults_summary(b.handle)
        if faults is not None:
            summary["faults"] = faults
    summary["model"] = sc.model_shape.summary(sc.tp, sc.pp)  # params, active params, kv_bytes_per_token
    summary["extrapolation"] = extrapolation_report([e.tab for e in engines])  # share beyond the pack's grid
    resolved_text, summary["resolved_scenario"] = resolved_info(sc, seed)
    return Result(sc, summary, b.table, rec, memory, b.model.describe(), b.workload.notes,
                  request_labels(b.table, specs), resolved_text,
                  kv_slots=pool_slots(memory.num_blocks, sc.engine.block_size, pools) if pools else None)


def simulate(scenario: Scenario, seed: int | None = None, *, workload: Workload | None = None,
             step_model: StepTimeModel | None = None, on_iteration: IterationHook | None = None,
             progress: Callable[[int], None] | None = None, processes: list | None = None,
             workers: int | None = None, scheduler: str | None = None) -> Result:
    """Run one simulation of ``scenario`` (optionally with another seed) and return its Result.
    ``processes``: SimPy generator functions ``fn(env, fleet)`` run on the simulation's clock
    beside the scenario's own (docs/processes.md). ``workers`` / ``scheduler``: the fleet sharded
    over Dask worker processes (:func:`build`)."""
    b = build(scenario, seed, workload, step_model, on_iteration, progress, processes=processes, workers=workers,
              scheduler=scheduler)
    return run_built(b, seed)
