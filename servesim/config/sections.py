"""The scenario's own sections (stop, hardware, model, engine, step time, SLO, metrics, sim):
typed, frozen configs, each validated when built with one-line messages. servesim/scenario.py
composes them, with the workload, cluster and KV sections of servesim/config/, into a Scenario and
re-exports them (``from servesim.scenario import EngineConfig`` keeps working)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (BeforeValidator, Discriminator, Field, Tag, field_validator,
                      model_validator)

from servesim.config.cluster import LinkConfig
from servesim.fields import (
    RequestCount,
    RequestCount0,
    Seconds,
    Share,
    StepSeconds,
    StepSeconds0,
    StrictModel,
    TokenCount,
)
from servesim.policy_catalog import ENGINE_KNOBS
from servesim.config.engines import PRESET_NAMES
from servesim.config.kv import KVConfig
from servesim.hardware import GPUS
from servesim.models import KV_CACHE_DTYPES, MODELS, WEIGHT_FORMATS, ModelShape




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
    replicas: Annotated[int, Field(ge=1, le=16384)] = 1  # replicas of the engine, behind cluster.router
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
#: engines' flag values that name a weight format under another name: vLLM's ``--quantization
#: modelopt`` serves ModelOpt FP8 checkpoints (static activation scales; quantization/modelopt.py)
QUANTIZATION_ALIASES = {"modelopt": "fp8_static"}


def _quantization_alias(v: Any) -> Any:
    return QUANTIZATION_ALIASES.get(v, v) if isinstance(v, str) else v


QuantizationName = Annotated[Literal[tuple(WEIGHT_FORMATS)],  # type: ignore[valid-type]
                             BeforeValidator(_quantization_alias)]
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
    quantization: Optional[QuantizationName] = None  # none, fp8, fp8_static, int8, awq, gptq, mxfp4 (default: checkpoint's)

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
    # opt-in: the request path's arrival side as a FIFO queue of this many API servers per replica,
    # each busy api_request_s per request (vLLM --api-server-count); null: a latency that keeps
    # pace with any load. Open-loop arrivals only; docs/model.md "Request path"
    api_server_count: Annotated[int, Field(ge=1, le=1024)] | None = None
    # free-form options for a policy's own knobs (built-in and user policies)
    options: dict[str, Any] = {}
    # KV memory (docs/kv.md): allocator, vLLM's prefix caching flag, L1 eviction, details
    kv_allocator: Literal["paged", "static", "elastic"] = "paged"
    enable_prefix_caching: bool = False
    prefix_cache_eviction: Literal["lru", "priority", "sglang"] = "lru"
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
    """``gpu/model`` or ``gpu/model-tpN`` -> (gpu, model, tp), as step_time.fit names a pack
    (``model`` may be a pack name of another precision: ``llama-3-8b-fp8``);
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
    from servesim.models.precision import split_pack_name  # <model>[-<quantization>][-kv<dtype>]

    if split_pack_name(model)[0] not in MODELS:
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


GraphCap = Optional[Annotated[int, Field(ge=1, le=1 << 20)]]


def _caps_need_graphs(cfg) -> None:
    """``cuda_graph_max_batch`` / ``cuda_graph_max_tokens``: which iterations replay a CUDA graph
    (the rest pay the eager CPU launch floor), the engine version's capture rule, filled by
    ``engine.preset`` when not given (servesim/config/engines.py; docs/calibration.md). Unset,
    every pure-decode iteration replays and no prefill does. Both need graphs on."""
    for name in ("cuda_graph_max_batch", "cuda_graph_max_tokens"):
        v = getattr(cfg, name)
        if v is not None and not cfg.cuda_graph:
            raise ValueError(f"step_time.{name} = {v} needs cuda_graph: true (an eager engine replays "
                             f"no graphs); remove it or set cuda_graph: true")


class PackStepConfig(Frozen):
    """Measured kernel timings from a calibration pack, found from (gpu, model, tp)."""

    model: Literal["pack"]
    cuda_graph: bool = True  # decode iterations replay a CUDA graph (the pack's graph overheads)
    # pure-decode iterations of more sequences than this run eager (vLLM V0: 256; SGLang:
    # cuda_graph_max_bs); unset: any decode batch replays (engine.preset fills it)
    cuda_graph_max_batch: GraphCap = None
    # every iteration of at most this many new tokens replays, prefills and mixed steps too (vLLM
    # V1's piecewise graphs up to its largest capture size); unset: prefills run eager
    cuda_graph_max_tokens: GraphCap = None

    @model_validator(mode="after")
    def _caps(self) -> "PackStepConfig":
        _caps_need_graphs(self)
        return self


class AutoStepConfig(Frozen):
    """The default: the calibration pack of (gpu, model, tp) when one exists and fits, else the
    roofline with its default factors, reported everywhere as "roofline (uncalibrated)" with the
    reason (servesim/perf/select.py makes the choice)."""

    model: Literal["auto"]
    cuda_graph: bool = True  # with a pack: decode iterations replay a CUDA graph, as vLLM/SGLang do
    # with a pack: decode iterations of more sequences run eager (engine.preset fills it; unset: none)
    cuda_graph_max_batch: GraphCap = None
    # with a pack: every iteration of at most this many tokens replays, prefills too (vLLM V1's
    # piecewise graphs; engine.preset fills it; unset: prefills run eager)
    cuda_graph_max_tokens: GraphCap = None

    @model_validator(mode="after")
    def _caps(self) -> "AutoStepConfig":
        _caps_need_graphs(self)
        return self


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
    # a fleet sharded over this many Dask worker processes (servesim/engine/shard.py): replicas
    # partitioned, synchronised every cluster.router_refresh_s; the results of one process
    workers: Annotated[int, Field(ge=1, le=1024)] = 1


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
