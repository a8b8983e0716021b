"""vLLM-style continuous batching (the ``vllm`` policy).

Every iteration, in vLLM v1's order:

1. **Running requests first**, oldest first: each gets the tokens it still needs (1 for a decode;
   the rest of its prompt, capped by the remaining budget, when chunked prefill is on). If the KV
   manager cannot give it slots, the *newest* running request is preempted (recompute: its blocks
   are freed and it goes back to the front of the waiting queue) until the allocation succeeds or
   the request itself was the one preempted.
2. **Then waiting requests**, FCFS, unless something was preempted this iteration: admitted while
   ``max_num_seqs`` leaves a slot, the token budget ``max_num_batched_tokens`` covers the prompt
   (the whole prompt without chunked prefill; a chunk of it with), and the KV manager allocates.
   The first request that does not fit stops admission; everyone behind it waits for the same
   reason (strict FCFS, head-of-line blocking included).

Decodes therefore run every iteration. A preempted request recomputes its prompt *and* the tokens
it already generated, then continues.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from servesim.engine.state import ReplicaState
from servesim.scenario import EngineConfig
from servesim.sched.base import Batch, Cause, uniform_causes

_ONES_CACHE: dict[int, np.ndarray] = {}


def ones(n: int) -> np.ndarray:
    a = _ONES_CACHE.get(n)
    if a is None:
        a = np.ones(n, dtype=np.int64)
        a.flags.writeable = False
        _ONES_CACHE[n] = a
    return a


class ContinuousBatching:
    name = "vllm"

    def __init__(self, cfg: EngineConfig, state: ReplicaState):
        self.st = state
        self.req = state.req
        self.kv = state.kv
        self.budget = cfg.max_num_batched_tokens
        self.max_seqs = cfg.max_num_seqs
        self.chunked = cfg.enable_chunked_prefill
        self.waiting: deque[int] = deque()
        self._causes = {c: uniform_causes(c) for c in Cause}

    # -- protocol ----------------------------------------------------------------------------
    def enqueue(self, rid: int, now: float) -> None:
        self.waiting.append(rid)

    def num_waiting(self) -> int:
        return len(self.waiting)

    def on_finished(self, rid: int) -> None:
        pass

    def schedule(self, now: float) -> Batch:
        st, req, kv = self.st, self.req, self.kv
        budget = self.budget
        run = st.running.ids
        ids_parts: list[np.ndarray] = []
        new_parts: list[np.ndarray] = []
        preempted = False
        all_decode = True
        if len(run):
            need = req.prompt[run] + req.num_output[run] - req.computed[run]
            if len(run) <= budget and int(need.max()) == 1 and kv.allocate_decodes(run):
                ids_parts.append(run)
                new_parts.append(ones(len(run)))
                budget -= len(run)
            else:
                budget, preempted, all_decode = self._schedule_running(
                    run, need, budget, now, ids_parts, new_parts)
        cause = Cause.ITERATION
        admitted = False
        if preempted:
            cause = Cause.KV_BLOCKS if self.waiting else Cause.ITERATION
        else:
            waiting = self.waiting
            while waiting:
                if len(st.running) >= self.max_seqs:
                    cause = Cause.BATCH_SLOTS
                    break
                if budget <= 0:
                    cause = Cause.TOKEN_BUDGET
                    break
                rid = waiting[0]
                n = int(req.prompt[rid] + req.num_output[rid] - req.computed[rid])
                if n > budget:
                    if not self.chunked:
                        cause = Cause.TOKEN_BUDGET
                        break
                    n = budget
                if not kv.allocate(rid, n):
                    cause = Cause.KV_BLOCKS
                    break
                waiting.popleft()
                st.admit(rid, now)
                ids_parts.append(np.array([rid], dtype=np.int64))
                new_parts.append(np.array([n], dtype=np.int64))
                budget -= n
                admitted = True
        if len(ids_parts) == 1:
            ids, num_new = ids_parts[0], new_parts[0]
        elif ids_parts:
            ids, num_new = np.concatenate(ids_parts), np.concatenate(new_parts)
        else:
            ids = num_new = np.empty(0, dtype=np.int64)
        pure = all_decode and not admitted and not preempted and len(ids) > 0
        return Batch(ids=ids, num_new=num_new, waiting_cause=self._causes[cause],
                     pure_decode=pure, stable=pure)

    # -- the slow path: prefill chunks in flight, or the pool is short ------------------------
    def _schedule_running(self, run, need, budget, now, ids_parts, new_parts):
        st, kv = self.st, self.kv
        order = run.tolist()
        needs = dict(zip(order, need.tolist()))
        preempted = False
        all_decode = True
        sched_ids: list[int] = []
        sched_new: list[int] = []
        victims: set[int] = set()
        i = 0
        while i < len(order):
            rid = order[i]
            i += 1
            if rid in victims:
                continue
            n = min(needs[rid], budget)
            if n <= 0:
                continue
            scheduled = True
            while not kv.allocate(rid, n):
                # preempt the newest running request that is not yet a victim
                victim = next(r for r in reversed(order) if r not in victims)
                victims.add(victim)
                if victim in sched_ids:  # pragma: no cover - victims come from the back
                    raise AssertionError("preempting an already scheduled request")
                st.preempt(victim, now)
                self.waiting.appendleft(victim)
                preempted = True
                if victim == rid:
                    scheduled = False
                    break
            if not scheduled:
                break
            sched_ids.append(rid)
            sched_new.append(n)
            budget -= n
            if n != 1 or needs[rid] != 1:
                all_decode = False
        if sched_ids:
            ids_parts.append(np.array(sched_ids, dtype=np.int64))
            new_parts.append(np.array(sched_new, dtype=np.int64))
        return budget, preempted, all_decode
