"""Engine versions and their automatic rules: what an engine decides by itself at start-up.

A real engine fills some of its flags from the model and the GPU when the user leaves them unset:
vLLM 0.6 turns chunked prefill on for long-context models, vLLM V1 picks its token budget by GPU
class, SGLang derives its memory fraction and chunk size from the GPU's memory. A scenario names
the engine version it stands for with ``engine.preset`` (the presets in ``scenarios/engines/``
do), and :func:`engine_rules` applies that version's rules to the engine fields the scenario does
not give, when the scenario is built. Each decision comes back as a note for the run header, with
the engine source it follows, e.g.::

    chunked prefill on: max_model_len 40960 > 32768 (vLLM 0.6 vllm/engine/arg_utils.py)

A field the scenario gives is never changed (``--set`` wins, as a flag does on the engine's
command line). The presets' other defaults are plain values in their YAML files, each with a
comment naming its source; only the decisions an engine takes from the model and GPU live here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from servesim.hardware import GPUS, MIB

if TYPE_CHECKING:
    from servesim.scenario import Scenario

ALIASES = {"vllm": "vllm-v1"}  # `vllm` is the current vLLM (the V1 engine)
NON_TORCH_BYTES = int(0.75 * 1024**3)  # as servesim/memory.py: CUDA context and workspaces

Rule = Callable[["Scenario", frozenset], "tuple[dict[str, Any], list[str]]"]


def _acts(sc: "Scenario", tokens: int, seqs: int) -> int:
    """Activation bytes servesim's memory plan reserves (servesim/memory.py), plus non-torch."""
    shape = sc.model_shape
    return (tokens * shape.activation_bytes_per_token(sc.tp) + seqs * (shape.vocab_size // sc.tp) * 4
            + NON_TORCH_BYTES)


def _util_from_free_fraction(sc: "Scenario", frac: float, tokens: int, seqs: int) -> float:
    """servesim's ``gpu_memory_utilization`` (a share of the whole GPU that weights, activations
    and KV share) for an engine whose KV is ``frac`` of the memory left free after weights and
    activations (TensorRT-LLM, LMDeploy): KV = frac (T - W - A) = u T - W - A."""
    total = GPUS[sc.hardware.gpu].memory_bytes
    used = sc.model_shape.weight_bytes(sc.tp, sc.pp) + _acts(sc, tokens, seqs)
    return round(min(0.99, frac + (1.0 - frac) * used / total), 4)


# ------------------------------------------------------------------------------ vLLM 0.6 (V0)
def _vllm_v0(sc: "Scenario", given: frozenset) -> tuple[dict[str, Any], list[str]]:
    e, out, notes = sc.engine, {}, []
    mml = sc.max_model_len
    chunked = e.enable_chunked_prefill
    if "enable_chunked_prefill" not in given:
        # vllm/engine/arg_utils.py (v0.6.x), EngineArgs.create_engine_config: with the flag unset,
        # use_long_context = max_model_len > 32K turns chunked prefill on, unless the model uses a
        # sliding window (get_sliding_window() is not None; nor with speculative decoding or LoRA,
        # which servesim does not model); otherwise it stays off
        window = getattr(sc.model_shape, "sliding_window", 0) or 0
        chunked = mml > 32768 and not window
        out["enable_chunked_prefill"] = chunked
        why = (f"max_model_len {mml} > 32768 but the model has a {window}-token sliding window" if mml > 32768
               and window else f"max_model_len {mml} {'>' if chunked else '<='} 32768")
        notes.append(f"chunked prefill {'on' if chunked else 'off'}: {why} (vLLM 0.6 vllm/engine/arg_utils.py)")
    _vllm_budget(sc, given, chunked, "0.6", out, notes)
    _vllm_v0_batch_order(sc, chunked, "0.6", out, notes)
    _vllm_v0_async_output(sc, out, notes)
    return out, notes


def _vllm_v0_async_output(sc: "Scenario", out: dict, notes: list) -> None:
    """vLLM 0.6.0's asynchronous output processing, on by default (vllm/engine/arg_utils.py
    ``--disable-async-output-proc`` False; vllm/config.py ModelConfig.verify_async_output_proc
    turns it off with pipeline parallelism or --enforce-eager, i.e. CUDA graphs off): a step's
    samples become RequestOutputs inside the next step's model call (worker/model_runner.py calls
    ``async_callback`` after compute_logits; multi-step: worker/multi_step_model_runner.py
    ``_async_process_outputs``), so each iteration's tokens reach the clients when the engine's
    next call returns (docs/schedulers.md). vLLM 0.4.2 has no such processor (vllm-v0.4 keeps
    tokens at their step's end). Only the vllm policy has the option; options the scenario
    gives keep theirs."""
    opts = dict(out.get("options") or sc.engine.options or {})
    if sc.engine.scheduler != "vllm" or "async_output" in (sc.engine.options or {}):
        return
    graphs = getattr(sc.step_time, "cuda_graph", True)
    closed = bool(sc.workload.closed_loops())
    on = bool(graphs) and sc.pp == 1 and not closed
    if on:
        out["options"] = {**opts, "async_output": True}
    src = " (vLLM 0.6 vllm/config.py verify_async_output_proc, vllm/engine/llm_engine.py step)"
    if on:
        notes.append("asynchronous output processing on (CUDA graphs on, no pipeline parallelism): an iteration's "
                     "tokens reach the clients when the next engine call returns" + src)
        return
    why = ("pipeline parallelism" if sc.pp != 1 else "CUDA graphs off (--enforce-eager)" if not graphs else
           "a closed loop: servesim's clients send their next request at the engine's finish, which the lag "
           "would put before their last token arrives, so it is not modelled here although vLLM 0.6 would lag")
    notes.append(f"asynchronous output processing off ({why}): tokens reach the clients at their iteration's "
                 f"end" + src)


def _vllm_v0_batch_order(sc: "Scenario", chunked: bool, version: str, out: dict, notes: list) -> None:
    """vllm/core/scheduler.py (the same in v0.4.2 and v0.6.x): with chunked prefill off the
    scheduler is ``_schedule_default``, which schedules the waiting prompts that fit first and
    "Don't schedule decodes if prefills are scheduled": a step is all prefill or all decode. With
    chunked prefill on it is ``_schedule_chunked_prefill``, running requests first, then waiting
    ones in the same step (the vllm policy's default order). Only the vllm policy has the option
    (Halo's priority policy keeps its own order). Limit: when the scenario gives ``options``
    itself, the decided ``mix`` is kept with them, so a later override that turns chunked prefill
    on keeps ``prefill_first``; set ``engine.options.mix`` explicitly there."""
    opts = dict(sc.engine.options or {})
    if chunked or sc.engine.scheduler != "vllm" or "mix" in opts:
        return
    out["options"] = {**opts, "mix": "prefill_first"}
    notes.append("prefill-first steps: chunked prefill off, so no decodes in a step with prefills "
                 f"(vLLM {version} vllm/core/scheduler.py _schedule_default)")


def _vllm_budget(sc: "Scenario", given: frozenset, chunked: bool, version: str, out: dict, notes: list) -> None:
    """vllm/config.py SchedulerConfig (the same rule in v0.4.2 and v0.6.x): with the budget unset,
    512 with chunked prefill ("the best balance between ITL and TTFT on A100"), else
    max(max_model_len, 2048)."""
    if "max_num_batched_tokens" in given:
        return
    mml = sc.max_model_len
    budget = 512 if chunked else max(mml, 2048)
    out["max_num_batched_tokens"] = budget
    notes.append(f"max_num_batched_tokens {budget}: " + ("512 with chunked prefill" if chunked else
                 f"max(max_model_len {mml}, 2048) without chunked prefill") + f" (vLLM {version} vllm/config.py)")


# ------------------------------------------------------------------------------ vLLM 0.4.2
def _vllm_v0_4(sc: "Scenario", given: frozenset) -> tuple[dict[str, Any], list[str]]:
    """vLLM 0.4.2 (the version report A's Halo forks): chunked prefill is a plain flag, off by
    default (vllm/engine/arg_utils.py v0.4.2: enable_chunked_prefill False, no long-context
    rule), so the only start-up decision is the token budget that follows from it."""
    out: dict[str, Any] = {}
    notes: list[str] = []
    _vllm_budget(sc, given, bool(sc.engine.enable_chunked_prefill), "0.4.2", out, notes)
    _vllm_v0_batch_order(sc, bool(sc.engine.enable_chunked_prefill), "0.4.2", out, notes)
    return out, notes


# ------------------------------------------------------------------------------ vLLM V1
def _vllm_v1(sc: "Scenario", given: frozenset) -> tuple[dict[str, Any], list[str]]:
    out, notes = {}, []
    if "enable_chunked_prefill" not in given:
        # vllm/engine/arg_utils.py (v0.10.x), _set_default_args_v1: "V1 always uses chunked prefills"
        out["enable_chunked_prefill"] = True
        notes.append("chunked prefill on: V1 always chunks (vLLM V1 vllm/engine/arg_utils.py)")
    if "enable_prefix_caching" not in given:
        # ibid.: "V1 enables prefix caching by default"
        out["enable_prefix_caching"] = True
        notes.append("prefix caching on: V1's default (vLLM V1 vllm/engine/arg_utils.py)")
    gpu = GPUS[sc.hardware.gpu]
    # vllm/engine/arg_utils.py (v0.10.x), EngineArgs.get_batch_defaults, usage context
    # OPENAI_API_SERVER (`vllm serve`): >= 70 GiB and not an A100 (PR #17885: a larger budget
    # lowered A100 throughput): 8192 tokens, 1024 sequences; otherwise 2048 and 256
    big = gpu.memory_bytes >= 70 * 1024**3 and "a100" not in gpu.name
    why = (f"{gpu.name}: >= 70 GiB and not an A100" if big else
           f"{gpu.name}: an A100" if "a100" in gpu.name else f"{gpu.name}: < 70 GiB")
    for name, value in (("max_num_batched_tokens", 8192 if big else 2048), ("max_num_seqs", 1024 if big else 256)):
        if name not in given:
            out[name] = value
            notes.append(f"{name} {value}: vllm serve default for {why} (vLLM V1 vllm/engine/arg_utils.py "
                         f"get_batch_defaults)")
    return out, notes


# ------------------------------------------------------------------------------ SGLang
def _sglang_chunk(gpu_mib: float) -> int:
    """python/sglang/srt/server_args.py (v0.5.x), _handle_gpu_memory_settings: chunk by memory."""
    if gpu_mib < 35 * 1024:
        return 2048
    if gpu_mib < 60 * 1024:
        return 4096
    if gpu_mib < 160 * 1024:
        return 8192
    return 16384


def _radix_eviction(sc: "Scenario", given: frozenset, out: dict, notes: list, source: str) -> None:
    """The radix cache's own eviction order (servesim/kv/radix.py) where its cache is on: SGLang's
    python/sglang/srt/mem_cache/radix_cache.py ``evict`` takes unlocked tree leaves, least
    recently accessed first, whole nodes, and only when the free pool is short (the same rule in
    v0.3.2 and v0.5.x). Not with hot-prefix preload (a Halo feature): the eviction is then left
    as given."""
    on = out.get("enable_prefix_caching", sc.engine.enable_prefix_caching)
    if "prefix_cache_eviction" in given or not on or sc.engine.kv.preload is not None:
        return
    out["prefix_cache_eviction"] = "sglang"
    notes.append(f"prefix cache eviction sglang: unlocked radix-tree leaves, least recently accessed first, whole "
                 f"nodes, only when the free pool is short (SGLang {source} evict)")


def _sglang(sc: "Scenario", given: frozenset) -> tuple[dict[str, Any], list[str]]:
    e, out, notes = sc.engine, {}, []
    gpu = GPUS[sc.hardware.gpu]
    mib = gpu.memory_bytes / MIB
    chunk = e.chunked_prefill_size
    if "chunked_prefill_size" not in given and e.scheduler == "chunked":
        chunk = _sglang_chunk(mib)
        out["chunked_prefill_size"] = chunk
        notes.append(f"chunked_prefill_size {chunk}: {gpu.name} has {mib / 1024:.0f} GiB "
                     f"(SGLang python/sglang/srt/server_args.py _handle_gpu_memory_settings)")
    if "enable_prefix_caching" not in given:
        # server_args.py: disable_radix_cache = False (the radix cache is on unless disabled)
        out["enable_prefix_caching"] = True
        notes.append("prefix caching on: SGLang's radix cache is on by default (server_args.py)")
    _radix_eviction(sc, given, out, notes, "radix_cache.py, v0.5.x")
    if "gpu_memory_utilization" not in given:
        # server_args.py (v0.5.x), _handle_gpu_memory_settings: reserved MiB = 512 + max(chunk,
        # 2048) x 1.5 + cuda_graph_max_bs x 2 + tp x pp / 8 x 1024, at least 10 GiB on > 60 GiB
        # GPUs; cuda_graph_max_bs by memory and tp (_sglang_graph_bs: 256 / 512 on 60-160 GiB);
        # mem_fraction_static = round((memory - reserved) / memory, 3)
        graph_bs = _sglang_graph_bs(sc)
        reserved = 512 + max(chunk or 8192, 2048) * 1.5 + graph_bs * 2 + sc.tp * sc.pp / 8 * 1024
        if mib > 60 * 1024:
            reserved = max(reserved, 10 * 1024)
        mfs = round((mib - reserved) / mib, 3)
        # SGLang's fraction is weights + KV pool; servesim's utilization also holds the activations
        # its memory plan reserves (servesim/memory.py), which SGLang keeps in `reserved`
        total = gpu.memory_bytes
        extra = _acts(sc, e.max_num_batched_tokens, e.max_num_seqs) / total  # as memory.py plans them
        util = round(min(0.99, mfs + extra), 4)
        out["gpu_memory_utilization"] = util
        notes.append(f"gpu_memory_utilization {util}: mem_fraction_static {mfs} = ({mib:.0f} - {reserved:.0f} "
                     f"reserved MiB) / {mib:.0f} MiB, plus the activations servesim plans apart (SGLang "
                     f"server_args.py _handle_gpu_memory_settings)")
    return out, notes


def _sglang_v0_3(sc: "Scenario", given: frozenset) -> tuple[dict[str, Any], list[str]]:
    """SGLang v0.3.2 (the version report B names): a fixed 8,192-token chunk (a plain value in the
    preset), the radix cache on, and mem_fraction_static by tensor-parallel size alone, not yet
    by GPU memory as v0.5 does."""
    e, out, notes = sc.engine, {}, []
    if "enable_prefix_caching" not in given:
        # python/sglang/srt/server_args.py (v0.3.2): disable_radix_cache = False
        out["enable_prefix_caching"] = True
        notes.append("prefix caching on: SGLang's radix cache is on by default (SGLang 0.3.2 server_args.py)")
    _radix_eviction(sc, given, out, notes, "SGLang 0.3.2 radix_cache.py")
    if "gpu_memory_utilization" not in given:
        # server_args.py (v0.3.2), ServerArgs.__post_init__: mem_fraction_static 0.88 at tp 1,
        # 0.87 from tp 2, 0.85 from 4, 0.83 from 8, 0.79 from 16
        tp = sc.tp
        mfs = 0.79 if tp >= 16 else 0.83 if tp >= 8 else 0.85 if tp >= 4 else 0.87 if tp >= 2 else 0.88
        # as _sglang: SGLang's fraction is weights + KV pool; servesim's utilization also holds
        # the activations its memory plan reserves
        extra = _acts(sc, e.max_num_batched_tokens, e.max_num_seqs) / GPUS[sc.hardware.gpu].memory_bytes
        util = round(min(0.99, mfs + extra), 4)
        out["gpu_memory_utilization"] = util
        notes.append(f"gpu_memory_utilization {util}: mem_fraction_static {mfs} at tp {tp}, plus the activations "
                     f"servesim plans apart (SGLang 0.3.2 server_args.py)")
    return out, notes


# ------------------------------------------------------------------------------ TensorRT-LLM
def _tensorrt_llm(sc: "Scenario", given: frozenset) -> tuple[dict[str, Any], list[str]]:
    e, out, notes = sc.engine, {}, []
    if "gpu_memory_utilization" not in given:
        # tensorrt_llm/llmapi/llm_args.py (v1.0), KvCacheConfig.free_gpu_memory_fraction 0.9: the
        # KV cache takes 0.9 of the memory free after the weights and the profiled activations
        util = _util_from_free_fraction(sc, 0.9, e.max_num_batched_tokens, e.max_num_seqs)
        out["gpu_memory_utilization"] = util
        notes.append(f"gpu_memory_utilization {util}: KV = 0.9 of the memory free after weights and "
                     f"activations (TensorRT-LLM llm_args.py free_gpu_memory_fraction)")
    return out, notes


# ------------------------------------------------------------------------------ LMDeploy
def _lmdeploy(sc: "Scenario", given: frozenset) -> tuple[dict[str, Any], list[str]]:
    e, out, notes = sc.engine, {}, []
    gpu = GPUS[sc.hardware.gpu]
    seqs = e.max_num_seqs
    if "max_num_seqs" not in given:
        # lmdeploy/utils.py (v0.10.x), get_max_batch_size: a100 384, h100 / h200 1024, else 128
        seqs = 384 if "a100" in gpu.name else 1024 if gpu.name.startswith(("h100", "h200")) else 128
        out["max_num_seqs"] = seqs
        notes.append(f"max_num_seqs {seqs}: max_batch_size for {gpu.name} (LMDeploy lmdeploy/utils.py "
                     f"get_max_batch_size)")
    if "gpu_memory_utilization" not in given:
        # lmdeploy/messages.py (v0.10.x), TurbomindEngineConfig.cache_max_entry_count 0.8: "the
        # percentage of FREE GPU memory" (after the weights) the KV cache takes
        util = _util_from_free_fraction(sc, 0.8, e.max_num_batched_tokens, seqs)
        out["gpu_memory_utilization"] = util
        notes.append(f"gpu_memory_utilization {util}: KV = 0.8 of the memory free after weights "
                     f"(LMDeploy lmdeploy/messages.py cache_max_entry_count)")
    return out, notes



# ------------------------------------------------------------------------------ LMDeploy v0.2.0
def _lmdeploy_v0_2(sc: "Scenario", given: frozenset) -> tuple[dict[str, Any], list[str]]:
    """TurboMind as LMDeploy v0.2.0 ran it (the version of its A100 benchmark page): a model
    converted by `lmdeploy convert` carries TurbomindModelConfig's defaults in its config.ini
    (lmdeploy/turbomind/deploy/target_model/base.py, v0.2.0), and LlamaTritonModel fills the
    rest at start-up (src/turbomind/triton_backend/llama/LlamaTritonModel.cc handleMissingParams,
    v0.2.0). Two of those decisions depend on the model and GPU: the per-step token budget and
    the KV pool."""
    e, out, notes = sc.engine, {}, []
    # converter: session_len = the chat template's session_len + 8 (target_model/base.py,
    # get_config; llama2's template: 4096, lmdeploy/model.py v0.2.0). servesim takes the model's
    # context length for the template's.
    session_len = sc.max_model_len + 8
    if "enable_chunked_prefill" not in given:
        # no flag in v0.2.0: the request that crosses the step budget always runs a part of its
        # prompt (SequenceManager.cc Transaction::Commit, v0.2.0)
        out["enable_chunked_prefill"] = True
        notes.append("chunked prefill on: TurboMind v0.2.0 always splits the prompt that crosses the step "
                     "budget (LMDeploy v0.2.0 SequenceManager.cc)")
    if "max_num_batched_tokens" not in given:
        # max_context_token_num 1 in config.ini is <= max_batch_size, so handleMissingParams makes
        # it 1 x session_len; num_tokens_per_iter 0 -> max_context_token_num; with max_prefill_iters
        # 1, LlamaBatch::AdjustMaxInputCount (src/turbomind/models/llama/LlamaBatch.cc v0.2.0) caps
        # the tokens of one step (a decode counts 1) at max_context_token_num
        out["max_num_batched_tokens"] = session_len
        notes.append(f"max_num_batched_tokens {session_len}: max_context_token_num = session_len "
                     f"(max_model_len {sc.max_model_len} + 8) (LMDeploy v0.2.0 LlamaTritonModel.cc "
                     f"handleMissingParams, LlamaBatch.cc AdjustMaxInputCount)")
    if "gpu_memory_utilization" not in given and e.num_gpu_blocks_override is None:
        # cache_max_entry_count 0.5 (target_model/base.py v0.2.0); a value below 1 is a share of
        # the GPU's TOTAL memory (BlockManager::GetBlockCount: total * ratio / block_size,
        # src/turbomind/models/llama/BlockManager.cc v0.2.0), not of what the weights leave
        total = GPUS[sc.hardware.gpu].memory_bytes
        used = sc.model_shape.weight_bytes(sc.tp, sc.pp) + _acts(sc, e.max_num_batched_tokens
                                                                  if "max_num_batched_tokens" in given
                                                                  else session_len, e.max_num_seqs)
        util = round(min(0.99, 0.5 + used / total), 4)
        out["gpu_memory_utilization"] = util
        notes.append(f"gpu_memory_utilization {util}: KV = 0.5 of the GPU's total memory (LMDeploy v0.2.0 "
                     f"cache_max_entry_count, BlockManager.cc GetBlockCount)")
    return out, notes

# ------------------------------------------------------------------------------ CUDA graphs
# Which iterations replay a CUDA graph, per engine version (step_time.cuda_graph_max_batch /
# cuda_graph_max_tokens; servesim/perf/packmodel.py prices a replay at its kernels' time and the
# rest at max(kernels, the eager CPU launch floor)). Each rule returns (max_batch, max_tokens, why).

def _vllm_v1_capture(sc: "Scenario") -> int:
    """vLLM V1 (v0.10.x): the largest CUDA-graph capture size. vllm/config.py SchedulerConfig:
    cuda_graph_sizes defaults to [min(2 x max_num_seqs, 512)], which CompilationConfig expands to
    1, 2, 4 and the multiples of 8 up to it; VllmConfig._set_cudagraph_sizes drops the sizes above
    max_num_batched_tokens."""
    e = sc.engine
    top = min(2 * e.max_num_seqs, 512)
    sizes = [x for x in [1, 2, 4] + list(range(8, top + 1, 8)) if x <= e.max_num_batched_tokens]
    return max(sizes) if sizes else 0


def _graphs_vllm_v1(sc: "Scenario") -> tuple[int, int, str]:
    # vllm/v1/worker/gpu_model_runner.py (v0.10.x), execute_model: a step whose scheduled tokens
    # are at most the largest capture size runs the piecewise CUDA graphs (torch.compile'd model,
    # attention between the pieces), padded to a capture size; a larger step runs the compiled
    # model eagerly. Decode and mixed steps alike (v0.11's FULL_AND_PIECEWISE adds full decode
    # graphs under the same cap: priced the same here).
    cap = _vllm_v1_capture(sc)
    e = sc.engine
    return cap, cap, (f"piecewise for every step of <= {cap} tokens = the largest capture size "
                      f"(min(2 x max_num_seqs {e.max_num_seqs}, 512, max_num_batched_tokens "
                      f"{e.max_num_batched_tokens})), eager above (vLLM V1 vllm/config.py cuda_graph_sizes, "
                      f"vllm/v1/worker/gpu_model_runner.py v0.10.x)")


def _graphs_vllm_v0(version: str) -> Callable[["Scenario"], tuple[int, int, str]]:
    def rule(sc: "Scenario") -> tuple[int, int, str]:
        # vllm/worker/model_runner.py (v0.4.2 and v0.6.x): _BATCH_SIZES_TO_CAPTURE = 1, 2, 4, 8..256
        # (at most max_num_seqs rounded up to a capture size); a step replays a graph only when it
        # is decode-only and its batch fits the largest captured size, else it runs eager
        return 256, 0, (f"decode-only, batches of <= 256 sequences (_BATCH_SIZES_TO_CAPTURE); prefill "
                        f"and mixed steps eager (vLLM {version} vllm/worker/model_runner.py)")
    return rule


def _sglang_graph_bs(sc: "Scenario") -> int:
    """python/sglang/srt/server_args.py (v0.5.x), _handle_gpu_memory_settings: cuda_graph_max_bs
    by GPU memory and tp (35-60 GiB: 32 below tp 4, else 160; 60-160 GiB: 256 / 512; larger: 512)."""
    mib = GPUS[sc.hardware.gpu].memory_bytes / MIB
    small = sc.tp < 4
    if mib < 60 * 1024:
        return 32 if small else 160
    if mib < 160 * 1024:
        return 256 if small else 512
    return 512


def _graphs_sglang(sc: "Scenario") -> tuple[int, int, str]:
    # python/sglang/srt/model_executor/cuda_graph_runner.py (v0.5.x): CudaGraphRunner captures
    # ForwardMode.DECODE batches up to cuda_graph_max_bs (can_run: batch <= max_bs); extend
    # (prefill) and mixed batches run eager (piecewise prefill graphs are opt-in there)
    bs = _sglang_graph_bs(sc)
    return bs, 0, (f"decode-only, batches of <= {bs} sequences: cuda_graph_max_bs for "
                   f"{sc.hardware.gpu} at tp {sc.tp} (SGLang server_args.py _handle_gpu_memory_settings, "
                   f"model_executor/cuda_graph_runner.py v0.5.x)")


def _graphs_sglang_v0_3(sc: "Scenario") -> tuple[int, int, str]:
    # python/sglang/srt/model_executor/cuda_graph_runner.py (v0.3.2): capture sizes 1, 2, 4 and
    # 8..160 in steps of 8, at most server_args.cuda_graph_max_bs (160 by default); decode only
    return 160, 0, ("decode-only, batches of <= 160 sequences (SGLang 0.3.2 cuda_graph_runner.py "
                    "capture sizes, server_args.py cuda_graph_max_bs)")


def _graphs_tensorrt_llm(sc: "Scenario") -> tuple[int, int, str]:
    # tensorrt_llm/llmapi/llm_args.py (v1.0), CudaGraphConfig: max_batch_size 0 -> 128; the
    # PyTorch model engine replays a graph for generation-only batches. Without enable_padding
    # (its default) only the captured sizes 1..32, 64, 128 replay; servesim takes 128 as a cap,
    # so batches of 33-63 and 65-127 are priced as graphs (a bound, not the exact set)
    return 128, 0, ("decode-only, batches of <= 128 sequences (TensorRT-LLM llm_args.py CudaGraphConfig "
                    "v1.0; unpadded sizes between its captured 32, 64 and 128 also priced as graphs)")


GRAPH_RULES: dict[str, Callable[["Scenario"], tuple[int, int, str]]] = {
    "vllm-v1": _graphs_vllm_v1,
    "vllm-v0": _graphs_vllm_v0("0.6"),
    "vllm-v0.4": _graphs_vllm_v0("0.4.2"),
    "sglang": _graphs_sglang,
    "sglang-v0.3": _graphs_sglang_v0_3,
    "tensorrt-llm": _graphs_tensorrt_llm,
    # lmdeploy, lmdeploy-v0.2: TurboMind launches its kernels from C++, so neither the Python
    # eager floor nor vLLM's capture rule applies; servesim keeps its default (every decode batch
    # replays, prefills eager) and says so in the header
}


def graph_rules(sc: "Scenario", given: frozenset) -> tuple[dict[str, Any], list[str]]:
    """Updates to step_time's CUDA-graph caps not in ``given`` and the header note, for ``sc``'s
    preset (after the engine rules: V1's cap follows max_num_seqs and the token budget). Only a
    pack or auto step model with cuda_graph on has caps."""
    name = sc.engine.preset
    st = sc.step_time
    if name is None or getattr(st, "model", None) not in ("pack", "auto") or not st.cuda_graph:
        return {}, []
    rule = GRAPH_RULES.get(canonical(name))
    if rule is None:
        return {}, [f"cuda graphs: every decode batch, prefills eager (servesim's default: no capture rule "
                    f"for {canonical(name)}, whose engine launches from C++)"]
    batch, tokens, why = rule(sc)
    out: dict[str, Any] = {}
    if "cuda_graph_max_batch" not in given:
        out["cuda_graph_max_batch"] = batch
    if tokens and "cuda_graph_max_tokens" not in given:
        out["cuda_graph_max_tokens"] = tokens
    if not out:
        return {}, []
    return out, [f"cuda graphs: {why}" + ("" if len(out) == 1 + bool(tokens) else " (step_time gives the rest)")]


RULES: dict[str, tuple[str, Rule]] = {
    # preset name: (what it stands for, its automatic rules)
    "vllm-v0": ("vLLM 0.6.x, the V0 engine", _vllm_v0),
    "vllm-v0.4": ("vLLM 0.4.2 (report A's Halo base)", _vllm_v0_4),
    "vllm-v1": ("vLLM V1 (the current engine, v0.10.x)", _vllm_v1),
    "sglang": ("SGLang v0.5.x", _sglang),
    "sglang-v0.3": ("SGLang v0.3.2 (report B's version)", _sglang_v0_3),
    "tensorrt-llm": ("TensorRT-LLM v1.0 (trtllm-serve, PyTorch backend)", _tensorrt_llm),
    "lmdeploy": ("LMDeploy v0.10.x (TurboMind)", _lmdeploy),
    "lmdeploy-v0.2": ("LMDeploy v0.2.0 (TurboMind; its A100 benchmark page's version)", _lmdeploy_v0_2),
}
PRESET_NAMES = tuple(RULES) + tuple(ALIASES)


def canonical(name: str) -> str:
    return ALIASES.get(name, name)


def engine_rules(sc: "Scenario", given: frozenset) -> tuple[dict[str, Any], list[str]]:
    """Updates to the engine fields not in ``given`` and the header notes, for ``sc``'s preset.
    Rules run once, in a fixed order per engine, each seeing the decisions before it."""
    name = sc.engine.preset
    if name is None:
        return {}, []
    return RULES[canonical(name)][1](sc, given)
