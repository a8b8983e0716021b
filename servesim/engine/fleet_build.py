"""Build every run's fleet: one request table, engines per replica group, the inbox, the router.

A scenario without ``cluster:`` is a fleet of one replica, built here like any other (one build
path). Every replica group (``Scenario.replica_groups``) is built from its own one-replica
scenario (engine/build.py ``build_replica``), with a routed inbox unless the fleet is solo
(``build_fleet``). A replica with
``pipeline_parallel_size`` ``pp > 1`` is ``pp`` engines -- vLLM's virtual engines: each has its own
scheduler and running set and ``1/pp`` of the replica's KV blocks (vLLM divides
``num_gpu_blocks`` by the pipeline size), and every batch traverses all stages, so its iteration
takes the whole pipeline's time (the step-time models price all layers, plus a send/recv per
stage boundary). ``pp`` batches are in flight at once, one per virtual engine: throughput rises
with the stage count while a token's latency includes every stage (docs/cluster.md says what
this leaves out).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from servesim.engine.api_queue import queue_arrivals
from servesim.engine.build import arrival_cap, build_replica, client_columns, closed_groups, send_first_requests
from servesim.engine.cluster import Fleet
from servesim.engine.driver import Engine
from servesim.engine.fleet_engine import FleetInbox
from servesim.engine.router import make_router
from servesim.memory import MemoryPlan, plan_memory
from servesim.request import RequestTable, Workload
from servesim.sched.state import STEP_BUFFER, new_scalars, new_state, request_arrays
from servesim.workload.streams import stream

INF = float("inf")
PREROUTE = True  # route everything first when the routes cannot depend on the replicas (Fleet.prerouted)
SOLO = True  # a fleet of one engine without delays keeps its arrivals in the engine's own inbox (Fleet.solo)


@dataclass
class ReplicaInfo:
    group: str
    gpu: str
    tp: int
    pp: int
    servers: tuple[int, ...]  # server of each stage
    engines: list[int]
    step_model: str
    model: object = None  # the step-time model itself


#: a fleet engine's recorder rows per request of its share of the run, and the least it gets
SHARE_ROWS, MIN_ROWS = 32, 512


def fleet_buffers(n_engines: int, n_requests: int | None = None) -> tuple[int, int]:
    """(fast-path run steps, recorder rows) per engine; its ITL buffer takes half the rows
    (engine/build.py). A lone engine gets the full sizes (its results bit for bit). A fleet's
    engines get what their share of the run's ``n_requests`` needs (``SHARE_ROWS`` rows a
    request, a power of two, at least ``MIN_ROWS``), and, whatever the run, sizes halved with
    each doubling of the fleet past 256 engines (at least 2,048 rows), so the fleet's scratch and
    recorder buffers stay near 1.7 GB of address space (6.6 MB an engine at full size: 4,096
    replicas asked for 27 GB, which a container with a memory limit refuses; 16,384 replicas of
    20,000 requests peaked at 11.4 GB before the share rule). Smaller buffers only cut fast-path
    runs and flush the recorder more often: every request's timestamps are the same; time
    averages (KV, busy share) are summed in other chunks and may move in the last bits
    (tests/test_cluster_identity.py)."""
    rows = STEP_BUFFER
    while rows > 2048 and n_engines * rows > 256 * STEP_BUFFER:
        rows //= 2
    if n_engines > 1 and n_requests is not None:
        share = -(-max(int(n_requests), 1) // n_engines)
        want = max(MIN_ROWS, 1 << (SHARE_ROWS * share - 1).bit_length())
        rows = min(rows, want)
    return rows // 2, rows


def build_fleet(sc, table: RequestTable, workload: Workload, seed: int, env, *, new_recorder: Callable,
                force_python: Callable | None = None, step_model=None, on_iteration=None,
                user: Callable | None = None, kernel_overrides: dict | None = None,
                buffers: tuple[int, int] | None = None, stop_when_drained: bool = True,
                progress: Callable[[int], None] | None = None, only: range | None = None):
    """``(fleet, engines, replica infos)``. ``new_recorder()``: an engine's recorder (the
    metrics floor's, handed down); ``force_python(group_scenario)``: the reasons that group must
    run uncompiled, or None; ``user(group_scenario)``: a user policy or None. ValueError (one
    line, naming the group) when a group's model does not fit its GPUs.

    A fleet of one engine with no delay to add (every scenario without ``cluster:``, and a
    ``cluster:`` of one replica without delays) is *solo*: the router has no decision to make,
    so the engine keeps its arrivals in its own inbox -- open-loop cursor, closed loops, the
    arrival cap, the warm-up request (engine/inbox.py) -- and runs to the next SimPy event
    without returning per arrival or per completion (``Fleet._run_solo``). The same kernel, the
    same results as routing each request to it (tests/test_cluster_identity.py, ``SOLO = False``).

    ``only``: build just these replicas (a shard of a fleet run over several processes,
    engine/shard.py) and return ``(None, {engine index: engine}, {replica: info})`` -- engine and
    replica indices stay the whole fleet's, so each engine is built exactly as in one process."""
    from servesim.kv.factory import SharedLinks, build_kv
    from servesim.perf.build import build_step_model

    n = table.n
    groups = closed_groups(sc, table, workload, seed)  # (may copy the arrival column: first)
    closed = bool(groups)
    delay_in, delay_out = sc.delay_in_s, sc.delay_out_s
    n_engines = sum(g.replicas * g.scenario.pp for g in sc.replica_groups)
    solo = SOLO and n_engines == 1 and not delay_in and not delay_out and only is None
    if closed and sc.engine.api_server_count is not None:  # (a workload handed in: scenario.py checks its own)
        raise ValueError(f"engine.api_server_count {sc.engine.api_server_count}: not with a closed loop (its "
                         f"clients send from inside the engine); allowed: null, or open-loop arrivals")
    queue_arrivals(sc, table)  # the request path: delay_in, or a queue of API servers (engine/api_queue.py)
    object_kv = any(force_python(g.scenario) is not None or g.scenario.engine.enable_prefix_caching
                    for g in sc.replica_groups)
    shared = None if solo else request_arrays(n, object_kv=True if object_kv else False, routed=True)
    if buffers is None:
        buffers = fleet_buffers(n_engines, n)
    scalars = np.repeat(new_scalars().view(np.ndarray), n_engines).view(np.recarray)  # one row each
    placement = sc.placement
    engines: list[Engine] = []
    replicas: list[ReplicaInfo] = []
    members: list[list[int]] = []
    factories: list[Callable] = []  # engine i afresh (a replica restarted after a failure)
    shared_links = None if solo else SharedLinks(sc)  # KV-tier links every replica uses (kv_tiers[i].shared_link)
    r = 0
    ei = 0  # the next engine's index in the whole fleet
    built: dict[int, Engine] = {}  # (``only``)
    infos: dict[int, ReplicaInfo] = {}
    for gi, g in enumerate(sc.replica_groups):
        gsc = g.scenario
        where = "" if sc.cluster.groups is None else f"{g.label}: "
        try:
            plan = plan_memory(gsc)
        except ValueError as exc:  # the model does not fit
            raise ValueError(f"{where}{exc}") from None
        pp = gsc.pp
        if plan.num_blocks // pp < 1:
            raise ValueError(f"{where}{plan.num_blocks} KV blocks cannot be shared by pipeline_parallel_size {pp} "
                             f"virtual engines (each gets blocks // {pp}); give the replica more KV memory")
        ve_plan = replace(plan, num_blocks=plan.num_blocks // pp,
                          kv_bytes=plan.kv_bytes // pp) if pp > 1 else plan
        why = force_python(gsc)
        u = user(gsc) if user is not None else None
        models: dict[int, object] = {}
        for _ in range(g.replicas):
            if only is not None and r not in only:
                ei += pp
                r += 1
                continue
            hops = placement.cross_hops(r)
            if step_model is not None:
                model = step_model
            elif hops not in models:
                model = models[hops] = build_step_model(gsc, hops)
            else:
                model = models[hops]
            ids = []
            for _v in range(pp):
                def make(rec, i=ei, gsc=gsc, ve_plan=ve_plan, model=model, why=why, u=u, plan=plan):
                    """Engine ``i`` as built (fresh: empty queues, an empty KV pool) over ``rec``."""
                    kv = build_kv(gsc, ve_plan, table, workload, env, shared_links)
                    return build_replica(gsc, table, kv, model, rec, seed, workload=workload,
                                         on_iteration=on_iteration, progress=progress if solo else None,
                                         kv_bytes_per_token=plan.kv_bytes_per_token,
                                         force_python=why, spec=u.spec if u else None,
                                         user_parts={**(u.overrides if u else {}), **(kernel_overrides or {})},
                                         buffers=buffers, stop_when_drained=stop_when_drained, routed=not solo,
                                         report_ended=closed and not solo, shared=shared, scalars=scalars[i:i + 1],
                                         groups=groups if solo else (), index=i, plan=ve_plan, direct=solo)

                ids.append(ei)
                factories.append(make)
                engines.append(make(new_recorder(buffers[1])))
                built[ei] = engines[-1]
                ei += 1
            members.append(ids)
            replicas.append(ReplicaInfo(g.name, gsc.hardware.gpu, gsc.tp, pp, placement.stages[r], ids,
                                        model.describe(), model))
            infos[r] = replicas[-1]
            r += 1
    if only is not None:
        return None, built, infos
    inbox = None if solo else fleet_inbox(sc, table, workload, groups, engines[0].cfg, delay_in,
                                          compiled=all(e.path == "compiled" for e in engines))
    router = make_router(sc.cluster, len(members), workload, stream(seed, "router"))
    warmup = sc.stop.warmup_requests
    fleet = Fleet(engines, members, router, inbox, table, closed=closed, delay_in=delay_in, delay_out=delay_out,
                  warmup_id=warmup if 0 < warmup < n else -1, progress=progress, scalars=scalars, solo=solo)
    fleet.factories = factories
    router.attach(fleet)  # (a router that reads the replicas' caches: engine/prefix_router.py)
    fleet.lone = not sc.is_fleet  # no cluster: the scenario has no router to act on (engine/processes.py)
    # engines on a shared link must reach it in time order: each advances only up to the next
    # other engine's event (Fleet.coupled), which routing everything first cannot give
    fleet.coupled = not solo and len(shared_links) > 0 and len(engines) > 1
    fleet.prerouted = (PREROUTE and not closed and not router.reads_load and not fleet.coupled
                       and all(len(m) == 1 for m in members))
    return fleet, engines, replicas


def fleet_inbox(sc, table: RequestTable, workload: Workload, groups: tuple, cfg0, delay_in: float, *,
                compiled: bool) -> FleetInbox:
    """The fleet's arrivals as a lone replica's inbox: open-loop cursor, closed loops, the cap."""
    n = table.n
    closed = bool(groups)
    cfg = cfg0._replace(routed=False, report_ended=False, closed=closed,
                        max_arrivals=arrival_cap(sc, workload, n), warmup_id=-1, n=n)
    s = new_scalars()
    st = new_state(table, s=s[0], run_cap=1, object_kv=False, **client_columns(groups, n),
                   class_slots=np.zeros(7, dtype=np.int64),
                   run_steps=1, step_buffer=4, shared=request_arrays(0, False, False))
    send_first_requests(st, s[0], table, groups, delay_in)
    return FleetInbox(cfg, st, s, compiled)

