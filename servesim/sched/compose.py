"""From a scenario's engine section to the kernels' configuration: a policy as parts.

The catalog (servesim/policy_catalog.py) says what each built-in policy is made of; this module
turns that, the engine knobs and the policy's options into one frozen :class:`EngineCfg`.
"""

from __future__ import annotations

import numpy as np

from servesim.policy_catalog import POLICIES, PolicySpec, read_options
from servesim.request import NUM_CLASSES
from servesim.sched.state import (
    B_CHUNK_ONLY,
    B_HYBRID,
    B_PREFILL_FIRST,
    B_RUNNING_FIRST,
    B_STALL_FREE,
    B_STATIC,
    NUM_QUEUES,
    Q_CLASSES,
    Q_FIFO,
    V_LOWEST_CLASS,
    V_NEWEST,
    V_RETRACT,
    EngineCfg,
)

GIB = 1 << 30
BATCH_RULES = {"running_first": B_RUNNING_FIRST, "static": B_STATIC, "stall_free": B_STALL_FREE,
               "prefill_first": B_PREFILL_FIRST, "hybrid_only": B_HYBRID, "chunk_only": B_CHUNK_ONLY}
VICTIMS = {"newest": V_NEWEST, "lowest_class": V_LOWEST_CLASS, "retract": V_RETRACT, "sglang": V_RETRACT}
QUEUES = {"fifo": Q_FIFO, "classes": Q_CLASSES}
NO_LIMIT = 1 << 62


def policy_spec(name: str) -> PolicySpec:
    return POLICIES[name]


def compose(engine, spec: PolicySpec, *, max_model_len: int, max_slots: int, block_size: int,
            kv_bytes_per_token: int, host_bw: float, fast: bool, closed: bool, max_arrivals: int, warmup_id: int,
            stop_time: float, check: bool, n: int, stop_when_drained: bool = True,
            kv_tokens: int = 0, routed: bool = False, report_ended: bool = False) -> tuple[EngineCfg, np.ndarray]:
    """``(EngineCfg, class_slots)`` for ``engine`` (a scenario EngineConfig) running ``spec``."""
    opts = read_options(dict(engine.options), spec.name, spec.options)
    budget = engine.max_num_batched_tokens
    max_seqs = engine.max_num_seqs
    batch = spec.batch
    victim = spec.victim
    sglang = opts.get("admission") == "sglang"
    if "mix" in opts:  # the chunked policy's mode, or the vllm policy's batch order (policy_catalog)
        batch = opts["mix"]
    if spec.name == "chunked":  # SGLang's cap on running requests
        running = engine.max_running_requests
        if running is None and sglang:  # SGLang derives it from the KV pool and the context length
            running = min(max(2048, min(4096, kv_tokens * 512 // max(max_model_len, 1))), max(kv_tokens // 2, 1))
        max_seqs = min(running or max_seqs, max_seqs)
    if opts.get("retract") == "sglang":
        victim = "retract"
    chunk = min(engine.chunked_prefill_size or budget, budget)
    slots = opts.get("class_max_seqs") or [max_seqs]
    slots = list(slots) + [slots[-1]] * (NUM_CLASSES - len(slots))
    class_slots = np.array([min(s, max_seqs) for s in slots] + [NO_LIMIT], dtype=np.int64)
    assert len(class_slots) == NUM_QUEUES
    cap = min(engine.max_batch_size, engine.max_num_seqs)
    ratio_init = min(0.7 * float(opts.get("schedule_conservativeness") or 1.0), 1.0)  # SGLang's defaults
    ratio_min = 0.14 * ratio_init
    space = float(opts.get("swap_space_gib", 0.0) or 0.0) * GIB
    swap_capacity = int(space // kv_bytes_per_token) if kv_bytes_per_token > 0 else NO_LIMIT
    swap = engine.preemption == "swap"
    if swap and not host_bw > 0:
        raise ValueError("engine.preemption: swap needs the GPU's host link bandwidth")
    cfg = EngineCfg(
        queue=QUEUES[spec.queue], batch_rule=BATCH_RULES[batch], victim=VICTIMS[victim],
        whole_prompt_kv=spec.whole_prompt_kv and not sglang, sglang_admission=sglang,
        ratio_init=ratio_init, ratio_min=ratio_min, ratio_step=(ratio_init - ratio_min) / 600.0, chunked=bool(engine.enable_chunked_prefill or spec.always_chunks),
        max_seqs=int(max_seqs), budget=int(budget), chunk=int(chunk), steps=int(engine.num_scheduler_steps),
        micro=int(opts.get("micro_batch_size") or cap), batch_cap=int(cap),
        aging_s=float(opts.get("aging_s") or 0.0), preempt_lower=bool(opts.get("preempt_lower", False)),
        swap=swap, swap_capacity=int(swap_capacity), kv_bytes_per_token=int(kv_bytes_per_token),
        host_bw=float(host_bw) if host_bw > 0 else 1.0, block_size=int(block_size),
        max_model_len=int(max_model_len), max_slots=int(max_slots), fast=bool(fast), closed=bool(closed),
        max_arrivals=int(max_arrivals),
        warmup_id=int(warmup_id), stop_time=float(stop_time), stop_when_drained=bool(stop_when_drained),
        cpu_c=float(engine.cpu_overhead_s),
        cpu_p=float(engine.cpu_overhead_per_seq_s), check=bool(check), n=int(n),
        routed=bool(routed), report_ended=bool(report_ended), lag=bool(opts.get("async_output", False)),
    )
    return cfg, class_slots
