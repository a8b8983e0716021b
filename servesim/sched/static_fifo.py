"""Request-level static batching, FIFO (the ``static-fifo`` policy; Spark's scheduler).

The engine takes a batch of at most ``max_batch_size`` requests from the head of a FIFO queue
when it is idle, prefills them, and decodes them together until *every* member has finished.
Nobody joins mid-batch: a member that finishes leaves an empty slot, and the queue waits for the
longest member (cause ``static_batch``). This is the head-of-line blocking of pre-Orca engines
(FasterTransformer, HF ``generate``): one long request holds a whole batch of short ones back.

::

    batch 1 = {r0 (long), r1, r2}                     batch 2 = {r3, r4}
    |prefill r0 r1 r2|dec|dec|dec ... r1,r2 done ...|dec r0|prefill r3 r4|dec|...
                          r3, r4 arrive ─► wait "static batch in progress" ─┘

KV: static engines reserve each member's final size up front, so a running batch never runs out
of KV mid-way and never preempts. We reserve ``prompt + output - 1`` slots per member (a real
engine reserves ``max_tokens``, which the simulator knows as the output length); a batch stops
growing at the first FIFO request whose reservation does not fit. With the paged allocator,
blocks are still allocated as the sequences grow, so KV usage metrics show what is written, not
what is reserved. Other KV managers may reserve more than that estimate (``kv_allocator: static``
reserves ``max_model_len``): a member whose prefill allocation fails ends the batch there, the
rest return to the queue in order; one that grows in steps of its own (``elastic``) can run a
decode short, and then the newest member is preempted (recompute) and re-prefilled in the batch.

Prefill: the batch's prompts are prefilled before any member decodes. With
``engine.options.micro_batch_size: m`` they are prefilled ``m`` requests at a time (micro-batches
that bound the prefill's activation memory and iteration time); every prefill iteration also
respects ``max_num_batched_tokens`` (a prompt longer than what is left of it is split only with
``enable_chunked_prefill``). A member is admitted (``first_scheduled``) at its first prefill
iteration, so waiting for its micro-batch counts as queueing, charged to ``static_batch``.

The decode phase is an all-decode batch that stays the same until a member finishes: it is
``stable`` and the engine fast-forwards it.
"""

from __future__ import annotations

from collections import deque

from servesim.engine.state import RUNNING, ReplicaState
from servesim.scenario import EngineConfig
from servesim.sched.base import Batch, Cause, uniform_causes
from servesim.sched.continuous import ASIDE, NO_ROOM, BatchBuilder, ContinuousBatching, ones, positive_int


class StaticFIFO(ContinuousBatching):
    name = "static-fifo"
    OPTIONS = {
        "micro_batch_size": (None, positive_int,
                             "requests prefilled per iteration: an integer >= 1 (default: the whole batch)"),
    }

    def __init__(self, cfg: EngineConfig, state: ReplicaState):
        super().__init__(cfg, state)
        self.cap = min(cfg.max_batch_size, cfg.max_num_seqs)
        self.micro = self.opts["micro_batch_size"] or self.cap
        self.members: deque[int] = deque()  # formed into the batch, not yet prefilling
        self._static = uniform_causes(Cause.STATIC_BATCH)
        self._idle = uniform_causes(Cause.ITERATION)

    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.members) + len(self.fetching)

    def schedule(self, now: float) -> Batch:
        b = self._begin(now)
        if not len(self.st.running) and not self.members and not self.fetching:
            self._form()
        run = self.st.running.ids
        req = self.req
        need = req.prompt[run] + req.num_output[run] - req.computed[run]
        prefilled = len(run) > 0 and int(need.max()) == 1
        if self.members or (len(run) and not prefilled):
            self._prefill(now, b)
        if not b.ids and prefilled:
            # decode phase: every member has its first token (or the rest fetch their KV from a
            # lower tier meanwhile); all decode together
            if self.kv.allocate_decodes(run):
                b.add_array(run, ones(len(run)))
                return self._finish(b, self._static, True, now)
            # an allocator that grows in steps of its own ran short: preempt the newest member
            self._running_one_by_one(run.tolist(), [1] * len(run), now, b)
            return self._finish(b, self._static, False, now)
        busy = bool(b.ids) or bool(self.fetching)
        return self._finish(b, self._static if busy else self._idle, False, now)

    def _form(self) -> None:
        """The engine is idle: take up to ``cap`` FIFO requests whose reservations fit the pool.
        (Prefix reuse is looked up when a member's prefill starts, so it cannot go stale.)"""
        req = self.req
        free = self.kv.free_blocks
        reserved = 0
        waiting = self.waiting
        while waiting and len(self.members) < self.cap:
            rid = waiting[0]
            blocks = -(-int(req.prompt[rid] + req.output[rid] - 1) // self.bs)
            if reserved + blocks > free:
                break
            self.members.append(waiting.popleft())
            reserved += blocks

    def _requeue(self, rid: int) -> None:
        """A member whose KV came from a lower tier, or that was preempted, goes back to the
        front of the batch (it prefills again before the batch decodes on)."""
        self.members.appendleft(rid)

    def _prefill(self, now: float, b: BatchBuilder) -> None:
        """One prefill iteration: unfinished prompts of running members first (chunked prefill),
        then new members, at most ``micro`` requests and ``max_num_batched_tokens`` tokens."""
        req = self.req
        count = 0
        for rid in self.st.running.ids.tolist():
            need = int(req.prompt[rid] + req.num_output[rid] - req.computed[rid])
            if need <= 1 or count >= self.micro or self._budget <= 0 or req.status[rid] != RUNNING:
                continue
            n = min(need, self._budget)
            if self._allocate_or_preempt(rid, n, now, b):
                b.add(rid, n)
                self._budget -= n
                count += 1
        members = self.members
        while members and count < self.micro and self._budget > 0:
            rid = members[0]
            ready = self._ready(rid, now)
            if ready == ASIDE:  # its KV is on the way from a lower tier
                members.popleft()
                continue
            if ready == NO_ROOM:
                break
            n = int(req.prompt[rid] + req.num_output[rid] - req.computed[rid])
            if n > self._budget:
                if not self.chunked:
                    break
                n = self._budget
            if not self.kv.allocate(rid, n) and not (self._release_idle_holders(rid, b) and self.kv.allocate(rid, n)):
                # the allocator reserves more than our estimate (e.g. static max_model_len
                # extents): the batch ends here, the rest go back to the queue, in order
                while members:
                    self.waiting.appendleft(members.pop())
                break
            members.popleft()
            self._admit_one(rid, n, now, b)
            count += 1
