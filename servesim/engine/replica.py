"""One replica: a SimPy process that schedules, runs an iteration, applies its progress.

::

    loop:  arrivals up to now ──► policy.schedule(now) ──► Batch
             │                                            │
             │     pure decode & stable?  ── yes ──► fast path: k iterations at once
             │                             ── no  ──► one iteration
             ▼
           timeout(step time(s)) ──► apply progress (tokens, samples, finishes) ──► record

The fast path: between state changes only decode contexts grow, so ``k`` consecutive decode
iterations can be advanced together. ``k`` is the largest count such that no request finishes
before step ``k``, every step's KV blocks are available, no arrival (or the stop time, or the
policy's horizon) falls before the end of step ``k - 1``, and the KV manager's ``stable_steps``
(if it has one) allows it: a prefix cache ends the run before an eviction that changes what a
blocked waiting request would find. Step times come from one vectorized
model call, end times from a sequential cumulative sum (the same float additions the one-step path
does), and every per-request effect is applied in bulk. Single-stepping is the same code with
``k = 1``; a property test holds both equal.

Timestamps are the engine's own float clock, advanced exactly as described above; SimPy orders
this process against others (routers, KV tier links) but its ``now`` is not read back.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from servesim.engine.inbox import INF, Inbox
from servesim.engine.state import FINISHED, REJECTED, Reject, ReplicaState
from servesim.metrics.collect import Recorder
from servesim.perf.base import StepTimeModel
from servesim.sched.base import Batch, Policy
from servesim.sched.continuous import ones

MAX_RUN_STEPS = 1 << 14  # bound on one fast-path run (memory of its per-step arrays)

IterationHook = Callable[[float, float, np.ndarray, np.ndarray], None]


class Replica:
    name = "python"

    def __init__(self, env, state: ReplicaState, policy: Policy, model: StepTimeModel,
                 recorder: Recorder, inbox: Inbox, *, max_model_len: int, chunked_prefill: bool,
                 max_num_batched_tokens: int, stop_time: float = INF, fast_path: bool = True,
                 check_invariants: bool = False, on_iteration: IterationHook | None = None,
                 progress: Callable[[int], None] | None = None, warmup_requests: int = 0,
                 cpu_overhead_s: float = 0.0, cpu_overhead_per_seq_s: float = 0.0,
                 stop_when_drained: bool = True):
        self.env = env
        self.st = state
        self.req = state.req
        self.kv = state.kv
        self.policy = policy
        self.model = model
        self.rec = recorder
        self.inbox = inbox
        self.max_model_len = max_model_len
        self.chunked = chunked_prefill
        self.budget = max_num_batched_tokens
        self.stop_time = stop_time
        # the request limit was reached: once every request has ended, the run is over, even
        # if a stop time lies later (whichever limit comes first)
        self.stop_when_drained = stop_when_drained
        self.fast = fast_path
        self.check = check_invariants
        self.on_iteration = on_iteration
        self.progress = progress
        self._max_slots = self.kv.max_slots()
        self.cpu_c = cpu_overhead_s
        self.cpu_p = cpu_overhead_per_seq_s
        self.now = 0.0
        self.ended = 0  # finished + rejected
        self.warmup_id = warmup_requests if 0 < warmup_requests < self.req.n else -1
        if self.warmup_id >= 0 or 0 < self.req.n <= warmup_requests:
            recorder.itl_from = float("inf")  # from the first measured arrival (none: never)

    # ------------------------------------------------------------------------------ process
    def process(self):
        st, policy, inbox = self.st, self.policy, self.inbox
        segments = 0
        while True:
            self._pull_arrivals(self.now)
            st.advance_clocks(self.now)
            if self.now >= self.stop_time:
                break
            batch = policy.schedule(self.now)
            st.set_causes(batch.waiting_cause)
            if self.check:
                self._check(batch)
            if batch.empty:  # idle until an arrival, the stop time, or the policy's horizon (a fetch)
                t_wake = min(inbox.next_time(), batch.horizon_s)
                if (t_wake == INF and self.stop_when_drained
                        and not (policy.num_waiting() or len(st.running))):
                    break  # drained: nothing will ever arrive or run again
                t_next = min(t_wake, self.stop_time)
                if t_next == INF:
                    if policy.num_waiting() or len(st.running):
                        raise RuntimeError("scheduler returned an empty batch with work pending and "
                                           "nothing left to wait for (a policy bug)")
                    break
                yield self.env.timeout(max(0.0, t_next - self.env.now))
                self.now = t_next
                continue
            if batch.pure_decode:
                yield from self._decode_run(batch)
            else:
                yield from self._one_iteration(batch)
            segments += 1
            if self.progress is not None and segments % 4096 == 0:
                self.progress(self.ended)
        if self.progress is not None:
            self.progress(self.ended)

    # ---------------------------------------------------------------------------- arrivals
    def _pull_arrivals(self, t: float) -> None:
        if self.inbox.next_time() > t:
            return
        ids = self.inbox.pop_until(t)
        req = self.req
        if self.warmup_id >= 0 and ids[0] <= self.warmup_id and (ids == self.warmup_id).any():
            self.rec.itl_from = float(req.arrival[self.warmup_id])  # ITL counts from here on
        if len(ids) == 1:  # the common case, in scalars
            rid = int(ids[0])
            p, o = int(req.prompt[rid]), int(req.output[rid])
            if p + o - 1 <= self._max_slots and p + o <= self.max_model_len and (self.chunked or p <= self.budget):
                self.st.start_waiting(ids, req.arrival[ids])
                self.policy.enqueue(rid, t)
                return
        total = req.prompt[ids] + req.output[ids]
        reason = np.zeros(len(ids), dtype=np.int8)
        reason[total - 1 > self._max_slots] = Reject.KV_CAPACITY
        reason[total > self.max_model_len] = Reject.MAX_MODEL_LEN
        if not self.chunked:
            reason[(reason == 0) & (req.prompt[ids] > self.budget)] = Reject.TOKEN_BUDGET
        if reason.any():
            ok = reason == 0
            bad = ids[~ok]
            req.status[bad] = REJECTED
            req.reject_reason[bad] = reason[~ok]
            req.t_finish[bad] = req.arrival[bad]
            for _ in bad:
                self.ended += 1
                self.inbox.request_ended(t)
            ids = ids[ok]
        if len(ids):
            self.st.start_waiting(ids, req.arrival[ids])
            enqueue = self.policy.enqueue
            for rid in ids.tolist():
                enqueue(rid, t)

    # ------------------------------------------------------------------------- iterations
    def _decode_run(self, batch: Batch):
        req, ids = self.req, batch.ids
        t0 = self.now
        remaining = req.output[ids] - req.num_output[ids]
        rem_min = int(remaining.min())  # k never exceeds it: a request finishes at step rem_min
        n = len(ids)
        burst = batch.steps > 1  # multi-step: a fixed burst that arrivals cannot cut
        k_max = 1
        if burst:
            k_max = min(rem_min, batch.steps)
        elif self.fast and batch.stable and batch.extra_s == 0.0:
            k_max = min(rem_min, MAX_RUN_STEPS)
        k, used = self.kv.decode_run(ids, k_max)
        if k > 1 and not burst:  # a KV manager whose state can change a blocked decision (prefix cache)
            stable_steps = getattr(self.kv, "stable_steps", None)
            if stable_steps is not None:
                k = stable_steps(ids, k)
                used = used[:k]
        ends = np.empty(k + 1)
        ends[0] = t0
        ends[1:] = self.model.predict_decode_run(n, int(req.computed[ids].sum()), k)
        cpu = self.cpu_c + self.cpu_p * n
        if cpu:
            ends[1:] += cpu
            if burst:  # multi-step: the engine schedules and prepares inputs once per burst
                ends[2:] -= self.cpu_c
        if batch.extra_s:
            ends[1] += batch.extra_s
        ends = np.cumsum(ends, out=ends)[1:]
        if k > 1 and not burst:
            t_cut = min(self.inbox.next_time(), self.stop_time, batch.horizon_s)
            if ends[-1] >= t_cut:
                k = int(np.searchsorted(ends, t_cut, side="left")) + 1
                ends, used = ends[:k], used[:k]
        self.rec.cpu_s += cpu * k - (self.cpu_c * (k - 1) if burst else 0.0)
        self.rec.extra_s += batch.extra_s
        t_end = float(ends[-1])
        yield self.env.timeout(max(0.0, t_end - self.env.now))
        if self.on_iteration is not None:
            starts = np.concatenate(([t0], ends[:-1]))
            for j in range(k):
                self.on_iteration(float(starts[j]), float(ends[j]), ids, np.ones(len(ids), np.int64))
        frag = self._frag(self.kv.step_usage(ids, ones(n), k, used))
        # progress: every request computed k tokens and sampled k tokens
        req.computed[ids] += k
        req.num_output[ids] += k
        self.kv.commit_decodes(ids)
        last = req.t_last_token[ids]
        regular = last == t0
        n_regular = int(regular.sum())
        # tokens reach the client at each step's end, or all at the burst's end (multi-step)
        deliver = t_end if burst else float(ends[0])
        if n_regular != n:
            first = np.isnan(last)  # a chunked prefill whose last chunk was one token: first token
            if first.any():
                req.t_first_token[ids[first]] = deliver
            odd = ~regular & ~first
            if odd.any() and deliver >= self.rec.itl_from:
                self.rec.itl_values(deliver - last[odd])
        req.t_last_token[ids] = t_end
        if burst:
            self.rec.steps(t0, ends, used, len(self.st.running), self.policy.num_waiting(), n, 0, 0, frag)
            if t_end >= self.rec.itl_from:
                self.rec.itl_pairs(np.array([t_end - t0, 0.0]), np.array([n_regular, (k - 1) * n]))
        else:
            self.rec.steps(t0, ends, used, len(self.st.running), self.policy.num_waiting(), n, n_regular, n,
                           frag)
        self.now = t_end
        if k == rem_min:
            self._finish(ids[remaining == k])

    def _one_iteration(self, batch: Batch):
        req, ids, n = self.req, batch.ids, batch.num_new
        t0 = self.now
        cpu = self.cpu_c + self.cpu_p * len(ids)
        t1 = t0 + self.model.predict(n, req.computed[ids]) + cpu + batch.extra_s
        self.rec.cpu_s += cpu
        self.rec.extra_s += batch.extra_s
        yield self.env.timeout(max(0.0, t1 - self.env.now))
        if self.on_iteration is not None:
            self.on_iteration(t0, t1, ids, n)
        used = self.kv.used_blocks
        frag = self._frag(self.kv.step_usage(ids, n, 1))
        req.computed[ids] += n
        sampled = ids[req.computed[ids] == req.prompt[ids] + req.num_output[ids]]
        n_regular = 0
        if len(sampled):
            req.num_output[sampled] += 1
            last = req.t_last_token[sampled]
            first = np.isnan(last)
            req.t_first_token[sampled[first]] = t1
            regular = last == t0
            n_regular = int(regular.sum())
            odd = ~regular & ~first
            if odd.any() and t1 >= self.rec.itl_from:
                self.rec.itl_values(t1 - last[odd])
            req.t_last_token[sampled] = t1
        self.rec.steps(t0, np.array([t1]), used, len(self.st.running), self.policy.num_waiting(),
                       int(n.sum()), n_regular, 0, frag)
        self.now = t1
        if len(sampled):
            self._finish(sampled[req.num_output[sampled] >= req.output[sampled]])

    @staticmethod
    def _frag(u):
        """(internal, reserved, external) KV slots per step, from the manager's StepUsage."""
        return u.allocated - u.used - u.reserved_unused, u.reserved_unused, u.external

    def _finish(self, done: np.ndarray) -> None:
        if len(done) == 0:
            return
        req = self.req
        t = self.now
        req.t_finish[done] = t
        req.status[done] = FINISHED
        for rid in done.tolist():
            self.kv.free(rid)
            self.policy.on_finished(rid)
            self.inbox.request_ended(t)
        self.st.running.remove_finished(req.status)
        self.ended += len(done)

    # --------------------------------------------------------------------------- invariants
    def _check(self, batch: Batch) -> None:
        self.kv.check()
        if int(batch.num_new.sum()) > self.budget:
            raise AssertionError(f"token budget exceeded: {int(batch.num_new.sum())} > {self.budget}")
        if len(self.st.running) > self.st.max_num_seqs:
            raise AssertionError(f"max_num_seqs exceeded: {len(self.st.running)} > {self.st.max_num_seqs}")
        if len(batch.ids) and (batch.num_new < 1).any():
            raise AssertionError("a scheduled request computes no token")
