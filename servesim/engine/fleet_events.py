"""The routed loop of a fleet (``Fleet._run_events``) and its routing steps, a part of ``Fleet``
(engine/cluster.py) kept apart because it is where the order of events at one instant is
decided, on which a fleet's agreement with single stepping rests. The code moved here unchanged
from cluster.py.

The loop keeps every engine's next event time (its iteration under way ends, or its idle wait
for the next arrival, the stop time or the policy's horizon ends) in a heap, and the fleet's next
arrival from the fleet inbox -- the lone replica's inbox kernels (open-loop cursor, closed-loop
heap, arrival cap) run on a state of the fleet's own::

    loop:
      T = next arrival (inbox),  (K, e) = earliest engine event (heap; ties: lower index)
      T <= K: every arrival at T, in (time, id) order: the router reads the replicas' loads
              (every engine has committed what ended before T), picks a replica, which picks
              its virtual engine (fewest unfinished requests, vLLM's rule), route_in
      else:   advance engine e up to T (strictly before: arrivals at T are routed first) --
              closed loops also stop at the next other engine's event, whose ending requests
              may send new ones, and so do engines on a shared KV-tier link (``coupled``: their
              fetches reach the link in time order); requests e ended go back to the inbox (their clients' next
              requests), e is keyed again
    end:  every engine has ended its run; arrivals up to the fleet's final instant are routed

Closed loops order each instant t: commits before plans. Their keys are (time, phase, engine):
phase 0 an iteration under way that ends at t, phase 1 a boundary to plan or an idle wake-up at t.
An engine stopped at another's *commit* at t commits through t but holds its plan there (kernel
``advance`` returns HELD at ``st.s.hold``). Every engine commits at t; then the next requests of
the clients whose requests ended there are sent (in engine order) and routed -- the router reads
every commit at t, whatever order the calls took; then engines plan at t, each knowing every
request a completion sent at t, as a lone replica's plan does (without the hold, the lower-index
engine planned first and single stepping agreed with the fast path only by luck of its keys:
tests/test_found_defects.py). Requests an engine rejects as it plans at t end their clients' turns
there too; their next requests are routed once every engine has planned at t (a lone replica
pulls them at its next boundary, not in the plan that rejected them), a decode run under way cut
after its first step past t (kernel ``route_in_after_plans``). Open loops key every engine with
phase 0 and bound it strictly before the next arrival: unchanged.

An engine thus plans at a boundary only after every arrival up to it is routed, which makes a
fleet of one replica reproduce the lone replica exactly (tests/test_cluster_identity.py). The
heap stands in for SimPy's event queue -- same (time, priority, index) ordering -- because a
routed arrival can move an engine's next event earlier (it cuts a decode run), which SimPy
timeouts cannot express; the whole loop is one SimPy process.
"""

from __future__ import annotations

import heapq
import math

from servesim.engine import kernel as K
from servesim.engine.driver import Engine

INF = float("inf")


def _index(eng: Engine) -> int:
    return eng.index


class EventLoop:
    """``Fleet``'s routed event loop and routing steps: a mixin, for it reads and writes the
    fleet's own state (engines, inbox, router, loads, ``replica_of``) and ``Fleet._steps`` drives
    it; the compiled loop (engine/fleet_compiled.py) and replica failures (engine/fleet_faults.py)
    call its routing steps."""

    # -- routing -----------------------------------------------------------------------------
    def _phase(self, eng: Engine) -> int:
        """The phase of an engine's heap entry (time, phase, engine) in ``_run_events``: closed
        loops order an engine's commit at a time (0: its iteration under way ends then) before
        every plan at that time (1: a boundary to plan, an idle wake-up); open loops key every
        engine with phase 0 (time, then engine, as before)."""
        return 0 if eng.s.get_i("inflight") else self._p1

    @staticmethod
    def _key(e: int, k: float, p: int, key: list, heap: list) -> None:
        """Engine ``e``'s next event is at ``k`` (phase ``p``): a new heap entry unless its live
        one (``key[e]``, the very tuple in the heap) says the same."""
        live = key[e]
        if live[0] != k or live[1] != p:
            entry = (k, p, e)
            key[e] = entry
            heapq.heappush(heap, entry)

    def _route(self, rid: int, t: float, key: list, heap: list, after_plans: bool = False) -> int:
        """Route ``rid`` (arriving at ``t``) to an engine; returns the engine. ``after_plans``:
        sent after every engine's plan at ``t`` (``_run_events``' deferred successors)."""
        table = self.table
        r = self.router.choose(rid, int(table.klass[rid]), self.view)
        if self.decisions is not None:
            self.decisions.append((rid, r, self._loads_requests()))
        group = self.replicas[r]
        e = group[0]
        if len(group) > 1:  # a pipeline replica: its virtual engine with the fewest unfinished requests
            best = None
            for i in group:
                o = self.engines[i].outstanding()
                if best is None or o < best:
                    best, e = o, i
        eng = self.engines[e]
        eng.route_in(rid, after_plans)
        self.routed[e] += 1
        self.loads.touch(e)
        self.replica_of[rid] = r
        if rid == self.warmup_id:  # inter-token gaps count from the warm-up request's arrival on
            for other in self.engines:
                if other is not eng:
                    other.s.set_f("itl_from", float(table.arrival[rid]))
        s, live = eng.s, key[e]
        if s.get_i("inflight"):
            k, p = s.get_f("t_end"), 0  # (route_in may have cut its decode run)
        elif s.get_i("idle"):
            k, p = min(live[0], t), self._p1  # it wakes up for this arrival, if not earlier
        else:
            k, p = live[0], self._p1  # a boundary it has yet to plan
        if live[0] != k or live[1] != p:  # (``_key``, inline: once per routed request)
            entry = (k, p, e)
            key[e] = entry
            heapq.heappush(heap, entry)
        return e

    def _route_due(self, t: float, key: list, heap: list, done: list, after_plans: bool = False) -> None:
        """Route every arrival at ``t``; engines whose run has ended take theirs in (``_take_in``),
        in engine order, once the router has placed them all (it reads the loads every engine
        had at ``t``, as for engines still running)."""
        self._t = t
        late = []
        for rid in self.inbox.due(t):
            e = self._route(int(rid), t, key, heap, after_plans)
            if done[e] and e not in late:
                late.append(e)
        for e in sorted(late):
            self._take_in(e, t)

    def _take_in(self, e: int, t: float) -> None:
        """Engine ``e`` ended its run (a duration stop, at its final boundary) and a request routed
        to it arrives at ``t``, no later than the fleet's final instant (routing is in time order,
        and a running engine's final boundary is no earlier than its next event): the engine takes
        it in as a lone replica takes in what arrives at its final boundary -- rejected, or waiting
        -- and the fleet's closed loops send the rejected requests' successors. The engine waited,
        stopped, for the arrival: its clock moves on to ``t`` (never back), and it plans nothing."""
        eng = self.engines[e]
        if eng.s.get_f("now") < t:
            eng.s.set_f("now", t)
        code = eng.advance(t)  # (its final boundary again: the pull, then DONE)
        self.loads.touch(e)
        assert code == K.DONE, code
        if self.closed:
            self._send_successors(eng)

    def _send_successors(self, eng: Engine) -> bool:
        """The clients of the requests ``eng`` ended send their next requests (the fleet inbox);
        False when none ended."""
        ended = eng.take_ended()
        if not ended:
            return False
        t = eng.s.get_f("now") + self.delay_out + self.delay_in
        for rid in ended:
            self.inbox.ended(rid, t)
        return True

    def _shut(self, key: list, heap: list, done: list) -> None:
        """The inbox is exhausted: engines may end once drained; idle ones are woken to see it."""
        self._is_shut = True
        for i, eng in enumerate(self.engines):
            if done[i]:
                continue
            eng.s.set_i("inbox_shut", 1)
            if not eng.s.get_i("inflight"):
                self._key(i, eng.s.get_f("now"), self._phase(eng), key, heap)

    def _run_events(self) -> None:
        engines, inbox, closed, coupled = self.engines, self.inbox, self.closed, self.coupled
        n_eng = len(engines)
        p1 = self._p1  # the phase of a boundary to plan (``_phase``); every engine starts at one
        heap = [(0.0, p1, i) for i in range(n_eng)]  # (time, phase, engine): ``_phase``
        key = heap[:]  # each engine's live entry (the same tuple): any other entry in the heap is stale
        done = [False] * n_eng
        n_done = 0
        shut = False
        T = inbox.next()
        if not shut and T == INF and inbox.exhausted():
            self._shut(key, heap, done)
            shut = True
        calls = 0
        touch = self.loads.touch
        h = self._horizon()  # the next event of another SimPy process (inf: none)
        # closed: engines whose ended requests' clients send their next requests once every event
        # of phase ``wait[1]`` at time ``wait[0]`` is done -- every commit there (requests that
        # finished), or every plan there (requests rejected as they were pulled)
        waiting: list = []
        wait = (INF, 0)

        def top():
            while heap:
                entry = heap[0]
                if entry is key[entry[2]] and not done[entry[2]]:
                    return entry[0]
                heapq.heappop(heap)
            return INF

        while n_done < n_eng:
            k_min = top()
            if waiting and (k_min, heap[0][1] if heap else 0) > wait:
                # in engine order, whichever order the calls took (a closed loop's group gives its
                # next row to the first of its clients to send)
                if len(waiting) > 1:
                    waiting.sort(key=_index)
                for eng in waiting:
                    self._send_successors(eng)
                waiting.clear()
                t_w, after_plans = wait[0], wait[1] == 1
                wait = (INF, 0)
                T = inbox.next()
                if T == t_w:  # the requests they send at once, routed now
                    self._route_due(T, key, heap, done, after_plans)
                    T = inbox.next()
                if not shut and T == INF and inbox.exhausted():
                    self._shut(key, heap, done)
                    shut = True
                continue
            if h < T and h < k_min:  # every fleet event up to h is done: the other processes' turn
                yield h
                if self._rekey or self._retry:  # (replicas failed: FleetHandle.fail)
                    n_done -= self._resume_faults(h, key, heap, done)
                h = self._horizon()
                T = inbox.next()  # (a process may have moved arrivals: FleetHandle.set_rate)
                if not shut and T == INF and inbox.exhausted():
                    self._shut(key, heap, done)
                    shut = True
                continue
            if T <= k_min and T < INF:
                self._route_due(T, key, heap, done)
                T = inbox.next()
                if not shut and T == INF and inbox.exhausted():
                    self._shut(key, heap, done)
                    shut = True
                continue
            if k_min == INF:
                raise RuntimeError("fleet stalled: no engine has anything to do and no request is left to "
                                   "route, yet the run has not ended (a bug)")
            _, _, e = heapq.heappop(heap)
            bound = math.nextafter(T, -INF) if T < INF else INF  # arrivals at T are routed first
            hold = INF
            if closed or coupled:
                k2 = top()
                if k2 < T:
                    # closed: other engines' events at k2 may send requests at k2 or later;
                    # coupled: their fetches on a shared link come at k2 or later (time order)
                    bound = k2
                    if closed and heap[0][1] == 0:
                        hold = k2  # another engine commits at k2: commit through it, plan there later
            if waiting and wait[0] <= bound:  # (it commits, or plans, at wait[0]; the waiting requests come next)
                bound = wait[0]
                if wait[1] == 0:
                    hold = bound
            if h < bound:
                bound = h  # commits what ends by h; a routed engine plans the same (engine/kernel.py)
            held = hold < INF and hold == bound
            eng = engines[e]
            if held:
                eng.s.set_f("hold", bound)  # (for this call only: advance resets it)
            code = eng.advance(bound)
            touch(e)
            if code != K.DONE and self._interrupt_now():
                return
            s = eng.s
            if closed and s.get_i("end_head") >= 0:
                # it planned (a return right after a commit leaves the boundary unplanned): the
                # requests it rejected as it pulled wait for every plan there, as a lone replica
                # pulls their clients' next requests at its next boundary, not in the plan that
                # rejected them; requests that finished wait for every commit at their time
                planned = code == K.DONE or s.get_i("inflight") or s.get_i("idle")
                at = (s.get_f("now"), 1 if planned else 0)
                assert not waiting or at == wait, (at, wait)
                if eng not in waiting:
                    waiting.append(eng)
                wait = at
            if code == K.DONE:
                done[e] = True
                n_done += 1
                continue
            if s.get_i("inflight"):  # (Engine.next_key, and ``_phase``)
                entry = (s.get_f("t_end"), 0, e)
            else:
                entry = (s.get_f("wake") if code == K.UNTIL else s.get_f("now"), p1, e)
            key[e] = entry
            heapq.heappush(heap, entry)
            calls += 1
            if self.progress is not None and calls % 8192 == 0:
                self.progress(sum(x.s.get_i("ended") for x in engines))
        for eng in sorted(waiting, key=_index):  # (the last engines' final pulls rejected some)
            self._send_successors(eng)
        T = inbox.next()
        # every engine has ended its run (a duration stop): what arrives by the fleet's final
        # instant is in the system when the run ends -- the successors the last engines' final
        # boundaries sent, and theirs in turn (think 0, rejections) -- as for a lone replica
        end = self.now
        while T <= end:
            self._route_due(T, key, heap, done)
            T = inbox.next()
