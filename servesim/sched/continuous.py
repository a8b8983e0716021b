"""vLLM-style continuous batching (the ``vllm`` policy), and the pieces the other policies share.

Every iteration, in vLLM's order:

1. **Running requests first**, oldest first: each gets the tokens it still needs (1 for a decode;
   the rest of its prompt, capped by the remaining budget, when chunked prefill is on). If the KV
   manager cannot give it slots, the *newest* running request is preempted until the allocation
   succeeds or the request itself was the one preempted. Preemption is by **recompute** (its blocks
   are freed, it prefills everything it knows again) or by **swap** (``engine.preemption: swap``:
   its KV goes to host memory over PCIe, it keeps its computed tokens and is swapped back in when
   readmitted; both transfers stall the iteration they happen in, as vLLM v0's synchronous swap
   does). vLLM's CPU swap space is finite (``--swap-space``, 4 GiB per GPU by default): a victim
   that does not fit in what is left of it is recomputed instead (vLLM v0 aborts the request there
   with "Aborted due to the lack of CPU swap space"; we keep it, so runs stay comparable).
2. **Then waiting requests**, FCFS, unless something was preempted this iteration: admitted while
   ``max_num_seqs`` leaves a slot, the token budget ``max_num_batched_tokens`` covers the prompt
   (the whole prompt without chunked prefill; a chunk of it with), and the KV manager allocates.
   The first request that does not fit stops admission; everyone behind it waits for the same
   reason (strict FCFS, head-of-line blocking included). Preempted requests wait at the front.

Multi-step scheduling (``num_scheduler_steps: N``): an all-decode batch is run for up to N
iterations before the scheduler runs again (``Batch.steps``); arrivals join at those boundaries
and the burst's tokens reach clients together. Iterations with prefill work are single steps.

::

    t ──►  |prefill r2 + decode r0 r1|  decode r0 r1 r2  |  decode r0 r1 r2  | ...
               ▲ r2 admitted FCFS         ▲ r3 arrives: waits "iteration" until the next boundary

Shared with the other policies: :class:`BatchBuilder` (one iteration's parts, with removal of a
preempted member), :func:`read_options` (validated ``engine.options``), and the preemption,
swap-in and KV-tier helpers of :class:`ContinuousBatching`.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

import numpy as np

from servesim.engine.state import RUNNING, ReplicaState
from servesim.fields import MAX_GIB, MAX_SECONDS, finite_number
from servesim.scenario import EngineConfig
from servesim.sched.base import Batch, Cause, uniform_causes

GIB = 1 << 30
READY, ASIDE, NO_ROOM = 1, 0, -1  # what _ready found
_ONES_CACHE: dict[int, np.ndarray] = {}
_EMPTY = np.empty(0, dtype=np.int64)
_EMPTY.flags.writeable = False


def ones(n: int) -> np.ndarray:
    a = _ONES_CACHE.get(n)
    if a is None:
        a = np.ones(n, dtype=np.int64)
        a.flags.writeable = False
        _ONES_CACHE[n] = a
    return a


def read_options(cfg: EngineConfig, policy: str, known: dict[str, tuple[Any, Callable[[Any], bool], str]]) -> dict:
    """``engine.options`` for ``policy``: ``known`` maps a name to (default, check, allowed text).
    Unknown names and bad values raise ValueError naming the field, the value and what is allowed."""
    out = {}
    for key in cfg.options:
        if key not in known:
            raise ValueError(f"engine.options.{key}: unknown option for scheduler {policy!r} "
                             f"(known: {', '.join(sorted(known)) or 'none'})")
    for key, (default, check, allowed) in known.items():
        value = cfg.options.get(key, default)
        if key in cfg.options and not check(value):
            raise ValueError(f"engine.options.{key} = {value!r}: {allowed}")
        out[key] = value
    return out


def positive_number(x: Any) -> bool:
    """A finite number of seconds > 0 (at most servesim.fields.MAX_SECONDS)."""
    return finite_number(x, 0.0, MAX_SECONDS, lo_open=True)


def positive_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 1 << 20


class BatchBuilder:
    """The parts of one iteration's batch, in the order the policy adds them."""

    __slots__ = ("ids", "new")

    def __init__(self) -> None:
        self.ids: list[np.ndarray] = []
        self.new: list[np.ndarray] = []

    def add_array(self, ids: np.ndarray, new: np.ndarray) -> None:
        if len(ids):
            self.ids.append(ids)
            self.new.append(new)

    def add(self, rid: int, n: int) -> None:
        self.ids.append(np.array([rid], dtype=np.int64))
        self.new.append(np.array([n], dtype=np.int64))

    def remove(self, rid: int) -> int:
        """Take ``rid`` out (it was preempted after being scheduled); return its tokens."""
        for i, part in enumerate(self.ids):
            hit = part == rid
            if hit.any():
                tokens = int(self.new[i][hit].sum())
                self.ids[i], self.new[i] = part[~hit], self.new[i][~hit]
                return tokens
        return 0

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if len(self.ids) == 1:
            return self.ids[0], self.new[0]
        if self.ids:
            return np.concatenate(self.ids), np.concatenate(self.new)
        return _EMPTY, _EMPTY


class ContinuousBatching:
    """The ``vllm`` policy; also the base of ``chunked`` and ``priority``.

    Subclasses change the waiting structure (:meth:`enqueue`, :meth:`_requeue`,
    :meth:`num_waiting`, :meth:`_admit`) and the preemption victim (:meth:`_victim`). Per-call
    state lives in ``_budget`` (tokens left), ``_extra`` (swap seconds) and ``_preempted``.
    """

    name = "vllm"
    always_chunks_prefill = False  # chunked only with engine.enable_chunked_prefill
    OPTIONS: dict[str, tuple[Any, Callable[[Any], bool], str]] = {
        "swap_space_gib": (4.0, lambda x: finite_number(x, 0.0, MAX_GIB),
                           f"CPU swap space in GiB per GPU, a number in [0, {MAX_GIB:.0f}] "
                           f"(vLLM --swap-space, default 4)"),
    }

    def __init__(self, cfg: EngineConfig, state: ReplicaState):
        self.st = state
        self.req = state.req
        self.kv = state.kv
        self.bs = state.kv.block_size
        self.budget = cfg.max_num_batched_tokens
        self.max_seqs = cfg.max_num_seqs
        self.chunked = cfg.enable_chunked_prefill
        self.steps = cfg.num_scheduler_steps
        self.opts = read_options(cfg, self.name, self.OPTIONS)
        self.swap = cfg.preemption == "swap"
        space = float(self.opts.get("swap_space_gib", 0.0)) * GIB
        per_token = state.kv_bytes_per_token
        self.swap_capacity = int(space // per_token) if per_token > 0 else (1 << 62)
        self.swap_used = 0  # token slots (whole blocks) parked in host memory
        self.waiting: deque[int] = deque()
        self.fetching: dict[int, float] = {}  # rid -> when its KV reaches the GPU (tier transfer)
        self.fetch_need: dict[int, int] = {}  # rid -> blocks it will still need once fetched
        self._causes = {c: uniform_causes(c) for c in Cause}
        self._budget = 0
        self._extra = 0.0
        self._preempted = False

    # -- protocol ----------------------------------------------------------------------------
    def enqueue(self, rid: int, now: float) -> None:
        self.waiting.append(rid)

    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.fetching)

    def on_finished(self, rid: int) -> None:
        pass

    def schedule(self, now: float) -> Batch:
        b = self._begin(now)
        all_decode = self._schedule_running(now, b)
        # vLLM admits nobody in an iteration that preempted; but when the preemption emptied the
        # batch and the running set, vLLM's next (empty, instantaneous) step would admit: do it now
        if self._preempted and (b.ids or len(self.st.running)):
            causes, admitted = self._causes[Cause.KV_BLOCKS if self.num_waiting() else Cause.ITERATION], False
        else:
            causes, admitted = self._admit(now, b)
        return self._finish(b, causes, all_decode and not admitted and not self._preempted, now)

    # -- the running pass --------------------------------------------------------------------
    def _schedule_running(self, now: float, b: BatchBuilder) -> bool:
        """Give every running request the tokens it needs, oldest first; True if all are decodes.
        The common case, every running request decoding and the pool able to grow them all, is
        one vectorized allocation."""
        run = self.st.running.ids
        if not len(run):
            return True
        req = self.req
        need = req.prompt[run] + req.num_output[run] - req.computed[run]
        if len(run) <= self._budget and int(need.max()) == 1 and self.kv.allocate_decodes(run):
            b.add_array(run, ones(len(run)))
            self._budget -= len(run)
            return True
        return self._running_one_by_one(run.tolist(), need.tolist(), now, b)

    def _running_one_by_one(self, order: list[int], needs: list[int], now: float, b: BatchBuilder) -> bool:
        status = self.req.status
        all_decode = True
        for rid, nd in zip(order, needs):
            if status[rid] != RUNNING:  # preempted earlier in this pass
                continue
            n = min(nd, self._budget)
            if n <= 0:
                continue
            if not self._allocate_or_preempt(rid, n, now, b):
                continue
            b.add(rid, n)
            self._budget -= n
            if n != 1 or nd != 1:
                all_decode = False
        return all_decode

    def _allocate_or_preempt(self, rid: int, n: int, now: float, b: BatchBuilder) -> bool:
        """Allocate ``n`` tokens for running ``rid``, preempting victims while the pool is short.
        False if ``rid`` itself became the victim."""
        while not self.kv.allocate(rid, n):
            victim = self._victim(rid)
            self._preempt(victim, now, b)
            if victim == rid:
                return False
        return True

    def _victim(self, rid: int) -> int:
        """vLLM: the newest running request (the requester itself if it is the newest)."""
        return int(self.st.running.ids[-1])

    # -- the waiting pass --------------------------------------------------------------------
    def _admit(self, now: float, b: BatchBuilder) -> tuple[np.ndarray, bool]:
        st, req, kv = self.st, self.req, self.kv
        waiting = self.waiting
        cause = Cause.ITERATION
        admitted = False
        while waiting:
            if len(st.running) >= self.max_seqs:
                cause = Cause.BATCH_SLOTS
                break
            if self._budget <= 0:
                cause = Cause.TOKEN_BUDGET
                break
            rid = waiting[0]
            ready = self._ready(rid, now)
            if ready == ASIDE:
                waiting.popleft()
                continue
            if ready == NO_ROOM:
                cause = Cause.KV_BLOCKS
                break
            n = int(req.prompt[rid] + req.num_output[rid] - req.computed[rid])
            if n > self._budget:
                if not self.chunked:
                    cause = Cause.TOKEN_BUDGET
                    break
                n = self._budget
            if not kv.allocate(rid, n):
                if self._release_idle_holders(rid, b):
                    continue  # retry the head with the released blocks
                cause = Cause.KV_BLOCKS
                break
            waiting.popleft()
            self._admit_one(rid, n, now, b)
            admitted = True
        return self._causes[cause], admitted

    # -- deadlock breaker ---------------------------------------------------------------------
    def _waiting_ids(self) -> list[int]:
        """Every waiting request, in the policy's order (policies with other queues override)."""
        return list(self.waiting)

    def _release_idle_holders(self, head: int, b: BatchBuilder) -> bool:
        """Requests can wait with KV blocks in hand (a lower-tier fetch that landed, then a
        preemption pushed an older request ahead of them). If the head of the queue cannot fit
        while nothing runs and nothing is scheduled, no block would ever be freed: release the
        blocks of the other waiting holders. Their KV stays in the prefix cache (cached blocks
        are evictable, and hit again when their turn comes); they look their prefix up again then.
        Returns whether anything was released (the caller retries the head)."""
        held = getattr(self.kv, "held", None)
        if held is None or len(self.st.running) or b.ids:
            return False  # running requests will free blocks
        released = False
        for rid in reversed(self._waiting_ids()):  # newest first
            if rid != head and held[rid] > 0 and rid not in self.fetching and not self.st.swapped[rid]:
                self.kv.free(rid)
                self.req.computed[rid] = 0
                released = True
        return released

    # -- shared helpers ----------------------------------------------------------------------
    def _begin(self, now: float) -> BatchBuilder:
        self._budget = self.budget
        self._extra = 0.0
        self._preempted = False
        if self.fetching:
            self._land_fetches(now)
        return BatchBuilder()

    def _finish(self, b: BatchBuilder, causes: np.ndarray, decode_only: bool, now: float,
                horizon: float = float("inf")) -> Batch:
        ids, num_new = b.arrays()
        pure = decode_only and len(ids) > 0
        if self.fetching:
            horizon = min(horizon, min(self.fetching.values()))
        return Batch(ids=ids, num_new=num_new, waiting_cause=causes, pure_decode=pure, stable=pure,
                     horizon_s=horizon, steps=self.steps if pure else 1, extra_s=self._extra)

    def _requeue(self, rid: int) -> None:
        """A preempted request waits at the front (it is older than everyone waiting)."""
        self.waiting.appendleft(rid)

    def _preempt(self, victim: int, now: float, b: BatchBuilder) -> None:
        """Evict ``victim`` (by swap when configured and host space is left, else recompute); if it
        was already scheduled this iteration, take it out of the batch and refund its tokens."""
        self._budget += b.remove(victim)
        swap = False
        if self.swap:
            slots = self._block_slots(int(self.req.computed[victim]))
            if self.swap_used + slots <= self.swap_capacity:
                swap = True
                self.swap_used += slots
                self._extra += self.st.swap_seconds(slots)
        self.st.preempt(victim, now, swap=swap)
        self._requeue(victim)
        self._preempted = True

    def _block_slots(self, tokens: int) -> int:
        """Token slots in the whole blocks that hold ``tokens`` tokens (swaps move whole blocks)."""
        return -(-tokens // self.bs) * self.bs

    def _admit_one(self, rid: int, n: int, now: float, b: BatchBuilder) -> None:
        """Waiting -> running with ``n`` tokens this iteration; a swapped request is swapped in
        first (its transfer stalls this iteration)."""
        if self.st.swapped[rid]:
            slots = self._block_slots(int(self.req.computed[rid]))
            self._extra += self.st.swap_seconds(slots)
            self.swap_used -= slots
            self.st.swapped[rid] = False
        self.st.admit(rid, now)
        b.add(rid, n)
        self._budget -= n

    def _ready(self, rid: int, now: float) -> int:
        """Ask the KV manager what of ``rid``'s KV is reusable (prefix cache, lower tiers).
        Returns READY; or ASIDE when its KV is still on the way from a lower tier: it is set aside
        until then (its wait charged to the transfer) and the caller drops it from the waiting
        order; or NO_ROOM when transfers already under way have claimed the room it would need.

        A fetch holds blocks while the request waits, so a fetch is started only while the pool
        can still hold this request whole *and* the rest of every request already fetching (else,
        with nothing running, fetched requests could hold the pool and none of them fit)."""
        if self.st.swapped[rid]:
            return READY  # its own KV comes back by swap-in, which the policy charges
        req = self.req
        known = int(req.prompt[rid] + req.num_output[rid])
        if self.fetching and self._blocks(known) + sum(self.fetch_need.values()) > self.kv.free_blocks:
            return NO_ROOM
        hit = self.kv.reuse_prefix(rid, now)
        if hit.ready_at <= now:
            return READY
        self.fetching[rid] = hit.ready_at
        self.fetch_need[rid] = max(0, self._blocks(known) - self._blocks(hit.tokens))
        if req.preemptions[rid] == 0:  # a resumed request's wait is charged to its preemption
            self.st.suspend_wait(rid, now, int(Cause.TIER_TRANSFER))
        return ASIDE

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.bs)

    def _land_fetches(self, now: float) -> None:
        landed = sorted((r for r, t in self.fetching.items() if t <= now),
                        key=lambda r: (self.req.arrival[r], r), reverse=True)
        for rid in landed:
            del self.fetching[rid]
            del self.fetch_need[rid]
            if self.req.preemptions[rid] == 0:
                self.st.resume_wait(rid, now, int(Cause.TIER_TRANSFER))
            self._requeue(rid)
