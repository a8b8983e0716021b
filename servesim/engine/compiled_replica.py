"""Drive the compiled core (:mod:`servesim.engine.compiled`) as a SimPy process.

The kernel works in place on the same request columns, KV block counts and recorder buffers as
the Python engine, so everything downstream (summary, parquet, tests) is shared. This driver only
calls the step-time model, drains the recorder buffers and yields one SimPy timeout per segment.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from servesim.engine.inbox import INF, Inbox
from servesim.engine.state import ReplicaState
from servesim.metrics.collect import Recorder
from servesim.perf.base import StepTimeModel
from servesim.request import NUM_CLASSES


def supported(sc, kv, policy, on_iteration, check_invariants) -> str | None:
    """Why the compiled core cannot run this simulation (None: it can)."""
    from servesim.kv.paged import PagedKV
    from servesim.sched.continuous import ContinuousBatching

    e = sc.engine
    if type(policy) is not ContinuousBatching:
        return f"scheduler {e.scheduler!r}"
    if e.preemption != "recompute":
        return f"preemption {e.preemption!r}"
    if e.num_scheduler_steps != 1:
        return "multi-step scheduling"
    if type(kv) is not PagedKV:
        return f"KV allocator {type(kv).__name__}"
    if on_iteration is not None:
        return "an iteration hook"
    if check_invariants:
        return "invariant checks"
    try:
        import numba  # noqa: F401
    except ImportError:  # pragma: no cover - numba is a dependency
        return "numba is not installed"
    return None


class CompiledReplica:
    name = "compiled"

    def __init__(self, env, state: ReplicaState, model: StepTimeModel, recorder: Recorder, inbox: Inbox, *,
                 max_model_len: int, chunked_prefill: bool, max_num_batched_tokens: int, max_num_seqs: int,
                 stop_time: float = INF, fast_path: bool = True, warmup_requests: int = 0,
                 cpu_overhead_s: float = 0.0, cpu_overhead_per_seq_s: float = 0.0,
                 progress: Callable[[int], None] | None = None, stop_when_drained: bool = True):
        from servesim.engine import compiled as C

        self.C = C
        self.env = env
        self.st = state
        self.kv = state.kv
        self.model = model
        self.rec = recorder
        self.progress = progress
        req = state.req
        n = req.n
        I = np.zeros(C.I_SIZE, dtype=np.int64)
        F = np.zeros(C.F_SIZE, dtype=np.float64)
        I[C.I_N] = n
        I[C.I_FREE] = self.kv.free_blocks
        I[C.I_NBLOCKS] = self.kv.num_blocks
        I[C.I_BS] = self.kv.block_size
        I[C.I_BUDGET] = max_num_batched_tokens
        I[C.I_MAXSEQS] = max_num_seqs
        I[C.I_CHUNKED] = int(chunked_prefill)
        I[C.I_MML] = max_model_len
        I[C.I_MAXSLOTS] = self.kv.max_slots()
        I[C.I_FAST] = int(fast_path)
        I[C.I_NCLASS] = NUM_CLASSES
        I[C.I_WARMUP] = warmup_requests if 0 < warmup_requests < n else -1
        I[C.I_DRAIN] = int(stop_when_drained)
        F[C.F_STOP] = stop_time
        F[C.F_ITL_FROM] = INF if I[C.I_WARMUP] >= 0 or 0 < n <= warmup_requests else 0.0
        F[C.F_CPU_C] = cpu_overhead_s
        F[C.F_CPU_P] = cpu_overhead_per_seq_s
        # inbox: open loop reads the sorted arrival column; closed loop starts with the heap
        heap_cap = max(len(inbox._heap) + 1, 1) if inbox._closed else 1  # clients, at most
        heap_t = np.empty(heap_cap)
        heap_id = np.empty(heap_cap, dtype=np.int64)
        if inbox._closed:
            I[C.I_CLOSED] = 1
            for t, rid in sorted(inbox._heap):
                C._heap_push(I, heap_t, heap_id, t, rid)
            I[C.I_NEXT_ID] = inbox._next_id
        self.I, self.F = I, F
        seqs = max_num_seqs + 1
        self.args = (
            I, F, req.arrival, req.prompt, req.output, req.klass, req.computed, req.num_output,
            req.t_first_sched, req.t_first_token, req.t_finish, req.t_last_token, req.preemptions,
            req.status, req.reject_reason, req.blocked, self.kv.held,
            np.empty(n + 1, dtype=np.int32),  # waiting queue (ring)
            np.empty(seqs, dtype=np.int64),  # running ids
            np.empty(seqs, dtype=np.int64),  # batch ids
            np.empty(seqs, dtype=np.int64),  # batch new tokens
            state.clock_k, state.cause_now.copy(), heap_t, heap_id, inbox.think,
            np.empty(C.MAX_RUN_STEPS, dtype=np.int64),  # blocks in use per step of a decode run
            recorder._start, recorder._end, recorder._vals, recorder._itl_w,
            np.empty(seqs),  # irregular inter-token gaps of one segment
        )
        self.now = 0.0
        self.ended = 0

    def process(self):
        C, I, F, args, model, rec = self.C, self.I, self.F, self.args, self.model, self.rec
        b_ids, b_new, computed, irr = args[19], args[20], args[6], args[-1]
        empty = np.empty(0)
        limit = rec.BUFFER - C.MAX_RUN_STEPS - 1
        code = C.step(C.NONE, empty, 0.0, *args)
        segments = 0
        while code != C.DONE:
            nb = int(I[C.I_B_LEN])
            if code == C.DECODE:
                dts = model.predict_decode_run(nb, int(I[C.I_S]), int(I[C.I_K]))
                code = C.step(C.DECODE, dts, 0.0, *args)
            else:
                ids = b_ids[:nb]
                dt = model.predict(b_new[:nb], computed[ids])
                code = C.step(C.MIXED, empty, float(dt), *args)
            if I[C.I_IRR_LEN]:
                rec.itl_values(irr[: I[C.I_IRR_LEN]].copy())
                I[C.I_IRR_LEN] = 0
            if I[C.I_FILL] > limit:
                rec._fill = int(I[C.I_FILL])
                rec.itl_from = float(F[C.F_ITL_FROM])
                rec.flush()
                I[C.I_FILL] = 0
            yield self.env.timeout(max(0.0, F[C.F_NOW] - self.env.now))
            segments += 1
            if self.progress is not None and segments % 4096 == 0:
                self.progress(int(I[C.I_ENDED]))
        if I[C.I_ERROR]:
            raise RuntimeError("compiled engine: empty batch with work pending (a policy bug)")
        rec._fill = int(I[C.I_FILL])
        rec.itl_from = float(F[C.F_ITL_FROM])
        rec.cpu_s += float(F[C.F_CPU_S])
        self.kv.free_blocks = int(I[C.I_FREE])
        self.kv.holders.reset(np.flatnonzero(self.kv.held > 0))  # the kernel changed holdings directly
        self.now = float(F[C.F_NOW])
        self.ended = int(I[C.I_ENDED])
        if self.progress is not None:
            self.progress(self.ended)
