"""The built-in scheduling policies as data: their parts, their options, what they stand for.

Scenario validation reads this catalog (names, options and their checks) without importing any
policy code; ``servesim.sched.compose`` turns an entry into the kernels' configuration. A policy is
a composition of parts (see servesim/sched/policies.py):

=============  =========  =====================================  ==============  ==============
policy         queue      batch rule                             victim          KV at admission
=============  =========  =====================================  ==============  ==============
vllm           fifo       running_first                          newest          first chunk
chunked        fifo       stall_free | prefill_first |           newest |        whole prompt
                          hybrid_only | chunk_only (mix)         sglang (retract)
priority       classes    running_first (+ evicts lower classes) lowest_class    first chunk
static-fifo    fifo       static (request-level batches)         newest          first chunk
=============  =========  =====================================  ==============  ==============
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from servesim.fields import MAX_GIB, MAX_SECONDS, NUM_CLASSES, finite_number

MODES = ("stall_free", "prefill_first", "hybrid_only", "chunk_only")
#: the vllm policy's batch orders: V1's (and V0's with chunked prefill: vllm/core/scheduler.py
#: _schedule_chunked_prefill) running requests first, then waiting ones in the same step; and V0's
#: default with chunked prefill off (_schedule_default, v0.4.2 and v0.6.x: "Don't schedule decodes
#: if prefills are scheduled"): a step of whole prompts whenever one can be admitted, else decodes
VLLM_MIX = ("running_first", "prefill_first")
RETRACT = ("newest", "sglang")
ADMISSION = ("whole_prompt", "sglang")  # KV for the whole prompt at admission, or SGLang's reservation

OptionSpec = tuple[Any, Callable[[Any], bool], str]  # (default, check, allowed text)


def positive_number(x: Any) -> bool:
    """A finite number of seconds > 0 (at most servesim.fields.MAX_SECONDS)."""
    return finite_number(x, 0.0, MAX_SECONDS, lo_open=True)


def positive_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 1 << 20


def class_list(x: Any) -> bool:
    return (isinstance(x, list) and 1 <= len(x) <= NUM_CLASSES
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in x))


SWAP_SPACE: OptionSpec = (4.0, lambda x: finite_number(x, 0.0, MAX_GIB),
                          f"CPU swap space in GiB per GPU, a number in [0, {MAX_GIB:.0f}] (vLLM --swap-space, default 4)")


@dataclass(frozen=True)
class PolicySpec:
    name: str
    summary: str
    queue: str  # fifo | classes
    batch: str  # running_first | static | stall_free | prefill_first | hybrid_only | chunk_only
    victim: str  # newest | lowest_class | retract
    whole_prompt_kv: bool = False  # admission reserves KV for the whole prompt
    always_chunks: bool = False  # prompts are split whatever enable_chunked_prefill says
    options: dict[str, OptionSpec] = field(default_factory=dict)


POLICIES: dict[str, PolicySpec] = {
    "vllm": PolicySpec(
        "vllm", "continuous batching over paged KV (vLLM)", "fifo", "running_first", "newest",
        options={"swap_space_gib": SWAP_SPACE,
                 "mix": ("running_first", lambda x: x in VLLM_MIX,
                         "allowed: running_first (vLLM V1, and V0 with chunked prefill), prefill_first "
                         "(vLLM V0's default with chunked prefill off: no decodes in a step with prefills)"),
                 "async_output": (False, lambda x: isinstance(x, bool),
                                  "true or false: vLLM 0.6's asynchronous output processing (an iteration's "
                                  "tokens reach the clients when the engine's next call returns; "
                                  "docs/schedulers.md)")}),
    "chunked": PolicySpec(
        "chunked", "chunked prefill, stall-free batching and its ablations (Sarathi-Serve, SGLang)",
        "fifo", "stall_free", "newest", whole_prompt_kv=True, always_chunks=True,
        options={"swap_space_gib": SWAP_SPACE,
                 "mix": ("stall_free", lambda x: x in MODES, f"allowed: {', '.join(MODES)}"),
                 "retract": ("newest", lambda x: x in RETRACT, f"allowed: {', '.join(RETRACT)}"),
                 "admission": ("whole_prompt", lambda x: x in ADMISSION, f"allowed: {', '.join(ADMISSION)}"),
                 "schedule_conservativeness": (1.0, lambda x: finite_number(x, 0.0, 100.0, lo_open=True),
                                               "SGLang --schedule-conservativeness: a number in (0, 100]")}),
    "priority": PolicySpec(
        "priority", "SLA classes P0..P4 that preempt lower classes, aging, class budgets (Halo)",
        "classes", "running_first", "lowest_class",
        options={"swap_space_gib": SWAP_SPACE,
                 "aging_s": (None, positive_number, "seconds of waiting per class of promotion: a finite number > 0"),
                 "class_max_seqs": (None, class_list,
                                    f"a list of 1..{NUM_CLASSES} integers >= 1: the largest running batch a "
                                    f"request of class P0, P1, .. may join (missing classes repeat the last value)"),
                 "preempt_lower": (True, lambda x: isinstance(x, bool), "true or false")}),
    "static-fifo": PolicySpec(
        "static-fifo", "request-level static batches, FIFO (Spark)", "fifo", "static", "newest",
        options={"micro_batch_size": (None, positive_int,
                                      "requests prefilled per iteration: an integer >= 1 (default: the whole batch)")}),
}


def policy_names() -> list[str]:
    return sorted(POLICIES)


def read_options(options: dict, policy: str, known: dict[str, OptionSpec]) -> dict:
    """``engine.options`` for ``policy``: unknown names and bad values raise ValueError naming the
    field, the value and what is allowed; missing ones take their defaults."""
    out = {}
    for key in options:
        if key not in known:
            owners = sorted(n for n, p in POLICIES.items() if key in p.options)
            hint = (f"; it belongs to scheduler {' / '.join(map(repr, owners))}" if owners else "")
            raise ValueError(f"engine.options.{key}: unknown option for scheduler {policy!r} "
                             f"(known: {', '.join(sorted(known)) or 'none'}){hint}")
    for key, (default, check, allowed) in known.items():
        value = options.get(key, default)
        if key in options and not check(value):
            raise ValueError(f"engine.options.{key} = {value!r}: {allowed}")
        out[key] = value
    return out


# ------------------------------------------------------------------------------ capabilities
@dataclass(frozen=True)
class Knob:
    """Who honours an engine knob: the policies that read it (``None``: every policy) and whether
    the compiled engine honours it (``compiled=False``: setting it sends the run to the Python
    engine, which honours every knob). Declared for every field of ``EngineConfig`` and of its
    ``kv`` block (a test holds the tables complete), so a new knob cannot be silently ignored."""

    policies: tuple[str, ...] | None = None
    compiled: bool = True
    why: str = ""


EVERY = None
CONTINUOUS = ("vllm", "chunked", "priority")
ENGINE_KNOBS: dict[str, Knob] = {
    "scheduler": Knob(EVERY),
    "preset": Knob(EVERY, why="the engine version whose automatic rules fill unset fields (config/engines.py)"),
    "tensor_parallel_size": Knob(EVERY, why="a replica's GPUs: step times, KV capacity, placement"),
    "pipeline_parallel_size": Knob(EVERY, why="virtual engines per replica (docs/cluster.md)"),
    "block_size": Knob(EVERY),
    "max_num_seqs": Knob(EVERY),
    "max_num_batched_tokens": Knob(EVERY),
    "enable_chunked_prefill": Knob(EVERY, why="the chunked policy chunks whatever it says"),
    "gpu_memory_utilization": Knob(EVERY),
    "preemption": Knob(CONTINUOUS, why="static batches reserve their KV up front and never swap"),
    "max_model_len": Knob(EVERY),
    "kv_cache_dtype": Knob(EVERY),  # memory plan and step times (servesim/models/precision.py)
    "enable_expert_parallel": Knob(EVERY),  # MoE step times (servesim/perf/roofline.py)
    "num_gpu_blocks_override": Knob(EVERY),
    "num_scheduler_steps": Knob(EVERY),
    "chunked_prefill_size": Knob(("chunked",), why="SGLang's chunk size (vLLM: max_num_batched_tokens)"),
    "max_running_requests": Knob(("chunked",), why="SGLang's cap on running requests (vLLM: max_num_seqs)"),
    "max_batch_size": Knob(("static-fifo",), why="the size of a static (request-level) batch"),
    "cpu_overhead_s": Knob(EVERY),
    "cpu_overhead_per_seq_s": Knob(EVERY),
    "api_request_s": Knob(EVERY, why="request path before the scheduler (runs on the fleet loop)"),
    "api_token_s": Knob(EVERY, why="token path after sampling (runs on the fleet loop)"),
    "api_server_count": Knob(EVERY, why="the request path as a FIFO queue of API servers, a transform of the "
                                        "open-loop arrivals before routing (engine/api_queue.py)"),
    "options": Knob(EVERY),
    "kv_allocator": Knob(EVERY),
    "enable_prefix_caching": Knob(EVERY, why="the prefix cache, its tiers and preload are kernels (kv/pcache.py)"),
    "prefix_cache_eviction": Knob(EVERY, why="applies to the prefix cache"),
    "kv": Knob(EVERY),
}
KV_KNOBS: dict[str, Knob] = {
    "static": Knob(EVERY),
    "elastic": Knob(EVERY),
    "protect_share": Knob(EVERY, why="priority eviction of the prefix cache"),
    "preload": Knob(EVERY, why="hot-prefix preload into the prefix cache"),
    "hash_outputs": Knob(EVERY, why="prefix-cache hashing of output blocks"),
}


def python_only_reasons(engine, kv_tiers: bool) -> list[str]:
    """Why a run with this engine section needs the Python engine (empty: it compiles). Every
    built-in knob compiles, the prefix cache, its tiers and preload included (kv/pcache.py)."""
    return [k for k, knob in ENGINE_KNOBS.items() if not knob.compiled and getattr(engine, k, None)]
