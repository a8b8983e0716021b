"""build -> run -> post-process -> Result. No I/O here; the CLI and report write files."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import simpy

from servesim.engine.inbox import INF, Inbox
from servesim.engine.replica import IterationHook, Replica
from servesim.engine.state import FINISHED, ReplicaState, RequestTable
from servesim.kv.factory import build_kv
from servesim.memory import MemoryPlan, plan_memory
from servesim.metrics.collect import Recorder
from servesim.metrics.output import latency_sketches, write_requests_parquet
from servesim.metrics.sketch import LogSketch
from servesim.metrics.summary import Labels, build_summary, request_frame, request_labels, timeseries_frame
from servesim.perf.base import StepTimeModel
from servesim.perf.build import build_step_model
from servesim.request import Workload
from servesim.resolved import resolved_info
from servesim.scenario import ClosedArrival, Scenario
from servesim.sched.base import build_policy
from servesim.workload.closed_loop import StreamInbox
from servesim.workload.generate import generate_workload
from servesim.workload.stream_config import StreamSpec
from servesim.workload.streams import stream


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

    @cached_property
    def requests(self) -> pd.DataFrame:
        return request_frame(self.table, self.labels)

    @cached_property
    def timeseries(self) -> pd.DataFrame:
        return timeseries_frame(self.recorder, self.memory.num_blocks, self.scenario.engine.block_size)

    @cached_property
    def sketches(self) -> dict[str, LogSketch]:
        """Mergeable quantile sketches (1 % relative error) of the measured latencies, for sweeps."""
        return latency_sketches(self.table, self.recorder, self.scenario.stop.warmup_requests)

    def write(self, out_dir: str | Path) -> Path:
        """Write the run's files into ``out_dir`` (created if needed). Files of an earlier run
        there are replaced as a set: all are removed first, so two runs' files never mix; each
        file is written under a temporary name and renamed when complete."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for name in RUN_FILES:
            (out / name).unlink(missing_ok=True)
        writers = {
            "requests.parquet": lambda p: write_requests_parquet(self.table, p, self.labels),
            "timeseries.parquet": lambda p: self.timeseries.to_parquet(p, index=False),
            "summary.json": lambda p: p.write_text(summary_json(self.summary)),
            "sketches.json": lambda p: p.write_text(
                json.dumps(_finite({k: v.to_dict() for k, v in self.sketches.items()}), allow_nan=False) + "\n"),
        }
        if self.resolved_yaml:
            writers["scenario.resolved.yaml"] = lambda p: p.write_text(self.resolved_yaml)
        for name, write in writers.items():
            tmp = out / f".{name}.partial"
            write(tmp)
            tmp.replace(out / name)
        return out


RUN_FILES = ("requests.parquet", "timeseries.parquet", "summary.json", "sketches.json", "scenario.resolved.yaml")


def holds_run(folder: str | Path) -> str | None:
    """The first run file ``folder`` holds (a folder an earlier run wrote into), or None."""
    f = Path(folder)
    return next((name for name in RUN_FILES if (f / name).exists()), None)


def summary_json(summary: dict) -> str:
    """``summary.json`` text: strict JSON (a non-finite float, which JSON cannot hold, is written
    as null; ``Infinity`` would make the file unreadable to strict parsers)."""
    return json.dumps(_finite(summary), indent=2, sort_keys=False, allow_nan=False) + "\n"


def _finite(x):
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    if isinstance(x, float) and not np.isfinite(x):
        return None
    return x


COMPILED_FROM_REQUESTS = 50_000


@dataclass
class Built:
    """A simulation ready to run (exposed for tests that want to observe iterations)."""

    scenario: Scenario
    env: simpy.Environment
    replica: Replica
    table: RequestTable
    recorder: Recorder
    memory: MemoryPlan
    model: StepTimeModel
    workload: Workload


def build(scenario: Scenario, seed: int | None = None, workload: Workload | None = None,
          step_model: StepTimeModel | None = None, on_iteration: IterationHook | None = None,
          progress: Callable[[int], None] | None = None) -> Built:
    sc = scenario
    seed = sc.seed if seed is None else seed
    from servesim.errors import ScenarioError
    from servesim.fields import MAX_SEED

    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed <= MAX_SEED:
        raise ScenarioError(f"seed {seed!r}: a seed is an integer in 0..{MAX_SEED}")
    seed = int(seed)
    if sc.hardware.replicas != 1:

        raise ScenarioError(
            f"hardware.replicas = {sc.hardware.replicas}: only 1 replica per simulation is supported "
            f"so far (clusters with routers come next); run replicas as separate scenarios meanwhile"
        )
    plan = plan_memory(sc)
    wl = workload if workload is not None else scenario_workload(sc, seed)
    model = step_model if step_model is not None else build_step_model(sc)
    table = RequestTable(wl)
    env = simpy.Environment()
    kv = build_kv(sc, plan, table, wl, env)
    from servesim.hardware import GPUS

    state = ReplicaState(table, kv, sc.engine.max_num_seqs, kv_bytes_per_token=plan.kv_bytes_per_token,
                         host_link_bytes_per_s=GPUS[sc.hardware.gpu].pcie_bytes_per_s)
    policy = build_policy(sc.engine, state)
    rec = Recorder(sc.metrics.timeseries_bin_s)
    arr = sc.workload.arrival
    if wl.closed_groups:  # ramped or per-stream closed loops: the workload's inbox (Python engine)
        if np.shares_memory(table.arrival, wl.arrival_s):
            table.arrival = table.arrival.copy()  # the inbox writes closed-loop arrivals
        inbox = StreamInbox(table.arrival, wl.closed_groups, ended=lambda ids: table.status[ids] >= FINISHED,
                            max_requests=sc.stop.requests)
    elif isinstance(arr, ClosedArrival) and sc.workload.streams is None and sc.workload.trace is None:
        inbox = Inbox(table.arrival, closed_clients=arr.clients, think_s=arr.think_s,
                      think_rng=stream(seed, "think"), think_exponential=arr.think_dist == "exponential")
    else:
        inbox = Inbox(table.arrival)
    # both limits: when every one of stop.requests has arrived, the run ends once they have all
    # ended (the request limit came first); when fewer arrived before duration_s, the clock runs
    # on to duration_s (no arrival falls in that idle time: it is part of the observed window)
    drained = sc.stop.requests is not None and len(wl) >= sc.stop.requests
    replica = Replica(
        env, state, policy, model, rec, inbox,
        max_model_len=sc.max_model_len,
        chunked_prefill=sc.chunks_prefill,
        max_num_batched_tokens=sc.engine.max_num_batched_tokens,
        stop_time=sc.stop.duration_s if sc.stop.duration_s is not None else INF,
        fast_path=sc.sim.fast_path,
        check_invariants=sc.sim.check_invariants,
        on_iteration=on_iteration,
        progress=progress,
        warmup_requests=sc.stop.warmup_requests,
        cpu_overhead_s=sc.engine.cpu_overhead_s,
        cpu_overhead_per_seq_s=sc.engine.cpu_overhead_per_seq_s,
        stop_when_drained=drained,
    )
    # auto: the compiled core pays ~1 s of numba start-up (and ~8 s of compilation the first time
    # on a machine): worth it from about COMPILED_FROM_REQUESTS requests on
    wants_compiled = sc.sim.engine == "compiled" or (
        sc.sim.engine == "auto" and len(wl) >= COMPILED_FROM_REQUESTS)
    if wants_compiled and wl.closed_groups:
        if sc.sim.engine == "compiled":
            from servesim.errors import ScenarioError

            raise ScenarioError("sim.engine = 'compiled': the compiled core does not support closed loops with "
                                "a ramp-up or per stream; use sim.engine: auto or python")
        wants_compiled = False
    if wants_compiled:
        from servesim.engine.compiled_replica import CompiledReplica, supported

        why_not = supported(sc, kv, policy, on_iteration, sc.sim.check_invariants)
        if why_not is None:
            replica = CompiledReplica(
                env, state, model, rec, inbox, max_model_len=sc.max_model_len,
                chunked_prefill=sc.engine.enable_chunked_prefill,
                max_num_batched_tokens=sc.engine.max_num_batched_tokens, max_num_seqs=sc.engine.max_num_seqs,
                stop_time=replica.stop_time, fast_path=sc.sim.fast_path,
                warmup_requests=sc.stop.warmup_requests, cpu_overhead_s=sc.engine.cpu_overhead_s,
                cpu_overhead_per_seq_s=sc.engine.cpu_overhead_per_seq_s, progress=progress,
                stop_when_drained=drained)
        elif sc.sim.engine == "compiled":
            from servesim.errors import ScenarioError

            raise ScenarioError(f"sim.engine = 'compiled': the compiled core does not support {why_not}; "
                                f"use sim.engine: auto or python")
    env.process(replica.process())
    return Built(sc, env, replica, table, rec, plan, model, wl)


def scenario_workload(sc: Scenario, seed: int | None = None) -> Workload:
    """The workload of ``sc`` (the workload package takes the workload block and the stop limits)."""
    return generate_workload(sc.workload, seed=sc.seed if seed is None else seed, base_dir=sc.base_dir,
                             max_requests=sc.stop.requests, duration_s=sc.stop.duration_s)


def stream_specs(sc: Scenario, wl: Workload) -> tuple[StreamSpec, ...]:
    """The streams results are reported by: the scenario's, or (a workload handed in by the caller)
    one unlabelled stream per name the workload carries."""
    specs = sc.workload.stream_specs()
    if tuple(s.name for s in specs) == wl.stream_names:
        return specs
    return tuple(StreamSpec(i, name, None, None) for i, name in enumerate(wl.stream_names))


def run_built(b: Built, seed: int | None = None) -> Result:
    sc = b.scenario
    t0 = time.perf_counter()
    b.env.run()
    wall = time.perf_counter() - t0
    specs = stream_specs(sc, b.workload)
    summary = build_summary(
        name=sc.name, seed=sc.seed if seed is None else seed, req=b.table, rec=b.recorder,
        num_blocks=b.memory.num_blocks, sim_time=b.replica.now, wall_s=wall,
        warmup=sc.stop.warmup_requests, slo_ttft=sc.slo.ttft_s, slo_tpot=sc.slo.tpot_s,
        block_size=sc.engine.block_size, streams=specs,
        named_streams=sc.workload.streams is not None or len(specs) > 1,
    )
    kv = b.replica.kv
    if hasattr(kv, "hit_tokens"):  # prefix caching: hit rates, tier traffic, the TTFT effect
        from servesim.kv.report import kv_report
        from servesim.metrics.summary import latency_column, measured_mask

        meas = np.flatnonzero(measured_mask(b.table, sc.stop.warmup_requests))
        ttft = np.full(b.table.n, np.nan)
        ttft[meas] = latency_column(b.table, meas, "ttft")
        summary["kv"].update(kv_report(kv, ttft))
    resolved_text, summary["resolved_scenario"] = resolved_info(sc, seed)
    return Result(sc, summary, b.table, b.recorder, b.memory, b.model.describe(), b.workload.notes,
                  request_labels(b.table, specs), resolved_text)


def simulate(scenario: Scenario, seed: int | None = None, *, workload: Workload | None = None,
             step_model: StepTimeModel | None = None, on_iteration: IterationHook | None = None,
             progress: Callable[[int], None] | None = None) -> Result:
    """Run one simulation of ``scenario`` (optionally with another seed) and return its Result."""
    b = build(scenario, seed, workload, step_model, on_iteration, progress)
    return run_built(b, seed)
