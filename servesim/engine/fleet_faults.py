"""Replica failures, a part of ``Fleet`` (engine/cluster.py) kept apart because only a run with
``cluster.faults`` (engine/processes.py ``FleetHandle.fail`` / ``repair``) reaches it: a failed
replica's engines restart empty, the requests it held are retried through the router or end
rejected, and the routed loop, paused at the failure, keys the restarted engines and routes the
retries when it resumes (``_resume_faults``). The code moved here unchanged from cluster.py.
"""

from __future__ import annotations

import heapq

import numpy as np


class ReplicaFaults:
    """``Fleet``'s failures: a mixin, for they replace the fleet's own engines and rewrite its
    request table's rows in place, with the loop paused."""

    def fail_replica(self, r: int, t: float, retry: bool) -> tuple[int, int]:
        """Replica ``r`` fails at ``t`` (the loop is paused there): every engine of it restarts
        empty -- its queues, running batch, the iterations under way and its KV cache (prefix
        cache included) are lost. The requests it held (routed there, not ended) are sent again
        through the router when the loop resumes (``retry``: they start over, their latencies
        still counted from their first arrival) or end rejected (``replica_failed``; a closed
        loop's client then sends its next one). Returns (lost, retried)."""
        from servesim.request import FINISHED, PENDING, REJECTED, Reject
        from servesim.sched.state import new_scalars

        table = self.table
        for e in self.replicas[r]:
            old = self.engines[e]
            if self.closed:
                self._send_successors(old)  # (what it ended before the failure)
            old.finish()
            if getattr(old.kv, "prefix_caching", False):
                self.retired_kv.append(_Retired(old.kv))
            if self._scalars is not None:
                self._scalars[e] = new_scalars()[0]
            new = self.factories[e](old.recorder)
            new.s.set_f("now", max(t, old.s.get_f("now")))
            new.s.set_f("itl_from", old.s.get_f("itl_from"))
            new.recorder.itl_from = old.recorder.itl_from
            if self._is_shut:
                new.s.set_i("inbox_shut", 1)
            self.engines[e] = new
            if self._vector is not None:
                self._refs[e] = new._ref
            self.routed[e] = 0
            self.loads.touch(e)
            self._rekey.append(e)
        st = table.status
        held = np.flatnonzero((self.replica_of == r) & (st != FINISHED) & (st != REJECTED))
        if retry:
            for rid in held.tolist():
                self.first_arrival.setdefault(rid, float(table.arrival[rid]))
            table.arrival[held] = t  # (restored after the run: restore_arrivals)
            st[held] = PENDING
            table.computed[held] = 0
            table.num_output[held] = 0
            for col in (table.t_first_sched, table.t_first_token, table.t_last_token):
                col[held] = np.nan
            self._retry.extend(held.tolist())
            return 0, len(held)
        st[held] = REJECTED
        table.reject_reason[held] = Reject.REPLICA_FAILED
        table.t_finish[held] = t
        if self.closed:
            for rid in held.tolist():
                self.inbox.ended(rid, t + self.delay_out + self.delay_in)
        return len(held), 0

    def restore_arrivals(self) -> None:
        """Retried requests' arrival times back to their first (latencies count from there)."""
        for rid, t in self.first_arrival.items():
            self.table.arrival[rid] = t

    def _resume_faults(self, t: float, key: list, heap: list, done: list) -> int:
        """After a pause in which replicas failed: key their restarted engines and route the
        requests to retry (at ``t``). Returns how many ended engines run again."""
        woke = 0
        for e in self._rekey:
            if done[e]:
                done[e] = False
                woke += 1
            entry = (self.engines[e].s.get_f("now"), self._phase(self.engines[e]), e)
            key[e] = entry
            heapq.heappush(heap, entry)
        self._rekey.clear()
        retry, self._retry = self._retry, []
        self._t = t
        for rid in retry:
            e = self._route(rid, t, key, heap)
            if done[e]:
                done[e] = False
                woke += 1
                entry = (max(t, self.engines[e].s.get_f("now")), self._phase(self.engines[e]), e)
                key[e] = entry
                heapq.heappush(heap, entry)
        return woke


class _Retired:
    """A failed engine's prefix-cache manager, for the summary: its counters (lookups, hits,
    evictions) count toward the run's; the blocks it cached were lost with it."""

    def __init__(self, kv):
        self._kv = kv

    def __getattr__(self, name):
        return getattr(self._kv, name)

    def cached_blocks(self) -> int:
        return 0
