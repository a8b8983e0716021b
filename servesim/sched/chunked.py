"""Chunked prefill (the ``chunked`` policy: Sarathi-Serve, SGLang) and its ablations.

Prompts are split into chunks of at most ``chunked_prefill_size`` tokens (default: the token
budget ``max_num_batched_tokens``), so no iteration carries a whole long prompt. How chunks and
decodes share iterations is ``engine.options.mix``:

``stall_free`` (default; Sarathi-Serve's stall-free batching, SGLang ``--enable-mixed-chunk``)
    Every iteration: all decodes first, then prefill chunks fill what is left of a token budget
    of ``chunked_prefill_size`` tokens *including the decodes* (SGLang subtracts the decode tokens
    from the chunk size when it mixes; Sarathi's token budget counts them): partially prefilled
    requests first, then new requests FCFS. Decodes never stall; each iteration stays short.
``prefill_first`` (SGLang's default, no mixed chunks)
    An iteration is either prefill chunks (up to ``chunked_prefill_size`` tokens, running partial
    prefills then new requests) or decodes; prefill runs first whenever it can, so decodes stall
    for as many chunk iterations as there are prompts to prefill.
``hybrid_only`` (Sarathi-Serve ablation "hybrid batching only"; Orca/vLLM-style)
    Decodes first, then *whole* prompts while they fit in ``max_num_batched_tokens``: the lowest
    TTFT, the worst decode stalls (a prompt longer than the whole budget is still split at it).
``chunk_only`` (Sarathi-Serve ablation "chunked prefills only")
    Chunks of ``chunked_prefill_size`` run in iterations of their own, never with decodes;
    prefill and decode iterations alternate while both have work, so a decode waits at most one
    chunk iteration but a prompt gets only every other iteration.

::

    stall_free, chunk 256, r0 decoding, r1 a 1000-token prompt:
      |r0 + r1[0:255]|r0 + r1[255:510]|r0 + r1[510:765]|r0 + r1[765:1000]|r0 r1|r0 r1| ...
    chunk_only:
      |r1[0:256]|r0|r1[256:512]|r0|r1[512:768]|r0|r1[768:1000]|r0 r1| ...
    hybrid_only:
      |r0 + r1[0:1000]|r0 r1|r0 r1| ...            (one long iteration: r0's token waits)

Admission needs KV for the whole prompt, not just its first chunk (vLLM v0's block manager, which
Sarathi-Serve builds on, allocates a prompt's blocks when it is admitted; SGLang admits a request
only if its prompt fits the free tokens): a prompt that could never finish prefilling is not
started. A running request whose remaining prompt is a single token counts as a decode (it costs one
token like one). ``max_running_requests`` (SGLang) caps the running set, within ``max_num_seqs``.
When running requests run out of KV, the victim is the newest running request (Sarathi-Serve
inherits vLLM's rule), or with ``engine.options.retract: sglang`` SGLang's retraction choice: the
decoding request with the fewest output tokens, ties to the longest prompt, then the newest;
recompute or swap as ``engine.preemption`` says. Not modeled: SGLang's conservative admission
(it reserves ``new_token_ratio`` of every running request's remaining output before admitting), so
with a small KV pool this policy admits more eagerly and retracts more often than SGLang does. ``num_scheduler_steps`` bursts all-decode iterations (SGLang's
``--num-continuous-decode-steps``).
"""

from __future__ import annotations

import numpy as np

from servesim.engine.state import RUNNING, ReplicaState
from servesim.scenario import EngineConfig
from servesim.sched.base import Batch, Cause
from servesim.sched.continuous import ASIDE, NO_ROOM, BatchBuilder, ContinuousBatching, ones

MODES = ("stall_free", "prefill_first", "hybrid_only", "chunk_only")


class ChunkedPrefill(ContinuousBatching):
    name = "chunked"
    always_chunks_prefill = True  # prompts longer than the token budget are split, whatever the flag
    OPTIONS = {
        **ContinuousBatching.OPTIONS,
        "mix": ("stall_free", lambda x: x in MODES, f"allowed: {', '.join(MODES)}"),
        "retract": ("newest", lambda x: x in ("newest", "sglang"), "allowed: newest, sglang"),
    }

    def __init__(self, cfg: EngineConfig, state: ReplicaState):
        super().__init__(cfg, state)
        self.max_seqs = min(cfg.max_running_requests or cfg.max_num_seqs, cfg.max_num_seqs)
        self.chunk = min(cfg.chunked_prefill_size or self.budget, self.budget)
        self.mode: str = self.opts["mix"]
        self._last_prefill = False  # chunk_only: the previous iteration was a prefill iteration
        if self.opts["retract"] == "sglang":
            self._victim = self._victim_sglang  # type: ignore[method-assign]

    def schedule(self, now: float) -> Batch:
        b = self._begin(now)
        if self.mode in ("stall_free", "hybrid_only"):
            self._decodes(now, b)
            decoded = len(b.ids)  # parts so far: the prefill pass only adds parts
            used = self.budget - self._budget
            cap = (self.chunk if self.mode == "stall_free" else self.budget) - used
            cause, _ = self._prefill(now, b, cap)
            only_decodes = len(b.ids) == decoded and not self._preempted
            return self._finish(b, self._causes[cause], only_decodes, now)
        # prefill_first / chunk_only: prefill and decode iterations never mix
        if self.mode == "chunk_only" and self._last_prefill and self._has_decodes():
            self._decodes(now, b)
            if b.ids:  # (unless every decode was preempted: then a prefill iteration after all)
                self._last_prefill = False
                cause = Cause.TOKEN_BUDGET if self.num_waiting() or self._has_prefills() else Cause.ITERATION
                batch = self._finish(b, self._causes[cause], not self._preempted, now)
                batch.stable = False  # the next iteration is a prefill turn
                return batch
        cause, _ = self._prefill(now, b, self.chunk)
        if b.ids:
            self._last_prefill = True
            return self._finish(b, self._causes[cause], False, now)
        self._last_prefill = False
        self._decodes(now, b)
        return self._finish(b, self._causes[cause], not self._preempted, now)

    # -- decodes -----------------------------------------------------------------------------
    def _need(self, run: np.ndarray) -> np.ndarray:
        req = self.req
        return req.prompt[run] + req.num_output[run] - req.computed[run]

    def _has_decodes(self) -> bool:
        run = self.st.running.ids
        return bool(len(run)) and bool((self._need(run) == 1).any())

    def _has_prefills(self) -> bool:
        run = self.st.running.ids
        return bool(len(run)) and bool((self._need(run) > 1).any())

    def _decodes(self, now: float, b: BatchBuilder) -> None:
        """Every running request that needs one token gets it (oldest first, within the budget);
        one vectorized allocation unless the pool is short."""
        run = self.st.running.ids
        if not len(run):
            return
        dec = run[self._need(run) == 1]
        if len(dec) > self._budget:
            dec = dec[: self._budget]
        if not len(dec):
            return
        if self.kv.allocate_decodes(dec):
            b.add_array(dec, ones(len(dec)))
            self._budget -= len(dec)
            return
        status = self.req.status
        for rid in dec.tolist():
            if status[rid] != RUNNING:
                continue
            if self._allocate_or_preempt(rid, 1, now, b):
                b.add(rid, 1)
                self._budget -= 1

    def _victim_sglang(self, rid: int) -> int:
        """SGLang's retraction order: fewest output tokens, then longest prompt, then newest;
        among decoding requests when there are any."""
        run = self.st.running.ids
        req = self.req
        out = req.num_output[run]
        cand = np.flatnonzero(out > 0)
        if not len(cand):
            cand = np.arange(len(run))
        order = np.lexsort((-cand, -req.prompt[run[cand]], out[cand]))
        return int(run[cand[order[0]]])

    # -- prefill chunks ----------------------------------------------------------------------
    def _prefill(self, now: float, b: BatchBuilder, cap: int) -> tuple[Cause, bool]:
        """Prefill tokens, at most ``cap`` (and the budget): partial prefills of running requests
        first, then new requests FCFS. Returns why the waiting head stopped, and if any joined."""
        cap = min(cap, self._budget)
        run = self.st.running.ids
        if len(run) and cap > 0:
            need = self._need(run)
            pre = need > 1
            if pre.any():
                status = self.req.status
                for rid, nd in zip(run[pre].tolist(), need[pre].tolist()):
                    if cap <= 0:
                        break
                    if status[rid] != RUNNING:
                        continue
                    n = min(nd, cap)
                    if self._allocate_or_preempt(rid, n, now, b):
                        b.add(rid, n)
                        self._budget -= n
                        cap -= n
        if self._preempted and (b.ids or len(self.st.running)):  # no admissions after a preemption
            return (Cause.KV_BLOCKS if self.num_waiting() else Cause.ITERATION), False
        st, req, kv = self.st, self.req, self.kv
        waiting = self.waiting
        admitted = False
        while waiting:
            if len(st.running) >= self.max_seqs:
                return Cause.BATCH_SLOTS, admitted
            if cap <= 0:
                return Cause.TOKEN_BUDGET, admitted
            rid = waiting[0]
            ready = self._ready(rid, now)
            if ready == ASIDE:
                waiting.popleft()
                continue
            if ready == NO_ROOM:
                return Cause.KV_BLOCKS, admitted
            whole = int(req.prompt[rid] + req.num_output[rid] - req.computed[rid])
            n = whole
            if n > cap:
                if self.mode == "hybrid_only" and n <= self.budget:
                    return Cause.TOKEN_BUDGET, admitted  # whole prompts only
                n = cap
            if not kv.allocate(rid, whole):  # room for the whole prompt, not just this chunk
                if self._release_idle_holders(rid, b):
                    continue  # retry the head with the released blocks
                return Cause.KV_BLOCKS, admitted
            waiting.popleft()
            self._admit_one(rid, n, now, b)
            cap -= n
            admitted = True
        return Cause.ITERATION, admitted
