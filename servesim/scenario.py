"""Scenario files: typed, frozen, validated configs.

A scenario is everything one simulation needs: hardware, model, engine knobs, step-time model,
workload, stop condition, SLO. It is loaded from YAML, optionally patched by dotted-path overrides
(``--set engine.max_num_seqs=64``), and validated in one place. Any mistake becomes a
:class:`~servesim.errors.ScenarioError` whose message is one line naming the field path, the value
and what is allowed. Loading has no side effects.

Engine knob names follow the real engines (vLLM's ``max_num_seqs``, ``max_num_batched_tokens``,
``gpu_memory_utilization``, ``enable_chunked_prefill``; SGLang's ``chunked_prefill_size``,
``max_running_requests``) so users can paste their flags.
"""

from __future__ import annotations

from collections.abc import Mapping
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import (Field, PrivateAttr, ValidationError, field_validator,
                      model_validator)

from servesim.config.cluster import ClusterConfig
from servesim.config.dynamics import ProcessPath, RateScheduleConfig
from servesim.errors import ScenarioError
from servesim.fields import (
    MAX_REQUESTS,
    is_import_path,
    Seed,
)
from servesim.policy_catalog import POLICIES, policy_names, read_options
from servesim.config.engines import canonical, engine_rules, graph_rules
from servesim.config.kv import TierConfig
from servesim.models import MODELS, ModelShape, with_precision
from servesim.config.dists import (  # noqa: F401 (re-exported: scenario's public types)
    ExponentialDist, FixedDist, GeometricDist, LengthDist, LognormalDist, NormalDist, UniformDist,
)
from servesim.config.arrivals import (  # noqa: F401 (re-exported)
    ArrivalConfig, ClosedArrival, ConstantArrival, GammaArrival, PoissonArrival,
)
from servesim.config.streams import (  # noqa: F401 (re-exported)
    ClassMix, ContaminateConfig, StreamConfig, StreamSLO, WorkloadConfig,
)
from servesim.config.traces import (  # noqa: F401 (re-exported)
    ClassAssignmentConfig, LengthsConfig, ServeGenArrivalConfig, SessionsConfig, TraceConfig,
)
from servesim.config.sections import (  # noqa: F401 (re-exported: scenario's public types)
    Frozen, MAX_REPLICATIONS, StopConfig, GpuName, HardwareConfig, QuantizationName, KVCacheDtype,
    ModelShapeConfig, ModelName, ModelRefConfig, ModelField, SchedulerName, EngineConfig, ConstantStepConfig,
    pack_ref_parts, RooflineStepConfig, PackStepConfig, AutoStepConfig, StepTimeConfig, SLOConfig,
    MetricsConfig, SimConfig, POLICY_ENGINE_FIELDS, KV_FIELDS_NEED, _set_fields,
)
from servesim.config.yamlio import (  # noqa: F401 (re-exported)
    _read_model_config, _tp_fits, _merged, _first_error, _apply_override, _set_path, _as_raw, yaml_problem,
    parse_overrides, RESULT_KEYS, read_yaml_file, _drop_foreign_options, PARALLEL_PATHS, _drop_derived_gpus,
    _flow, _deep_copy,
)


# ---------------------------------------------------------------------------------- scenario
class Scenario(Frozen):
    """One simulation's configuration. ``load_notes``: what loading changed on its own (options
    of another policy dropped after ``--set engine.scheduler=...``), for the run header."""

    _load_notes: tuple[str, ...] = PrivateAttr(default=())
    _engine_notes: tuple[str, ...] = PrivateAttr(default=())
    _groups: tuple = PrivateAttr(default=())
    _placement: Any = PrivateAttr(default=None)
    _shape: Any = PrivateAttr(default=None)
    name: str = "scenario"  # labels the outputs (out/<name>/ by default)
    seed: Seed = 0  # every random stream derives from it
    stop: StopConfig = StopConfig(requests=1000)  # when the run ends
    hardware: HardwareConfig = HardwareConfig()  # GPUs and parallelism
    # a library model by name; {name | config: path to a config.json, quantization}; or an inline shape
    model: ModelField = "llama-3-8b"  # type: ignore[valid-type]
    engine: EngineConfig = EngineConfig()  # scheduler and engine knobs (vLLM / SGLang names)
    step_time: StepTimeConfig = AutoStepConfig(model="auto")  # how long an iteration takes (pack if one exists)
    workload: WorkloadConfig = WorkloadConfig()  # where requests come from
    slo: SLOConfig = SLOConfig()  # per-request targets for goodput
    metrics: MetricsConfig = MetricsConfig()  # how results are recorded
    sim: SimConfig = SimConfig()  # how to simulate (never changes results)
    # lower KV tiers below the GPU pool, in order (L2, L3); need engine.enable_prefix_caching
    kv_tiers: Annotated[list[TierConfig], Field(max_length=2)] = []
    # the fleet: router, delays, replica groups (docs/cluster.md)
    cluster: ClusterConfig = ClusterConfig()
    # what changes during the run, as SimPy processes on its clock (docs/processes.md)
    rate_schedule: RateScheduleConfig | None = None  # a time-varying open-loop arrival rate
    processes: Annotated[list[ProcessPath], Field(max_length=100)] = []  # 'package.module:function'
    # folder the scenario file was read from; relative paths in it resolve against this
    base_dir: str = "."

    @model_validator(mode="before")
    @classmethod
    def _revalidate_nested(cls, data: Any) -> Any:
        """Sub-configs given as objects are checked like sub-configs given as mappings."""
        # pydantic accepts an already-built sub-model as it is, and model_copy(update=...) never
        # validates, so Scenario(engine=sc.engine.model_copy(update={"max_num_seqs": -5})) would
        # slip an invalid engine through. Dumping every nested object back to the fields it was
        # given closes that door for every sub-config, whichever module defines it.
        return _as_raw(data) if isinstance(data, dict) else data

    def override(self, updates: Mapping[str, Any], source: str = "override") -> "Scenario":
        """A copy with fields changed by dotted path, validated like a scenario file.

        ``sc.override({"engine.max_num_seqs": 64, "workload.arrival.rate": 8.0})``. Values are
        Python values (not YAML text); a mapping replaces the whole sub-config, as ``--set`` does.
        Any mistake raises :class:`ScenarioError` with the same one line as the CLI."""
        if not isinstance(updates, Mapping):
            raise ScenarioError(f"{source}: expected a mapping of dotted paths to values, got {type(updates).__name__}")
        return scenario_from_dict(self.model_dump(exclude_unset=True), source, dict(updates), defaults=self)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> "Scenario":
        """pydantic's copy, except that an ``update`` goes through :meth:`override` and is
        validated (pydantic's own ``model_copy`` trusts updates blindly). Keys may be dotted."""
        if update:
            return self.override(update, source="model_copy")
        return super().model_copy(deep=deep)

    @property
    def load_notes(self) -> tuple[str, ...]:
        """What loading decided on its own: dropped options, then the engine's automatic rules."""
        return self._load_notes + self._engine_notes

    @property
    def engine_notes(self) -> tuple[str, ...]:
        """The engine preset's automatic decisions (servesim/config/engines.py), for the header."""
        return self._engine_notes

    @property
    def tp(self) -> int:
        """Tensor-parallel degree of a replica (engine.tensor_parallel_size, else hardware's)."""
        e = self.engine.tensor_parallel_size
        return e if e is not None else self.hardware.tensor_parallel

    @property
    def pp(self) -> int:
        """Pipeline-parallel degree of a replica (engine.pipeline_parallel_size, else hardware.pp)."""
        e = self.engine.pipeline_parallel_size
        return e if e is not None else self.hardware.pp

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp

    @property
    def replica_groups(self) -> tuple["ReplicaGroup", ...]:
        """The fleet as groups of identical replicas, each with the scenario of one replica
        (the scenario itself in the one-group form)."""
        return self._groups

    @property
    def num_replicas(self) -> int:
        return sum(g.replicas for g in self._groups)

    @property
    def is_fleet(self) -> bool:
        """More than one replica, groups, pipeline stages, or a router/network delay: the run goes
        through the fleet's loop (engine/cluster.py), which alone runs a pipeline replica as its
        ``pp`` virtual engines and adds the cluster's delays. (A lone replica with either ran as
        one plain engine: a PP replica with the whole pool and one batch in flight, half the
        throughput of the same replica written as a group of one; delays were dropped.)"""
        return (self.cluster.groups is not None or self.hardware.replicas > 1 or self.pp > 1
                or self.delay_in_s > 0 or self.delay_out_s > 0)

    @property
    def delay_in_s(self) -> float:
        """Client send -> the scheduler sees the request: the router, the network and the
        engine's API path (engine.api_request_s)."""
        return self.cluster.delay_in_s + self.engine.api_request_s

    @property
    def delay_out_s(self) -> float:
        """A sampled token -> the client: the network and the engine's output path
        (engine.api_token_s: detokenization, the hop to the API server, streaming)."""
        return self.cluster.delay_out_s + self.engine.api_token_s

    @property
    def placement(self):
        """servesim.config.placement.Placement of every replica, in group order."""
        return self._placement

    @property
    def model_shape(self) -> ModelShape:
        """The model served: its shape in its weight format and engine.kv_cache_dtype."""
        if self._shape is None:
            m = self.model
            if isinstance(m, str):
                shape = MODELS[m]
            elif isinstance(m, ModelShapeConfig):
                shape = m.shape()
            else:
                shape = MODELS[m.name] if m.name is not None else _read_model_config(m.config, self.base_dir)
                shape = with_precision(shape, m.quantization)
            self._shape = with_precision(shape, kv_cache_dtype=self.engine.kv_cache_dtype)
        return self._shape

    @property
    def chunks_prefill(self) -> bool:
        """Whether prompts may be split across iterations: the vLLM flag, or a policy that
        always chunks (``chunked``)."""
        if self.engine.enable_chunked_prefill:
            return True
        spec = POLICIES.get(self.engine.scheduler)
        return bool(spec and spec.always_chunks)

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len or self.model_shape.max_model_len

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        # the default output folder is out/<name>: it must stay a folder name, inside out/
        bad = not v.strip() or v in (".", "..") or any(c in v for c in "/\\\0") or len(v) > 200
        if bad:
            raise ValueError(f"{v!r} is not a plain name: it names the output folder out/<name>, so no "
                             f"'/' or '\\', not '.' or '..', 1 to 200 characters")
        return v

    @model_validator(mode="after")
    def _engine_preset_rules(self) -> "Scenario":
        """The preset's automatic rules fill the engine fields the scenario does not give (first
        of the checks: they validate the engine the run will use). The new engine keeps the
        given fields as its set fields, so a copy or an override decides again from its own."""
        e = self.engine
        if e.preset is None:
            return self
        given = frozenset(e.model_fields_set)
        updates, notes = engine_rules(self, given)
        if e.preset != canonical(e.preset):
            notes.insert(0, f"engine.preset {e.preset} = {canonical(e.preset)} (the current version)")
        if updates:
            new = EngineConfig.model_validate({**e.model_dump(exclude_unset=True), **updates})
            object.__setattr__(new, "__pydantic_fields_set__", set(given))
            object.__setattr__(self, "engine", new)
        st = self.step_time  # the version's CUDA-graph capture rule (after the engine's own)
        st_given = frozenset(st.model_fields_set)
        st_updates, st_notes = graph_rules(self, st_given)
        if st_updates:
            new_st = type(st).model_validate({**st.model_dump(exclude_unset=True), **st_updates})
            object.__setattr__(new_st, "__pydantic_fields_set__", set(st_given))
            object.__setattr__(self, "step_time", new_st)
        self._engine_notes = tuple(notes + st_notes)
        return self

    @model_validator(mode="after")
    def _fields_apply(self) -> "Scenario":
        """Options of another scheduler or allocator are errors, not silently ignored."""
        e = self.engine
        if ":" not in e.scheduler:
            for name in _set_fields(e):
                owners = POLICY_ENGINE_FIELDS.get(name)
                if owners is not None and e.scheduler not in owners:
                    value = getattr(e, name)
                    raise ValueError(
                        f"engine.{name} = {value!r} applies to scheduler {' / '.join(owners)}, not "
                        f"{e.scheduler!r} (remove it, or set engine.scheduler: {owners[0]})"
                    )
        if e.scheduler == "static-fifo" and e.max_batch_size > e.max_num_seqs:  # (it was capped silently)
            given = "" if "max_batch_size" in e.model_fields_set else " (the default)"
            raise ValueError(f"engine.max_batch_size {e.max_batch_size}{given} exceeds engine.max_num_seqs "
                             f"{e.max_num_seqs}, the requests that may run at once; allowed: max_batch_size "
                             f"<= max_num_seqs (lower it, or raise max_num_seqs)")
        have = {"static": e.kv_allocator == "static", "elastic": e.kv_allocator == "elastic",
                "prefix": e.enable_prefix_caching,
                "priority": e.enable_prefix_caching and e.prefix_cache_eviction == "priority"}
        if "prefix_cache_eviction" in _set_fields(e) and not e.enable_prefix_caching:
            raise ValueError(f"engine.prefix_cache_eviction = {e.prefix_cache_eviction!r} needs "
                             f"engine.enable_prefix_caching: true (it orders the prefix cache's evictions)")
        for name in _set_fields(e.kv):
            need, key = KV_FIELDS_NEED.get(name, ("", ""))
            if key and not have[key]:
                raise ValueError(f"engine.kv.{name} applies only with {need}; remove it or set that")
        if e.enable_prefix_caching and e.prefix_cache_eviction == "sglang" and e.kv.preload is not None:
            raise ValueError("engine.kv.preload applies only with engine.prefix_cache_eviction lru or priority, not "
                             "'sglang' (SGLang's radix cache preloads nothing); remove it or change the eviction")
        return self

    @model_validator(mode="after")
    def _parallelism_sources(self) -> "Scenario":
        """The engine's parallelism flags and hardware's older fields must not disagree."""
        e, hw = self.engine, self.hardware
        given = hw.model_fields_set
        if e.tensor_parallel_size is not None and hw.tp is not None and hw.tp != e.tensor_parallel_size:
            raise ValueError(f"engine.tensor_parallel_size {e.tensor_parallel_size} and hardware.tp {hw.tp} "
                             f"disagree; give one (hardware.tp is the older name)")
        if e.pipeline_parallel_size is not None and "pp" in given and hw.pp != e.pipeline_parallel_size:
            raise ValueError(f"engine.pipeline_parallel_size {e.pipeline_parallel_size} and hardware.pp {hw.pp} "
                             f"disagree; give one (hardware.pp is the older name)")
        if (e.tensor_parallel_size is not None or e.pipeline_parallel_size is not None) \
                and "gpus_per_replica" in given and hw.gpus_per_replica != self.tp * self.pp:
            raise ValueError(f"hardware.gpus_per_replica {hw.gpus_per_replica} differs from "
                             f"engine.tensor_parallel_size {self.tp} x pipeline_parallel_size {self.pp}; "
                             f"remove hardware.gpus_per_replica (it follows from the engine's)")
        return self

    @model_validator(mode="after")
    def _roofline_fit_same_gpu(self) -> "Scenario":
        st = self.step_time
        if isinstance(st, RooflineStepConfig) and st.fit is not None:
            gpu = st.fit.split("/")[0]
            if gpu != self.hardware.gpu:
                raise ValueError(f"step_time.fit {st.fit!r} is a pack of {gpu}, but hardware.gpu is "
                                 f"{self.hardware.gpu!r}: fit to a pack of the GPU simulated, "
                                 f"e.g. fit: {self.hardware.gpu}/<model>")
        return self

    @model_validator(mode="after")
    def _model_resolves(self) -> "Scenario":
        """A config.json is read (offline) when the scenario is built: a bad one is a load error."""
        self._shape = None
        _ = self.model_shape
        return self

    @model_validator(mode="after")
    def _expert_parallel_needs_experts(self) -> "Scenario":
        if self.engine.enable_expert_parallel and not self.model_shape.is_moe:
            raise ValueError(f"engine.enable_expert_parallel = True: model {self.model_shape.name} has no experts "
                             f"(a mixture-of-experts model only); remove it")
        st = self.step_time
        if isinstance(st, RooflineStepConfig) and st.moe_imbalance != 1.0 and not self.engine.enable_expert_parallel:
            raise ValueError(f"step_time.moe_imbalance = {st.moe_imbalance:g} applies only with "
                             f"engine.enable_expert_parallel: true (the busiest GPU's share of routed tokens)")
        return self

    @model_validator(mode="after")
    def _parallelism_fits_model(self) -> "Scenario":
        shape, tp, pp = self.model_shape, self.tp, self.pp
        tp_field = "engine.tensor_parallel_size" if self.engine.tensor_parallel_size is not None else "hardware: tp"
        pp_field = "engine.pipeline_parallel_size" if self.engine.pipeline_parallel_size is not None else "hardware.pp"
        kv = shape.num_kv_heads
        if shape.num_heads % tp or (kv % tp and tp % kv):
            raise ValueError(
                f"{tp_field} {tp} must divide the model's {shape.num_heads} attention heads and its "
                f"{kv} KV heads divide or be divided by it (vLLM refuses otherwise); "
                f"tp values that fit: {', '.join(str(t) for t in range(1, 65) if _tp_fits(shape, t))}"
            )
        if pp > shape.num_layers:
            raise ValueError(f"{pp_field} {pp} exceeds the model's {shape.num_layers} layers")
        if shape.num_layers % pp:
            fits = ", ".join(str(p) for p in range(1, min(shape.num_layers, 64) + 1) if shape.num_layers % p == 0)
            raise ValueError(f"{pp_field} {pp} does not divide the model's {shape.num_layers} layers into equal "
                             f"stages; values that do: {fits}")
        return self

    @model_validator(mode="after")
    def _bounded_request_count(self) -> "Scenario":
        """A duration-only open loop draws about rate x duration requests: bound it up front
        (stop.requests is bounded by its type)."""
        a, d = self.workload.arrival, self.stop.duration_s
        if self.stop.requests is None and d is not None and self.workload.trace is None:
            rate = getattr(a, "rate", None)
            if isinstance(rate, float | int) and rate * d > MAX_REQUESTS:
                raise ValueError(
                    f"stop.duration_s {d:g} s at workload.arrival.rate {rate:g}/s draws about "
                    f"{rate * d:,.0f} requests; at most {MAX_REQUESTS:,} per simulation "
                    f"(shorten the run, lower the rate, or set stop.requests)"
                )
        return self

    @model_validator(mode="after")
    def _stop_and_workload(self) -> "Scenario":
        if self.stop.warmup_requests and self.workload.needs_stream_clock():
            raise ValueError(
                f"stop.warmup_requests {self.stop.warmup_requests}: with several closed-loop streams, or "
                f"closed-loop and open-loop streams together, requests are numbered per stream, so the "
                f"first N are not the first N to arrive; set stop.warmup_requests: 0 (a closed loop's "
                f"ramp_up_s spreads its clients' starts instead)")
        return self

    @model_validator(mode="after")
    def _api_queue_open_loop(self) -> "Scenario":
        """engine.api_server_count queues the open-loop send times before the run (engine/api_queue.py);
        a closed loop's next requests are sent from inside the engine, which adds a fixed latency."""
        n, w = self.engine.api_server_count, self.workload
        if n is not None and (isinstance(w.arrival, ClosedArrival) and w.streams is None and w.trace is None
                              or any(isinstance(getattr(s, "arrival", None), ClosedArrival) for s in w.streams or ())):
            raise ValueError(f"engine.api_server_count {n}: not with a closed-loop arrival process (process: closed; "
                             f"its clients send from inside the engine, where the request path stays a fixed "
                             f"latency); allowed: null with a closed loop, or open-loop arrivals (a rate, a trace, "
                             f"sessions)")
        return self

    @model_validator(mode="after")
    def _async_output_open_loop(self) -> "Scenario":
        """engine.options.async_output delivers an iteration's tokens when the engine's next call
        returns, but a closed loop's client sends its next request at the engine's finish (from
        inside the engine): it would send before its last token arrived."""
        opts = self.engine.options or {}
        if opts.get("async_output") is True and self.workload.closed_loops():
            raise ValueError("engine.options.async_output true: not with a closed-loop arrival process "
                             "(process: closed; its clients send their next request at the engine's finish, "
                             "which the lag would put before their last token arrives); allowed: false with a "
                             "closed loop, or open-loop arrivals (a rate, a trace, sessions)")
        return self

    @model_validator(mode="after")
    def _kv_consistency(self) -> "Scenario":
        e = self.engine
        if e.enable_prefix_caching and e.kv_allocator != "paged":
            raise ValueError(f"engine.enable_prefix_caching needs engine.kv_allocator: paged "
                             f"(got {e.kv_allocator!r}); prefix caching shares paged blocks")
        if self.kv_tiers and not e.enable_prefix_caching:
            raise ValueError("kv_tiers hold evicted prefix-cache blocks; set engine.enable_prefix_caching: true")
        names = [t.name or f"L{i + 2}" for i, t in enumerate(self.kv_tiers)]  # (unnamed: L2, L3 by position)
        taken = {"L1": "the GPU pool", "fetch_wait_s": "a summary key", "dropped_blocks": "a summary key"}
        for i, name in enumerate(names):
            if name in taken:
                raise ValueError(f"kv_tiers[{i}].name = {name!r}: that name is {taken[name]}'s in summary.kv.tiers; "
                                 f"choose another")
            if names.index(name) != i:
                raise ValueError(f"kv_tiers[{i}].name = {name!r}: kv_tiers[{names.index(name)}] has that name "
                                 f"(an unnamed tier is L2, L3 by position); tier names must differ, got {names}")
        return self

    @model_validator(mode="after")
    def _engine_consistency(self) -> "Scenario":
        e = self.engine
        mml = self.max_model_len
        limit = self.model_shape.max_model_len
        if e.max_model_len is not None and e.max_model_len > limit:
            raise ValueError(
                f"engine.max_model_len = {e.max_model_len}: above the model's context limit {limit} "
                f"({self.model if isinstance(self.model, str) else 'model.max_model_len'}); it may only lower it "
                f"(vLLM refuses a longer one too)")
        if not self.chunks_prefill and e.max_num_batched_tokens < mml:
            raise ValueError(
                f"engine.max_num_batched_tokens {e.max_num_batched_tokens} is smaller than "
                f"max_model_len {mml} with chunked prefill off, so long prompts could never run; "
                f"raise it, set engine.max_model_len <= {e.max_num_batched_tokens}, "
                f"or set engine.enable_chunked_prefill: true (vLLM refuses this config too)"
            )
        if e.scheduler in ("vllm", "priority") and e.max_num_batched_tokens < e.max_num_seqs:
            raise ValueError(
                f"engine.max_num_batched_tokens {e.max_num_batched_tokens} is smaller than engine.max_num_seqs "
                f"{e.max_num_seqs}: a full batch of decodes could not fit one iteration's token budget; raise it "
                f"to >= {e.max_num_seqs} or lower max_num_seqs (vLLM refuses this config too)"
            )
        spec = POLICIES.get(e.scheduler)
        if spec is None and not is_import_path(e.scheduler):
            raise ValueError(
                f"engine.scheduler {e.scheduler!r} is not a known policy "
                f"(allowed: {', '.join(policy_names())}, or your own as an import path 'package.module:Class')"
            )
        if spec is not None:  # the policy's own knobs (engine.options), checked at load time
            options = spec.options
            foreign = [k for k in e.options if k not in options]
            if foreign:
                rest = {k: v for k, v in e.options.items() if k in options}
                raise ValueError(
                    f"engine.options.{foreign[0]}: unknown option for scheduler {e.scheduler!r} (known: "
                    f"{', '.join(sorted(options)) or 'none'}); remove it, or run with "
                    f"--set 'engine.options={_flow(rest)}'")
            read_options(dict(e.options), spec.name, options)
        return self  # (whether the model fits the GPUs is planned when the run is built: memory.py)

    @model_validator(mode="after")
    def _fleet(self) -> "Scenario":
        """The replica groups (each checked as a scenario of its own) and their placement."""
        from servesim.config.placement import ReplicaShape, place

        groups = self.cluster.groups
        for i, g in enumerate(groups or ()):
            for name in ("api_request_s", "api_token_s", "api_server_count"):
                if name in g.engine and g.engine[name] != getattr(self.engine, name):
                    raise ValueError(f"cluster.groups[{i}].engine.{name}: the request path is the "
                                     f"fleet's (set engine.{name} at the top level, not per group)")
        if groups is None:
            built = (ReplicaGroup("replica", self.hardware.replicas, self, "hardware.replicas"),)
        else:
            if self.hardware.replicas != 1:
                raise ValueError(f"hardware.replicas {self.hardware.replicas}: with cluster.groups, each group "
                                 f"gives its own replicas; remove hardware.replicas")
            built = tuple(ReplicaGroup(g.name or f"group{i}", g.replicas, self._group_scenario(i, g),
                                       f"cluster.groups[{i}]") for i, g in enumerate(groups))
        shapes = [ReplicaShape(gi, g.label, "engine" if groups is None else f"{g.label}.engine", g.scenario.tp,
                               g.scenario.pp)
                  for gi, g in enumerate(built) for _ in range(g.replicas)]
        hw = self.hardware
        self._placement = place(shapes, servers=hw.servers, gpus_per_server=hw.gpus_per_server,
                                link=hw.inter_server_link is not None)
        self._groups = built
        return self

    def _group_scenario(self, i: int, g) -> "Scenario":
        """Group ``i``'s replica as a scenario: the scenario with the group's fields over it."""
        data = self.model_dump(mode="python", exclude_unset=True)  # what the user gave, validated again
        data["cluster"] = {}
        e = dict(data.get("engine", {}))
        e["tensor_parallel_size"], e["pipeline_parallel_size"] = self.tp, self.pp
        data["engine"] = _merged(e, g.engine)
        link = self.hardware.inter_server_link
        data["hardware"] = {"gpu": g.gpu if g.gpu is not None else self.hardware.gpu,
                            "gpus_per_server": self.hardware.gpus_per_server,
                            "inter_server_link": link.model_dump() if link is not None else None}
        if g.model is not None:
            data["model"] = g.model
        if g.step_time is not None:
            data["step_time"] = g.step_time
        where = f"cluster.groups[{i}]"
        try:
            return Scenario.model_validate(data)
        except ValidationError as err:
            line = _first_error(err, "\0").removeprefix("\0: ")
        except ValueError as err:
            line = str(err)
        line = re.sub(r"^hardware\.gpu\b", "gpu", line)
        if re.match(r"^[A-Za-z_][\w.\[\]]* (=|:)", line) or re.match(r"^(engine|step_time|model)\b", line):
            # a field path: name it under the group
            raise ValueError(f"{where}.{line}")
        raise ValueError(f"{where}: {line}")


class ReplicaGroup:
    """``replicas`` identical replicas, each simulated as ``scenario`` (one replica's scenario);
    ``label`` is how errors name the group's fields."""

    __slots__ = ("name", "replicas", "scenario", "label")

    def __init__(self, name: str, replicas: int, scenario: "Scenario", label: str):
        self.name, self.replicas, self.scenario, self.label = name, replicas, scenario, label

    def __eq__(self, other: object) -> bool:
        """Equal groups of equal scenarios: two validations of the same fields compare equal
        (pydantic compares a Scenario's derived groups too). The group's scenario is compared by
        its fields, not ``==``: the one-group form's scenario is the fleet itself, whose ``==``
        would come back here."""
        if not isinstance(other, ReplicaGroup):
            return NotImplemented
        return ((self.name, self.replicas, self.label) == (other.name, other.replicas, other.label)
                and type(self.scenario) is type(other.scenario) and self.scenario.__dict__ == other.scenario.__dict__)

    __hash__ = None  # equality by value, and no use as a key


def scenario_from_dict(raw: dict, source: str = "scenario",
                       overrides: list[tuple[str, str]] | Mapping[str, Any] | None = None,
                       base_dir: str | Path | None = None, defaults: "Scenario | None" = None) -> Scenario:
    """Validate a raw mapping (plus overrides) into a :class:`Scenario`, or raise one clear line.

    ``overrides``: ``(dotted.path, YAML text)`` pairs as ``--set`` gives them, or a mapping of
    dotted paths to Python values. ``defaults``: the scenario ``raw`` was dumped from (with only
    its given fields), whose defaulted sub-configs a mapping override may reach into."""
    if not isinstance(raw, dict):
        raise ScenarioError(f"{source}: the scenario must be a YAML mapping, got {type(raw).__name__}")
    if RESULT_KEYS <= raw.keys():
        raise ScenarioError(f"{source}: this is a results file (the summary.json a run writes), not a "
                            f"scenario; give the scenario YAML the run was made from")
    raw = _deep_copy(raw)
    before = _deep_copy(raw)
    if isinstance(overrides, Mapping):  # Python values by dotted path
        for path, value in overrides.items():
            _set_path(raw, str(path), _as_raw(value), source, "", defaults)
        paths = [str(p) for p in overrides]
        overrides = None
    else:
        paths = [p for p, _ in overrides or []]
    for path, value in overrides or []:
        _apply_override(raw, path, value, source)
    notes = _drop_foreign_options(before, raw, paths) + _drop_derived_gpus(raw, paths)
    if base_dir is not None:
        raw["base_dir"] = str(base_dir)
    try:
        sc = Scenario.model_validate(raw)
        sc._load_notes = notes + (sc.engine.kv.protect_note() if sc.engine.enable_prefix_caching
                                  and sc.engine.prefix_cache_eviction == "priority" else ())
        return sc
    except ValidationError as err:
        raise ScenarioError(_first_error(err, source)) from None
    except ValueError as err:  # raised outside pydantic's wrapping
        raise ScenarioError(f"{source}: {err}") from None


def load_scenario(path: str | Path,
                  overrides: list[str] | list[tuple[str, str]] | Mapping[str, Any] | None = None) -> Scenario:
    """Load a YAML scenario file, apply overrides, validate.

    ``overrides``: ``["engine.max_num_seqs=64"]`` (YAML values, as ``--set``), or a mapping of
    dotted paths to Python values, ``{"engine.max_num_seqs": 64}``."""
    p = Path(path)
    source = str(path)
    raw = read_yaml_file(p, source, "scenario")
    pairs = overrides
    if isinstance(overrides, (list, tuple)) and overrides and isinstance(overrides[0], str):
        pairs = parse_overrides(overrides)  # type: ignore[arg-type]
    elif overrides is not None and not isinstance(overrides, (Mapping, list, tuple)):
        raise ScenarioError(f"{source}: overrides must be a list of 'KEY=VALUE' strings or a mapping "
                            f"of dotted paths to values, got {type(overrides).__name__}")
    return scenario_from_dict(raw, source, pairs, base_dir=p.resolve().parent)  # type: ignore[arg-type]


