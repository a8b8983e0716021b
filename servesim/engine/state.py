"""Replica state, as columns: what the engine and the policy share.

``RequestTable`` holds one row per request of the workload (numpy columns, indexed by request id);
``ReplicaState`` adds the running set (ids in admission order), the waiting structure's bookkeeping
and the blockage clocks. The policy decides; the state's methods (:meth:`ReplicaState.admit`,
:meth:`ReplicaState.preempt`) apply the decision consistently so no policy can forget a field.

Blockage clocks
---------------
Every waiting second of a request has exactly one cause (see :class:`servesim.sched.Cause`). At
each iteration boundary the policy names, per SLA class, what blocks a waiting request of that
class; the engine integrates this into cumulative clocks ``K[class, cause]``. A request of class
``g`` that waits from ``a`` to ``b`` was blocked ``K[g, c](b) - K[g, c](a)`` seconds by cause ``c``.
That costs O(classes) per iteration instead of O(waiting requests), and the per-cause seconds sum
to the wait by construction. We store ``-K(a)`` in the request's row on arrival and add ``K(b)`` on
admission, so no extra memory is needed. Waits after a preemption are charged to ``PREEMPTED``.
"""

from __future__ import annotations

import numpy as np

from servesim.request import (  # noqa: F401 (re-exported)
    FINISHED, NUM_CAUSES, NUM_CLASSES, PENDING, REJECTED, RUNNING, WAITING, Cause, Reject, RequestTable,
)


class RunningSet:
    """Running request ids in admission order (oldest first), as a numpy array."""

    def __init__(self):
        self.ids = np.empty(0, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, rid: int) -> None:
        self.ids = np.append(self.ids, rid)

    def remove(self, rid: int) -> None:
        self.ids = self.ids[self.ids != rid]

    def remove_finished(self, status: np.ndarray) -> None:
        """Drop every id whose status is no longer RUNNING (cheaper than set membership)."""
        self.ids = self.ids[status[self.ids] == RUNNING]


class ReplicaState:
    def __init__(self, req: RequestTable, kv, max_num_seqs: int, kv_bytes_per_token: int = 0,
                 host_link_bytes_per_s: float = 0.0):
        self.req = req
        self.kv = kv
        self.running = RunningSet()
        self.max_num_seqs = max_num_seqs
        # for swap preemption: bytes of one token's KV on this GPU and the host link speed
        self.kv_bytes_per_token = kv_bytes_per_token
        self.host_link_bytes_per_s = host_link_bytes_per_s
        self.swapped = np.zeros(req.n, dtype=bool)  # KV parked in host memory (swap preemption)
        # blockage clocks, kept lazily: K(t) = clock_k + (t - clock_t) on each class's current cause
        self.clock_k = np.zeros((NUM_CLASSES, NUM_CAUSES), dtype=np.float64)
        self.clock_t = 0.0
        self.cause_now = np.full(NUM_CLASSES, int(Cause.ITERATION), dtype=np.int64)
        self._class_idx = np.arange(NUM_CLASSES)
        self._now = 0.0

    # -- blockage clocks --------------------------------------------------------------------
    def advance_clocks(self, t: float) -> None:
        """The engine's clock moved to ``t``; clocks are settled only when causes change."""
        self._now = t

    def _settle(self, t: float) -> None:
        dt = t - self.clock_t
        if dt > 0:
            self.clock_k[self._class_idx, self.cause_now] += dt
        self.clock_t = t

    def set_causes(self, causes: np.ndarray) -> None:
        """What blocks each class from now on (policies return shared arrays: identity is cheap)."""
        if causes is self.cause_now:
            return
        if not np.array_equal(causes, self.cause_now):
            self._settle(self._now)
        self.cause_now = causes

    def clocks_at(self, g: int, t: float) -> np.ndarray:
        """K[g, :] at time ``t`` (t within the current stretch of constant causes)."""
        row = self.clock_k[g].copy()
        row[self.cause_now[g]] += t - self.clock_t
        return row

    def start_waiting(self, ids: np.ndarray, times: np.ndarray) -> None:
        """Fresh arrivals at ``times`` begin to wait."""
        if len(ids) == 1:  # the common case, in scalars
            rid, g = int(ids[0]), int(self.req.klass[ids[0]])
            self.req.blocked[rid] -= self.clocks_at(g, float(times[0]))
            self.req.status[rid] = WAITING
            return
        g = self.req.klass[ids]
        snap = self.clock_k[g].copy()
        snap[np.arange(len(ids)), self.cause_now[g]] += times - self.clock_t
        self.req.blocked[ids] -= snap
        self.req.status[ids] = WAITING

    def suspend_wait(self, rid: int, now: float, cause: int) -> None:
        """A waiting request leaves its class's shared cause for a cause of its own (e.g. its KV is
        being fetched from a lower tier): settle its class-clock share so far, start its own."""
        req = self.req
        req.blocked[rid] += self.clocks_at(int(req.klass[rid]), now)
        req.blocked[rid, cause] -= now

    def resume_wait(self, rid: int, now: float, cause: int) -> None:
        """End a :meth:`suspend_wait`: charge its own cause, rejoin the class clock."""
        req = self.req
        req.blocked[rid, cause] += now
        req.blocked[rid] -= self.clocks_at(int(req.klass[rid]), now)

    # -- transitions (called by policies) -----------------------------------------------------
    def admit(self, rid: int, now: float) -> None:
        """Waiting -> running. Ends the wait: settle its blocked seconds."""
        req = self.req
        if np.isnan(req.t_first_sched[rid]):
            req.t_first_sched[rid] = now
            req.blocked[rid] += self.clocks_at(int(req.klass[rid]), now)
        else:  # resumed after a preemption
            req.blocked[rid, Cause.PREEMPTED] += now
        self.swapped[rid] = False
        req.status[rid] = RUNNING
        self.running.add(rid)

    def swap_seconds(self, tokens: int) -> float:
        """Time to move ``tokens`` tokens of KV over the host link (one direction)."""
        if self.host_link_bytes_per_s <= 0:
            raise ValueError("swap needs host_link_bytes_per_s")
        return tokens * self.kv_bytes_per_token / self.host_link_bytes_per_s

    def preempt(self, rid: int, now: float, swap: bool = False) -> None:
        """Running -> waiting. By recompute (default): drop its KV; it will prefill everything it
        knows again. By swap: its KV moves to host memory (the caller charges the transfer time);
        its computed tokens are kept and it resumes where it stopped once swapped back in."""
        req = self.req
        self.kv.free(rid)
        if swap:
            self.swapped[rid] = True
        else:
            req.computed[rid] = 0
        req.preemptions[rid] += 1
        req.status[rid] = WAITING
        req.blocked[rid, Cause.PREEMPTED] -= now
        self.running.remove(rid)
