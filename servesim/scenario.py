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
from typing import Annotated, Any, Literal, Optional, Union

import numpy as np
import yaml
from pydantic import (BaseModel, Discriminator, Field, PrivateAttr, Tag, ValidationError, field_validator,
                      model_validator)

from servesim.config.cluster import ClusterConfig, LinkConfig
from servesim.config.dynamics import ProcessPath, RateScheduleConfig
from servesim.errors import ScenarioError
from servesim.fields import (
    MAX_REQUESTS,
    is_import_path,
    RequestCount,
    RequestCount0,
    Seconds,
    Seed,
    Share,
    StepSeconds,
    StepSeconds0,
    StrictModel,
    TokenCount,
)
from servesim.policy_catalog import ENGINE_KNOBS, POLICIES, policy_names, read_options
from servesim.config.engines import PRESET_NAMES, canonical, engine_rules
from servesim.config.kv import KVConfig, TierConfig
from servesim.hardware import GPUS
from servesim.models import KV_CACHE_DTYPES, MODELS, WEIGHT_FORMATS, ConfigError, ModelShape, shape_from_file, with_precision
from servesim.yamltext import YamlDataError, load_yaml
from servesim.config.dists import (  # noqa: F401 (re-exported: scenario's public types)
    ExponentialDist,
    FixedDist,
    GeometricDist,
    LengthDist,
    LognormalDist,
    NormalDist,
    UniformDist,
)
from servesim.config.arrivals import (  # noqa: F401 (re-exported)
    ArrivalConfig,
    ClosedArrival,
    ConstantArrival,
    GammaArrival,
    PoissonArrival,
)
from servesim.config.streams import (  # noqa: F401 (re-exported)
    ClassMix,
    ContaminateConfig,
    StreamConfig,
    StreamSLO,
    WorkloadConfig,
)
from servesim.config.traces import (  # noqa: F401 (re-exported)
    ClassAssignmentConfig,
    LengthsConfig,
    ServeGenArrivalConfig,
    SessionsConfig,
    TraceConfig,
)


Frozen = StrictModel  # frozen, unknown fields refused, strict types, finite floats (servesim.fields)


# --------------------------------------------------------------------------------------- stop
MAX_REPLICATIONS = 10_000  # stop.replications and --seeds at most

class StopConfig(Frozen):
    """When to stop. ``requests``: that many requests arrive and the run drains until each is
    finished or rejected. ``duration_s``: arrivals stop and the clock stops at that time; unfinished
    requests are reported as in flight. Give one or both (both: whichever comes first: when all
    ``requests`` arrived before ``duration_s``, the run ends as soon as they have all ended)."""

    requests: RequestCount | None = None  # this many requests arrive; the run drains until each ends
    duration_s: Seconds | None = None  # arrivals and the clock stop here (unfinished: in flight)
    warmup_requests: RequestCount0 = 0  # the first N (arrival order) are left out of the results
    # independent runs (seeds seed, seed+1, ...) for confidence intervals (servesim run --seeds)
    replications: Annotated[int, Field(ge=1, le=MAX_REPLICATIONS)] = 1

    @model_validator(mode="after")
    def _one_limit(self) -> "StopConfig":
        if self.requests is None and self.duration_s is None:
            raise ValueError("give stop.requests or stop.duration_s (or both)")
        if self.requests is not None and self.warmup_requests >= self.requests:
            raise ValueError(
                f"warmup_requests {self.warmup_requests} must be smaller than requests {self.requests}"
            )
        return self


# ---------------------------------------------------------------------------------- hardware
GpuName = Literal[tuple(sorted(GPUS))]  # type: ignore[valid-type]  # the registry (servesim/hardware.py)


class HardwareConfig(Frozen):
    """The GPUs, the servers holding them, and how many replicas of the scenario's engine run.

    A replica's parallelism is the engine's (``engine.tensor_parallel_size`` /
    ``pipeline_parallel_size``, vLLM's names); ``gpus_per_replica`` / ``tp`` / ``pp`` here are
    the older spelling of the same, still read when the engine's are not given."""

    gpu: GpuName = "a100-80g"  # the GPU kind (servesim/hardware.py)
    servers: Annotated[int, Field(ge=1, le=4096)] | None = None  # servers in the fleet (None: as many as it needs)
    gpus_per_server: Annotated[int, Field(ge=1, le=64)] = 8  # a tensor-parallel group never spans servers
    # the link between servers: lets a replica's pipeline stages span servers (docs/cluster.md)
    inter_server_link: LinkConfig | None = None
    replicas: Annotated[int, Field(ge=1, le=4096)] = 1  # replicas of the engine, behind cluster.router
    gpus_per_replica: Annotated[int, Field(ge=1, le=64)] = 1  # GPUs one replica spans (tp x pp; older spelling)
    tp: Annotated[int, Field(ge=1, le=64)] | None = None  # default: gpus_per_replica / pp
    pp: Annotated[int, Field(ge=1, le=64)] = 1  # pipeline stages

    @model_validator(mode="after")
    def _parallelism(self) -> "HardwareConfig":
        tp = self.tensor_parallel
        if tp * self.pp != self.gpus_per_replica:
            raise ValueError(
                f"tp {tp} x pp {self.pp} must equal gpus_per_replica {self.gpus_per_replica}"
            )
        return self

    @property
    def tensor_parallel(self) -> int:
        if self.tp is not None:
            return self.tp
        if self.gpus_per_replica % self.pp:
            raise ValueError(f"gpus_per_replica {self.gpus_per_replica} is not divisible by pp {self.pp}")
        return self.gpus_per_replica // self.pp


# ------------------------------------------------------------------------------------- model
QuantizationName = Literal[tuple(WEIGHT_FORMATS)]  # type: ignore[valid-type]
KVCacheDtype = Literal[tuple(KV_CACHE_DTYPES)]  # type: ignore[valid-type]


class ModelShapeConfig(Frozen):
    """An inline model shape, for models that are not built in."""

    name: str = "custom"  # a label for the header and the calibration pack lookup
    num_layers: Annotated[int, Field(ge=1, le=1024)]
    hidden_size: Annotated[int, Field(ge=1, le=1 << 20)]
    num_heads: Annotated[int, Field(ge=1, le=1 << 14)]
    num_kv_heads: Annotated[int, Field(ge=1, le=1 << 14)]
    head_dim: Annotated[int, Field(ge=1, le=1 << 14)]
    intermediate_size: Annotated[int, Field(ge=1, le=1 << 22)]
    vocab_size: Annotated[int, Field(ge=1, le=1 << 24)]
    max_model_len: TokenCount = 8192  # the model's context limit (engine.max_model_len may lower it)
    tie_word_embeddings: bool = False  # the output head shares the embedding's weights (memory)
    quantization: QuantizationName = "none"  # weight format (vLLM --quantization; docs/models.md)

    @model_validator(mode="after")
    def _heads(self) -> "ModelShapeConfig":
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} must be a multiple of num_kv_heads {self.num_kv_heads} "
                             f"(each KV head serves a whole group of query heads)")
        return self

    def shape(self) -> ModelShape:
        return ModelShape(**self.model_dump())


ModelName = Literal[tuple(sorted(MODELS))]  # type: ignore[valid-type]


class ModelRefConfig(Frozen):
    """A model from the shipped library (``name``) or a Hugging Face ``config.json`` of your own
    (``config``: the file, or a folder holding it; relative to the scenario file), served in a
    weight format (``quantization``, vLLM's names; default: the checkpoint's, as vLLM does)."""

    name: Optional[ModelName] = None  # type: ignore[valid-type]  # a library model (docs/models.md)
    config: Optional[Annotated[str, Field(min_length=1, max_length=4096)]] = None  # a config.json (read offline)
    quantization: Optional[QuantizationName] = None  # none, fp8, int8, awq, gptq, mxfp4 (default: checkpoint's)

    @model_validator(mode="after")
    def _one_source(self) -> "ModelRefConfig":
        if (self.name is None) == (self.config is None):
            raise ValueError("model: give exactly one of name (a library model) or config (a config.json path)")
        return self


def _model_kind(v: Any) -> str:
    """Which form a ``model:`` value takes: a mapping with ``num_layers`` is an inline shape, any
    other mapping a reference (so each form's own errors are reported, not the other's)."""
    if isinstance(v, (dict, ModelShapeConfig, ModelRefConfig)):
        shape = isinstance(v, ModelShapeConfig) or (isinstance(v, dict) and "num_layers" in v)
        return "ModelShapeConfig" if shape else "ModelRefConfig"
    return "Literal-name"


ModelField = Annotated[Union[Annotated[ModelName, Tag("Literal-name")],  # type: ignore[valid-type]
                             Annotated[ModelRefConfig, Tag("ModelRefConfig")],
                             Annotated[ModelShapeConfig, Tag("ModelShapeConfig")]], Discriminator(_model_kind)]


# ------------------------------------------------------------------------------------ engine
SchedulerName = str  # validated against the policy registry when the scenario is built


class EngineConfig(Frozen):
    scheduler: SchedulerName = "vllm"  # a policy name (vllm, chunked, static-fifo, priority) or 'module:Class'
    # the engine version these fields stand for (scenarios/engines/); its automatic rules fill the
    # fields not given when the scenario is built, each printed in the header (config/engines.py)
    preset: Optional[Literal[PRESET_NAMES]] = None  # type: ignore[valid-type]
    # GPUs per pipeline stage (vLLM --tensor-parallel-size; default: hardware's older tp, else 1)
    tensor_parallel_size: Annotated[int, Field(ge=1, le=64)] | None = None
    # pipeline stages = virtual engines (vLLM --pipeline-parallel-size; default: hardware.pp)
    pipeline_parallel_size: Annotated[int, Field(ge=1, le=64)] | None = None
    block_size: Annotated[int, Field(ge=1, le=256)] = 16  # KV block size in tokens (vLLM --block-size)
    max_num_seqs: Annotated[int, Field(ge=1, le=65536)] = 256  # requests running at once (vLLM --max-num-seqs)
    max_num_batched_tokens: Annotated[int, Field(ge=1, le=1 << 22)] = 8192  # token budget of an iteration
    enable_chunked_prefill: bool = False  # split prompts across iterations (vLLM --enable-chunked-prefill)
    gpu_memory_utilization: Share = 0.9  # share of GPU memory the engine may use (weights, activations, KV)
    preemption: Literal["recompute", "swap"] = "recompute"  # what happens to a preempted request's KV
    max_model_len: TokenCount | None = None  # default: the model's
    num_gpu_blocks_override: Annotated[int, Field(ge=1, le=1 << 26)] | None = None  # vLLM's flag of that name
    # vLLM multi-step scheduling: the scheduler runs once every N decode steps
    num_scheduler_steps: Annotated[int, Field(ge=1, le=64)] = 1
    # SGLang names, used by the chunked policy (default: max_num_batched_tokens / max_num_seqs)
    chunked_prefill_size: TokenCount | None = None
    max_running_requests: Annotated[int, Field(ge=1, le=65536)] | None = None
    # Spark: request-level static batches of at most this many requests
    max_batch_size: Annotated[int, Field(ge=1, le=65536)] = 16
    # engine CPU time per iteration (scheduling, input preparation, sampling, detokenization):
    # constant + per scheduled sequence; added to the GPU time and reported separately
    cpu_overhead_s: StepSeconds0 = 0.0
    cpu_overhead_per_seq_s: StepSeconds0 = 0.0
    # request path outside the engine loop (API server, tokenization, detokenization, streaming),
    # as a client sees it: a request reaches the scheduler api_request_s after it was sent, and each
    # token reaches the client api_token_s after it was sampled (TTFT and E2E grow by the sum, ITL
    # and TPOT not); docs/model.md "Request path"
    api_request_s: StepSeconds0 = 0.0
    api_token_s: StepSeconds0 = 0.0
    # free-form options for a policy's own knobs (built-in and user policies)
    options: dict[str, Any] = {}
    # KV memory (docs/kv.md): allocator, vLLM's prefix caching flag, L1 eviction, details
    kv_allocator: Literal["paged", "static", "elastic"] = "paged"
    enable_prefix_caching: bool = False
    prefix_cache_eviction: Literal["lru", "priority"] = "lru"
    # KV-cache precision (vLLM --kv-cache-dtype): auto = the model dtype; fp8 halves KV bytes (docs/models.md)
    kv_cache_dtype: KVCacheDtype = "auto"  # type: ignore[valid-type]
    # MoE: split the experts whole across the TP group's GPUs, all-to-all in place of the all-reduce
    # (vLLM --enable-expert-parallel; docs/models.md)
    enable_expert_parallel: bool = False
    kv: KVConfig = KVConfig()


# --------------------------------------------------------------------------------- step time
class ConstantStepConfig(Frozen):
    """Every iteration takes ``seconds``, whatever the batch: for theory tests."""

    model: Literal["constant"]
    seconds: StepSeconds = 0.01  # every iteration's duration


def pack_ref_parts(ref: str) -> tuple[str, str, int]:
    """``gpu/model`` or ``gpu/model-tpN`` -> (gpu, model, tp), as step_time.fit names a pack;
    ValueError naming what is allowed otherwise (the pack's existence is checked when built)."""
    from servesim.hardware import GPUS

    if not isinstance(ref, str) or ref.count("/") != 1:
        raise ValueError(f"pack reference {ref!r} must be '<gpu>/<model>' or '<gpu>/<model>-tp<N>', "
                         f"e.g. 'a100-80g/llama-3-8b'")
    gpu, stem = ref.split("/")
    model, tp = stem, 1
    head, sep, tail = stem.rpartition("-tp")
    if sep and tail.isdigit():
        model, tp = head, int(tail)
    if gpu not in GPUS:
        raise ValueError(f"pack reference {ref!r}: unknown GPU '{gpu}'; allowed: {', '.join(sorted(GPUS))}")
    if model not in MODELS:
        raise ValueError(f"pack reference {ref!r}: unknown model '{model}'; allowed: {', '.join(sorted(MODELS))}")
    if tp < 1 or tp > 64:
        raise ValueError(f"pack reference {ref!r}: tp {tp} not allowed; allowed: 1..64")
    return gpu, model, tp


class RooflineStepConfig(Frozen):
    """Per op, max(FLOPs / (peak x mfu), bytes / (bandwidth x mbu)), plus a fixed overhead.

    ``fit: <gpu>/<model>[-tp<N>]`` takes mfu, mbu and overhead_s from that calibration pack of the
    same GPU instead (servesim/perf/rooflinefit.py): the fallback for a model with no pack."""

    model: Literal["roofline"]
    mfu: Share = 0.6  # achieved share of the GPU's peak FLOP/s
    mbu: Share = 0.8  # achieved share of the GPU's memory bandwidth
    overhead_s: StepSeconds0 = 0.002  # fixed time added to every iteration
    # fit mfu, mbu and overhead_s to a calibration pack of this GPU ("gpu/model[-tpN]")
    fit: Optional[Annotated[str, Field(min_length=3, max_length=100)]] = None
    # MoE under engine.enable_expert_parallel: the busiest GPU's routed tokens / the mean (>= 1)
    moe_imbalance: Annotated[float, Field(ge=1.0, le=64.0)] = 1.0

    @field_validator("fit")
    @classmethod
    def _fit_names_a_pack(cls, v: Optional[str]) -> Optional[str]:
        if v is not None:
            pack_ref_parts(v)
        return v

    @model_validator(mode="after")
    def _fit_or_factors(self) -> "RooflineStepConfig":
        given = sorted({"mfu", "mbu", "overhead_s"} & set(_set_fields(self)))
        if self.fit is not None and given:
            raise ValueError(f"step_time.fit {self.fit!r} fits mfu, mbu and overhead_s to that pack; "
                             f"remove step_time.{given[0]} (or remove fit to state them)")
        return self


class PackStepConfig(Frozen):
    """Measured kernel timings from a calibration pack, found from (gpu, model, tp)."""

    model: Literal["pack"]
    cuda_graph: bool = True  # decode iterations replay a CUDA graph (the pack's graph overheads)


class AutoStepConfig(Frozen):
    """The default: the calibration pack of (gpu, model, tp) when one exists and fits, else the
    roofline with its default factors, reported everywhere as "roofline (uncalibrated)" with the
    reason (servesim/perf/select.py makes the choice)."""

    model: Literal["auto"]
    cuda_graph: bool = True  # with a pack: decode iterations replay a CUDA graph, as vLLM/SGLang do


StepTimeConfig = Annotated[
    Union[AutoStepConfig, ConstantStepConfig, RooflineStepConfig, PackStepConfig], Field(discriminator="model")
]


# ---------------------------------------------------------------------------------- workload
# The workload block lives with the workload package (servesim/config/arrivals.py and
# stream_config.py), which takes a WorkloadConfig, never the whole scenario; re-exported here.


class SLOConfig(Frozen):
    ttft_s: Seconds = 1.0  # a request is good when its TTFT is at most this ...
    tpot_s: Seconds = 0.1  # ... and its TPOT at most this (goodput, SLO attainment)


class MetricsConfig(Frozen):
    timeseries_bin_s: Annotated[float, Field(ge=1e-3, le=1e8)] = 1.0  # finest time-series bin (long runs merge bins)


class SimConfig(Frozen):
    """How to simulate (not what): switches that must not change results."""

    fast_path: bool = True  # advance runs of decode iterations together (exactly equal to single stepping)
    check_invariants: bool = False  # check KV and batch invariants after every scheduling decision (slower)
    # auto: compiled unless a piece needs Python (prefix caching, your own model or policy parts);
    # the CLI's first run on a machine runs up to 20,000 requests uncompiled rather than wait for
    # the compile. Both give the same results
    engine: Literal["auto", "python", "compiled"] = "auto"


# ------------------------------------------------------------------ fields of some policies only
# Engine fields only some schedulers read, as data (this module imports no policy). A field set to
# a value other than its default under another scheduler would be ignored silently: an error.
# Policies given by import path ('module:Class') may read any field: not checked.
# engine fields that only some policies read (declared once, in servesim/policy_catalog.py)
POLICY_ENGINE_FIELDS: dict[str, tuple[str, ...]] = {
    name: knob.policies for name, knob in ENGINE_KNOBS.items() if knob.policies is not None}
# engine.kv blocks and prefix-cache switches, and what they need
KV_FIELDS_NEED: dict[str, tuple[str, str]] = {
    # field (under engine.kv): (the setting it needs, as text; a test on the engine config)
    "static": ("engine.kv_allocator: static", "static"),
    "elastic": ("engine.kv_allocator: elastic", "elastic"),
    "preload": ("engine.enable_prefix_caching: true", "prefix"),
    "hash_outputs": ("engine.enable_prefix_caching: true", "prefix"),
    "protect_share": ("engine.prefix_cache_eviction: priority", "priority"),
}


def _set_fields(model: StrictModel) -> list[str]:
    """Fields given explicitly with a value other than the default."""
    out = []
    for name in model.model_fields_set:
        default = type(model).model_fields[name].default
        if getattr(model, name) != default:
            out.append(name)
    return sorted(out)


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
        self._engine_notes = tuple(notes)
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
            for name in ("api_request_s", "api_token_s"):
                if name in g.engine and g.engine[name] != getattr(self.engine, name):
                    raise ValueError(f"cluster.groups[{i}].engine.{name}: the request path's delay is the "
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


def _read_model_config(path: str, base_dir: str) -> ModelShape:
    p = Path(path).expanduser()
    if not p.is_absolute():
        p = Path(base_dir) / p
    try:
        return shape_from_file(p)
    except ConfigError as e:
        raise ValueError(f"model.config = {path!r}: {e}") from None


def _tp_fits(shape: ModelShape, tp: int) -> bool:
    kv = shape.num_kv_heads
    return shape.num_heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)


# ------------------------------------------------------------------------- loading + errors
def _format_loc(loc: tuple) -> str:
    parts: list[str] = []
    for p in loc:
        if isinstance(p, int):
            parts.append(f"[{p}]")
        elif p in ("function-after", "function-before", "int", "float", "str", "list", "bool") or "[" in str(p) \
                or str(p).startswith(("Literal", "union", "ModelShape", "ModelRef", "Fixed", "Normal")):
            continue  # pydantic's internal union/validator branch labels
        else:
            parts.append(("." if parts else "") + str(p))
    return "".join(parts) or "scenario"


def _merged(base: dict, over: dict) -> dict:
    """A group's engine fields over the scenario's: sections merge at every depth (a group's
    ``kv: {static: {fit: best}}`` keeps the scenario's ``kv.static.reserve``, as ``--set`` does);
    ``options`` is replaced whole (a policy's knobs belong together)."""
    out = dict(base)
    for k, v in over.items():
        if k != "options" and isinstance(v, dict) and isinstance(out.get(k), dict):
            v = _merged(out[k], v)
        out[k] = v
    return out


def _first_error(err: ValidationError, source: str) -> str:
    errors = err.errors()
    # prefer the most specific error: longest location; at equal depth (the branches of a union
    # such as workload.classes or model), a bad value over a wrong type over an unknown field over
    # a missing one: the branch that knows the field says what is wrong with its value
    def rank(x: dict) -> int:
        kind = x["type"]
        if kind == "missing":
            return 0
        if kind == "extra_forbidden":
            return 1
        return 2 if kind.endswith("_type") or kind == "literal_error" else 3

    e = max(errors, key=lambda x: (len(x["loc"]), rank(x))) if errors else None
    if e is None:
        return f"{source}: invalid scenario"
    loc = _format_loc(e["loc"])
    kind = e["type"]
    value = e.get("input")
    msg = e["msg"].removeprefix("Value error, ")
    if kind == "extra_forbidden":
        return f"{source}: {loc}: unknown field (check the spelling; see docs/scenario.md for the allowed fields)"
    if kind == "missing":
        return f"{source}: {loc}: required field is missing"
    shown = repr(value) if not isinstance(value, dict) else "{...}"
    if len(shown) > 80:
        shown = shown[:77] + "..."
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    if kind in ("value_error", "assertion_error") and loc == "scenario":
        return f"{source}: {msg}{more}"
    return f"{source}: {loc} = {shown}: {msg}{more}"


def _apply_override(raw: dict, path: str, value_text: str, source: str) -> None:
    shown = repr(value_text) if len(value_text) <= 60 else repr(value_text[:57] + "...")
    try:
        value = load_yaml(value_text) if value_text != "" else ""
    except YamlDataError as exc:
        raise ScenarioError(f"{source}: --set {path}: value {shown}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{source}: --set {path}: value {shown} is not valid YAML "
                            f"({yaml_problem(exc)})") from None
    _set_path(raw, path, value, source, "--set")


def _set_path(raw: dict, path: str, value: Any, source: str, label: str, obj: Any = None) -> None:
    """Set ``raw[k1][k2]...[kn] = value`` for ``path = "k1.k2...kn"``, creating mappings on the way.

    ``obj`` is the validated object ``raw`` was dumped from (with only the fields that were
    given): a sub-config missing from ``raw`` because it kept its default is filled in from it, so
    ``workload.arrival.rate`` keeps the default arrival's ``process``."""
    keys = path.split(".")
    where = f"{label} {path}" if label else path
    if not all(keys):
        raise ScenarioError(f"{source}: {where!r}: empty key in dotted path")
    for i, k in enumerate(keys):
        if "[" in k or "]" in k or k.isdigit():  # (it read as an unknown field named 'streams[0]')
            head = ".".join(keys[:i] + ([k.split("[")[0]] if k.split("[")[0] and not k.isdigit() else []))
            raise ScenarioError(f"{source}: {where}: a list item cannot be set alone; lists are replaced "
                                f"whole: {label + ' ' if label else ''}'{head}=[...]' with every item")
    node: Any = raw
    for i, k in enumerate(keys[:-1]):
        obj = _child(obj, k)
        nxt = node.get(k) if isinstance(node, dict) else None
        if nxt is None:
            nxt = _as_raw(obj) if isinstance(obj, (BaseModel, dict)) else {}
            node[k] = nxt
        if isinstance(nxt, list):
            raise ScenarioError(f"{source}: {where}: {'.'.join(keys[: i + 1])} is a list, and lists are replaced "
                                f"whole: {label + ' ' if label else ''}'{'.'.join(keys[: i + 1])}=[...]' with "
                                f"every item")
        if not isinstance(nxt, dict):
            shown = repr(nxt) if len(repr(nxt)) <= 60 else repr(nxt)[:57] + "..."
            raise ScenarioError(
                f"{source}: {where}: {'.'.join(keys[: i + 1])} is {shown}, not a mapping"
            )
        node = nxt
    node[keys[-1]] = value


def _child(obj: Any, key: str) -> Any:
    if isinstance(obj, BaseModel):
        return getattr(obj, key, None) if key in type(obj).model_fields else None
    if isinstance(obj, dict):
        return obj.get(key)
    return None


def _as_raw(x: Any) -> Any:
    """Plain data for validation: pydantic objects become the mappings of the fields they were
    given (defaults stay defaults, so validators that look at which fields were given still
    work); containers are copied."""
    if isinstance(x, BaseModel):
        return _as_raw(x.model_dump(exclude_unset=True))
    if isinstance(x, Mapping):
        return {k: _as_raw(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_as_raw(v) for v in x]
    return x


def yaml_problem(exc: yaml.YAMLError) -> str:
    """What a YAML error says, on one line (a reader error's text spans two: the character,
    then where it is; an unprintable character is named by its code)."""
    if isinstance(exc, yaml.reader.ReaderError):
        ch = exc.character
        code = f"#x{ch:04x}" if isinstance(ch, int) else repr(ch)
        return f"{exc.reason}: character {code} at position {exc.position}"
    problem = getattr(exc, "problem", None) or str(exc)
    return " ".join(str(problem).split())


def parse_overrides(items: list[str] | None) -> list[tuple[str, str]]:
    out = []
    for item in items or []:
        if "=" not in item:
            raise ScenarioError(f"--set {item!r}: expected KEY=VALUE with a dotted KEY, e.g. engine.max_num_seqs=64")
        k, v = item.split("=", 1)
        out.append((k.strip(), v.strip()))
    return out


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


RESULT_KEYS = frozenset({"scenario", "requests", "throughput", "latency_s"})  # of a summary.json


def read_yaml_file(p: Path, source: str, what: str) -> Any:
    """The plain data of a YAML file (a scenario, a sweep spec), or ScenarioError in one line:
    missing, a folder, unreadable, not UTF-8, not valid YAML, not plain data (servesim/yamltext.py:
    duplicate keys, tags that build objects, recursive aliases, alias bombs), empty."""
    if not p.is_file():
        raise ScenarioError(f"{source}: no such {what} file" + (" (it is a folder)" if p.is_dir() else ""))
    try:
        text = p.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{source}: not UTF-8 text (byte {exc.start}); a {what} is a YAML text file"
                            + (" (this looks like a run's parquet output)" if p.suffix == ".parquet" else "")) from None
    except OSError as exc:
        raise ScenarioError(f"{source}: cannot be read ({exc.strerror})") from None
    try:
        raw = load_yaml(text)
    except YamlDataError as exc:
        raise ScenarioError(f"{source}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}:" if mark else ""
        raise ScenarioError(f"{source}:{where} not valid YAML ({yaml_problem(exc)})") from None
    if raw is None:
        raise ScenarioError(f"{source}: the file is empty")
    return raw


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


def _drop_foreign_options(before: dict, raw: dict, paths: list[str]) -> tuple[str, ...]:
    """Switching a preset's policy with ``--set engine.scheduler=X`` drops the file's
    ``engine.options`` that X does not know (they belong to the preset's policy), with a note.

    Why not an error: the user asked for another policy on purpose, and the preset's knobs of the
    old policy cannot apply to it; refusing would make every preset comparison two overrides
    long. Options given with ``--set engine.options...`` are never dropped, and a file that
    itself names options its own policy does not know is still an error (a typo must not vanish)."""
    if "engine.scheduler" not in paths or any(p == "engine" or p.startswith("engine.options") for p in paths):
        return ()
    engine = raw.get("engine")
    options = engine.get("options") if isinstance(engine, dict) else None
    if not isinstance(options, dict) or not options:
        return ()
    old = (before.get("engine") or {}).get("scheduler", "vllm") if isinstance(before.get("engine"), dict) else "vllm"
    spec = POLICIES.get(str(engine.get("scheduler")))
    if spec is None:
        return ()  # an unknown policy or one of the user's: validation names it
    known = spec.options
    dropped = [k for k in options if k not in known]
    if not dropped:
        return ()
    engine["options"] = {k: v for k, v in options.items() if k in known}
    return (f"engine.options: dropped {', '.join(dropped)} (options of scheduler {old!r}, which "
            f"--set engine.scheduler={engine.get('scheduler')} replaced)",)


PARALLEL_PATHS = ("engine.tensor_parallel_size", "engine.pipeline_parallel_size")


def _drop_derived_gpus(raw: dict, paths: list[str]) -> tuple[str, ...]:
    """``--set engine.tensor_parallel_size=2`` on a file stating ``hardware.gpus_per_replica: 1``
    drops the file's gpus_per_replica, with a note: it follows from tp x pp, and ``--set`` cannot
    remove a field (the run was refused, asking to remove it). A gpus_per_replica given by an
    override too is kept, and checked against tp x pp as in a file."""
    if not any(p in PARALLEL_PATHS for p in paths) or any(p in ("hardware", "hardware.gpus_per_replica")
                                                           for p in paths):
        return ()
    hw = raw.get("hardware")
    if not isinstance(hw, dict) or "gpus_per_replica" not in hw:
        return ()
    old = hw.pop("gpus_per_replica")
    given = ", ".join(p for p in paths if p in PARALLEL_PATHS)
    return (f"hardware.gpus_per_replica: dropped ({old!r} in the scenario; it follows from {given}: GPUs a "
            f"replica = tensor x pipeline parallel size)",)


def _flow(d: dict) -> str:
    """A mapping in YAML flow style, for messages that show a --set value."""
    return yaml.safe_dump(d, default_flow_style=True, width=1 << 16).strip() if d else "{}"


def _deep_copy(x: Any) -> Any:
    """A copy of the raw data; numpy scalars (from Python callers' grids) become Python ones, so
    strict validation sees what they mean (np.int64(64) is the integer 64), never their type."""
    if isinstance(x, dict):
        return {k: _deep_copy(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_deep_copy(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x
