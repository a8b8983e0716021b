"""Multi-level priority scheduling over SLA classes P0..P4 (the ``priority`` policy; Halo's).

Continuous batching (the ``vllm`` policy's running pass, chunked prefill when enabled), with the
waiting queue ordered by **(class, arrival)**: one FIFO per class, P0 first. Admission walks that
order and stops at the first request that does not fit, so no lower-class request is admitted
while a higher-class one waits (strict priority, like vLLM's ``--scheduling-policy priority``).

Preemption of lower classes: when the head request of class ``g`` is blocked because the batch
slots are full or the KV pool is short, running requests of classes *below* ``g`` are preempted
(lowest class first, newest first; recompute or swap per ``engine.preemption``) -- but only as
many as needed, and only if that makes the head fit. When running requests themselves run out of
KV, the victim is also the lowest-class, newest one (the requester itself if it is that one).

::

    slots full with {P0 a, P3 b, P3 c}; P0 d arrives
    |a b c| ─► d blocked on slots: preempt c (P3, newest) ─► |a b d(prefill)| ... c waits "preempted"

Aging (``engine.options.aging_s: T``): a waiting request moves up one class for every ``T``
seconds since its arrival (P4 reaches P0 after ``4 T``), so no class starves forever: once at
P0 it is served FCFS with the others there. A request keeps the rank it was admitted with while
it runs (an aged P4 admitted as P0 is not evicted for a P1), but the right to preempt stays with a
request's own class (an aged P4 never evicts anyone above P4).

Dynamic batch size per class (``engine.options.class_max_seqs: [n0, .., n4]``): a request of
class ``g`` is admitted only while fewer than ``n_g`` requests run, so the batch grows to what the
most urgent waiting class allows: lower classes get a smaller batch (shorter iterations, headroom
for urgent arrivals), higher classes may fill it up to ``max_num_seqs``. A class budget is never a
reason to evict: only a class whose budget is ``max_num_seqs`` preempts lower classes for a slot.
Default: ``max_num_seqs`` for all.

Waiting causes per class: the blocked head's class gets the head's cause; every other class with
waiting requests is behind it (``higher_class``); a class with nobody waiting would be considered
before the head if it ranks higher (``iteration``), else behind it (``higher_class``).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from servesim.engine.state import ReplicaState
from servesim.request import NUM_CLASSES
from servesim.scenario import EngineConfig
from servesim.sched.base import Batch, Cause
from servesim.sched.continuous import ASIDE, NO_ROOM, BatchBuilder, ContinuousBatching, positive_number

INF = float("inf")


def _class_list(x) -> bool:
    return (isinstance(x, list) and 1 <= len(x) <= NUM_CLASSES
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in x))


class PriorityScheduling(ContinuousBatching):
    name = "priority"
    OPTIONS = {
        **ContinuousBatching.OPTIONS,
        "aging_s": (None, positive_number, "seconds of waiting per class of promotion: a finite number > 0"),
        "class_max_seqs": (None, _class_list,
                           f"a list of 1..{NUM_CLASSES} integers >= 1: the largest running batch a request "
                           f"of class P0, P1, .. may join (missing classes repeat the last value)"),
        "preempt_lower": (True, lambda x: isinstance(x, bool), "true or false"),
    }

    def __init__(self, cfg: EngineConfig, state: ReplicaState):
        super().__init__(cfg, state)
        self.queues: list[deque[int]] = [deque() for _ in range(NUM_CLASSES)]
        self.n_queued = 0
        self.aging = self.opts["aging_s"]
        slots = self.opts["class_max_seqs"] or [self.max_seqs]
        slots = slots + [slots[-1]] * (NUM_CLASSES - len(slots))
        self.class_slots = [min(s, self.max_seqs) for s in slots]
        self.preempt_lower = self.opts["preempt_lower"]
        self._class_causes: dict[tuple, np.ndarray] = {}
        self.rank = self.req.klass.astype(np.int64)  # a running request's class as admitted (aging)

    # -- waiting structure ---------------------------------------------------------------------
    def enqueue(self, rid: int, now: float) -> None:
        self.queues[self.req.klass[rid]].append(rid)
        self.n_queued += 1

    def _requeue(self, rid: int) -> None:
        self.queues[self.req.klass[rid]].appendleft(rid)
        self.n_queued += 1

    def num_waiting(self) -> int:
        return self.n_queued + len(self.fetching)

    def _eff(self, rid: int, now: float) -> int:
        """The class a waiting request ranks as: its own, minus one per ``aging_s`` waited."""
        g = int(self.req.klass[rid])
        if self.aging is None or g == 0:
            return g
        return max(0, g - int((now - self.req.arrival[rid]) // self.aging))

    def _head(self, now: float) -> tuple[int, int]:
        """The next request in (effective class, arrival) order, and its effective class."""
        best, best_key = -1, None
        for q in self.queues:
            if q:
                rid = q[0]
                e = self._eff(rid, now)
                if self.aging is None:
                    return e, e
                key = (e, self.req.arrival[rid], rid)
                if best_key is None or key < best_key:
                    best, best_key = int(self.req.klass[rid]), key
        return best, best_key[0]

    def _pop(self, g: int) -> int:
        self.n_queued -= 1
        return self.queues[g].popleft()

    # -- victims -------------------------------------------------------------------------------
    def _victim(self, rid: int) -> int:
        """Running out of KV: the lowest-class running request, newest first."""
        run = self.st.running.ids
        k = self.rank[run]
        return int(run[np.flatnonzero(k == k.max())[-1]])

    def _lower(self, g: int) -> list[int]:
        """Running requests of classes below ``g``, in preemption order (lowest class, newest)."""
        run = self.st.running.ids
        k = self.rank[run]
        out: list[int] = []
        for c in range(NUM_CLASSES - 1, g, -1):
            out.extend(run[k == c][::-1].tolist())
        return out

    def _make_room(self, rid: int, g: int, n: int, slots: int, now: float, b: BatchBuilder) -> bool:
        """Preempt lower-class requests so that ``rid`` (class ``g``) gets ``slots`` more batch
        slots and ``n`` tokens of KV -- only if enough victims exist; then allocate. True if
        ``rid`` now has its slot and its KV."""
        if not self.preempt_lower:
            return False
        victims = self._lower(g)
        if slots > len(victims):
            return False
        req, bs = self.req, self.bs
        chosen = victims[:slots]
        short = -(-int(req.computed[rid] + n) // bs) - self.kv.free_blocks
        short -= sum(-(-int(req.computed[v] + self._scheduled(b, v)) // bs) for v in chosen)
        for v in victims[slots:]:
            if short <= 0:
                break
            chosen.append(v)
            short -= -(-int(req.computed[v] + self._scheduled(b, v)) // bs)
        if short > 0:
            return False
        for v in chosen:
            self._preempt(v, now, b)
        return self.kv.allocate(rid, n)

    @staticmethod
    def _scheduled(b: BatchBuilder, rid: int) -> int:
        for ids, new in zip(b.ids, b.new):
            hit = ids == rid
            if hit.any():
                return int(new[hit].sum())
        return 0

    def _waiting_ids(self) -> list[int]:
        return [rid for q in self.queues for rid in q]

    # -- admission -----------------------------------------------------------------------------
    def _admit(self, now: float, b: BatchBuilder) -> tuple[np.ndarray, bool]:
        admitted = False
        while self.n_queued:
            g, e = self._head(now)
            rid = self.queues[g][0]
            n, cause = self._try(rid, g, now, b)
            if cause is not None:
                return self._blocked(g, e, cause), admitted
            self._pop(g)
            if n < 0:  # set aside: its KV is on the way from a lower tier
                continue
            self.rank[rid] = e
            self._admit_one(rid, n, now, b)
            admitted = True
        return self._causes[Cause.ITERATION], admitted

    def _try(self, rid: int, g: int, now: float, b: BatchBuilder) -> tuple[int, Cause | None]:
        """The tokens head ``rid`` (class ``g``) runs this iteration, once it has a slot and KV
        (evicting lower classes where allowed); or why it cannot; ``-1`` if it was set aside."""
        run = len(self.st.running)
        over = 0  # batch slots to free for it by evicting lower classes
        if run >= self.class_slots[g]:
            # its class budget is full; only the hard cap (max_num_seqs) is contested by eviction
            over = run - self.max_seqs + 1
            if over <= 0 or not (self.preempt_lower and len(self._lower(g)) >= over):
                return 0, Cause.BATCH_SLOTS
        if self._budget <= 0:
            return 0, Cause.TOKEN_BUDGET
        ready = self._ready(rid, now)
        if ready == ASIDE:
            return -1, None
        if ready == NO_ROOM:
            return 0, Cause.KV_BLOCKS
        req = self.req
        n = int(req.prompt[rid] + req.num_output[rid] - req.computed[rid])
        if n > self._budget:
            if not self.chunked:
                return 0, Cause.TOKEN_BUDGET
            n = self._budget
        if (over > 0 or not self.kv.allocate(rid, n)) and not self._make_room(rid, g, n, over, now, b):
            if over > 0 or not (self._release_idle_holders(rid, b) and self.kv.allocate(rid, n)):
                return 0, Cause.KV_BLOCKS
        return n, None

    def _blocked(self, g: int, e: int, cause: Cause) -> np.ndarray:
        key = (g, e, int(cause), tuple(bool(q) for q in self.queues))
        arr = self._class_causes.get(key)
        if arr is None:
            arr = np.array([int(cause) if k == g else
                            int(Cause.HIGHER_CLASS) if (self.queues[k] or k >= e) else int(Cause.ITERATION)
                            for k in range(NUM_CLASSES)], dtype=np.int64)
            arr.flags.writeable = False
            self._class_causes[key] = arr
        return arr

    def _finish(self, b: BatchBuilder, causes: np.ndarray, decode_only: bool, now: float,
                horizon: float = INF) -> Batch:
        if self.aging is not None and self.n_queued:
            horizon = min(horizon, self._aging_horizon(now))
        return super()._finish(b, causes, decode_only, now, horizon)

    def _aging_horizon(self, now: float) -> float:
        """The next time a queue head's effective class drops (the order may change then)."""
        t = INF
        for q in self.queues:
            if q:
                rid = q[0]
                if self._eff(rid, now) > 0:
                    a = float(self.req.arrival[rid])
                    t = min(t, a + ((now - a) // self.aging + 1) * self.aging)
        # a hair early: float rounding must never let the order change before the horizon
        return t - 1e-9 * max(1.0, abs(t))
