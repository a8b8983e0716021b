"""The Python driver of the compiled routed loop (engine/fleet_loop.py ``fleet_run``), a part of
``Fleet`` (engine/cluster.py) kept apart because it is a second driver of the same loop: where
it applies (``_loop_compiles``: an open loop of compiled engines, one a replica, behind
least-tokens or least-requests, nothing else on the clock) ``_run_compiled`` replaces
``Fleet._run_events`` with one kernel and acts only on the kernel's exits -- drain an engine's
buffers, raise its error, draw for a sampling router, take a request in at an ended engine,
shut the inbox, the warm-up request, progress and Ctrl-C. Its steps are ``_run_events``' steps,
in the same order, so both must give the same results (tests/test_fleet_scale.py compares
them); the code moved here unchanged from cluster.py.
"""

from __future__ import annotations

import numpy as np

from servesim.engine import kernel as K
from servesim.engine.driver import entry_point
from servesim.engine.fleet_finish import batched, drain_engines

INF = float("inf")


class CompiledLoop:
    """``Fleet``'s compiled loop: a mixin, for it reads and writes the fleet's own state (engines,
    inbox, loads, router, ``replica_of``) and calls its Python steps (``_take_in``,
    ``_route_due``) where the kernel exits."""

    def _fleet_run_entry(self):
        from servesim.engine import fleet_loop as FL

        f8, i8 = np.zeros(1), np.zeros(1, dtype=np.int64)
        return entry_point(FL.fleet_run, self.loads._ref, self.inbox.cfg, self.inbox.kst, f8, np.zeros(1, dtype=np.uint8),
                           i8, i8, i8, f8, i8, i8, i8, i8, self.replica_of, np.zeros((1, 2), dtype=np.int64))

    compiled_loop = True  # False: the Python loop even where the compiled one applies (tests compare them)

    def _loop_compiles(self) -> bool:
        """Whether ``_run_events`` runs compiled (engine/fleet_loop.py ``fleet_run``): an open
        loop of compiled engines, one a replica, behind least-tokens or least-requests (exact or
        sampled, no replica drained), nothing else on the clock, no decisions recorded."""
        from servesim.engine.router import LeastRequests, LeastTokens

        return (self.compiled_loop and not self.dynamic and not self.closed and not self.coupled
                and not self.scan and self.decisions is None and type(self.router) in (LeastTokens, LeastRequests)
                and self.router.active is None and len(self.engines) == len(self.replicas)
                and not self._rekey and not self._retry and self.loads._kernels())

    def _run_compiled(self) -> None:
        """``_run_events`` as one kernel (engine/fleet_loop.py ``fleet_run``): the same steps
        in the same order; it returns to Python only where Python must act (drain an engine's
        buffers, raise its error, draw for a sampling router, take a request in at an ended
        engine, shut the inbox, the warm-up request, progress and Ctrl-C every 8,192 calls)."""
        from servesim.engine import fleet_loop as FL
        from servesim.engine import load_kernels as LK
        from servesim.engine import slots as SL
        from servesim.engine.router import LeastTokens

        engines, inbox, loads, router = self.engines, self.inbox, self.loads, self.router
        fold_one_pass = batched(engines)  # (engine/fleet_finish.py)
        n_eng = len(engines)
        key = np.zeros(n_eng)
        done = np.zeros(n_eng, dtype=np.uint8)
        eh = np.arange(n_eng, dtype=np.int64)  # (every key 0: ordered by engine)
        ehpos = np.arange(n_eng, dtype=np.int64)
        ints = np.zeros(FL.N_INTS, dtype=np.int64)
        ints[FL.I_EH] = n_eng
        ints[FL.I_PTR] = router.ptr
        ints[FL.I_WARMUP] = self.warmup_id
        ints[FL.I_D] = router.sample
        ints[FL.I_KIND] = LK.TOK if type(router) is LeastTokens else LK.REQ
        ints[FL.I_SLOTS] = SL.give_fleet(self)  # (each engine's requests in slots of its own: engine/slots.py)
        ints[FL.I_CHOSEN] = -1
        fl = np.zeros(2)
        due = np.zeros(max(self.table.n, 1), dtype=np.int64)
        rids = np.zeros(1 << 16, dtype=np.int64)
        late = np.zeros(n_eng, dtype=np.int64)
        # a sampling router's draws: the rest of its block, then blocks drawn as Router._draw does
        blocks = [(-router._di, router._draws)] if router.sample else []
        draws = np.array(router._draws[router._di:] if router.sample else [], dtype=np.int64)
        ints[FL.I_DRAW_N] = len(draws)
        ref = loads._ref
        first = np.array([m[0] for m in self.replicas], dtype=np.int64)
        arrival = self.table.arrival
        T = inbox.next()
        if T == INF and inbox.exhausted():
            FL.fleet_shut(ref, key, done, eh, ehpos, ints)
            self._is_shut = True
        fl[0] = T
        lines = np.zeros((n_eng, 2 * FL.N_LINES), dtype=np.int64)  # (what the loop prefetches: fleet_loop.py)
        FL.engine_lines(ref, lines)
        run = self._loop_entry or self._fleet_run_entry()

        def note_routed(only: int = -1) -> None:
            """Engine.route_in's Python half for the requests routed since: each engine's recorder
            notes their arrivals (in routing order, which is time order) and counts them. A
            recorder reads its notes only when its engine's buffers are folded (``_drain``: a
            FLUSH, ``_take_in``, the end), so notes wait in ``rids`` until then: ``only`` (an
            engine about to be drained) notes that engine's alone, and a progress return
            (X_CALLS) notes none -- one numpy pass a buffer of routings instead of one a return,
            which called ``note_arrivals`` for ~1,000 engines at each of ~50 returns at 1,024
            replicas (0.3 s of a 7 s run). The same arrivals reach each recorder, sorted the
            same, whenever they are noted (metrics/collect.py ``_noted_between``)."""
            m = int(ints[FL.I_RIDS])
            if not m:
                return
            ids = rids[:m]
            es = first[self.replica_of[ids]]
            if only >= 0:
                mine = es == only
                if mine.any():
                    eng = engines[only]
                    part = ids[mine]
                    eng.routed += len(part)
                    eng.recorder.note_arrivals(arrival[part])
                    rest = ids[~mine]
                    rids[: len(rest)] = rest
                    ints[FL.I_RIDS] = len(rest)
                return
            order = np.argsort(es, kind="stable")
            es, ids = es[order], ids[order]
            cut = np.flatnonzero(np.diff(es)) + 1
            for part in np.split(np.arange(m), cut):
                eng = engines[int(es[part[0]])]
                eng.routed += len(part)
                eng.recorder.note_arrivals(arrival[ids[part]])
            ints[FL.I_RIDS] = 0

        def sync_router() -> None:
            router.ptr = int(ints[FL.I_PTR])
            router.sampled += int(ints[FL.I_SAMPLED])
            ints[FL.I_SAMPLED] = 0
            if router.sample:
                p = int(ints[FL.I_DRAW_I])
                for start, blk in reversed(blocks):
                    if start <= p:
                        router._draws, router._di = blk, p - start
                        break

        while True:
            if loads.touched:  # (engines Python touched: _take_in)
                LK.mark_touched(ref, loads._touched())
            why = run(ref, inbox.cfg, inbox.kst, key, done, eh, ehpos, ints, fl, due, draws, rids, late,
                      self.replica_of, lines)
            if why == FL.X_ENGINE:
                note_routed(int(ints[FL.I_E]))
            elif why != FL.X_CALLS:
                note_routed()
            if why == FL.X_DONE:
                break
            if why == FL.X_ENGINE:
                eng = engines[int(ints[FL.I_E])]
                if fold_one_pass:  # (its buffer's fold compiled: ~0.35 ms of numpy calls less a flush)
                    drain_engines((eng,))
                else:
                    eng._drain()
                if ints[FL.I_CODE] == K.ERROR:
                    sync_router()
                    eng.raise_error()
            elif why == FL.X_GROW:
                e = int(ints[FL.I_E])
                SL.grow(engines[e])
                SL.set_ref(self._refs, e, engines[e]._ref)
                FL.engine_lines(ref, lines)
            elif why == FL.X_DRAWS:
                p, n = int(ints[FL.I_DRAW_I]), int(ints[FL.I_DRAW_N])
                new = router._rng.integers(0, router.n, router._block).tolist()
                blocks = [(start - p, blk) for start, blk in blocks if start - p + len(blk) >= 0] + [(n - p, new)]
                draws = np.concatenate([draws[p:n], np.array(new, dtype=np.int64)])
                ints[FL.I_DRAW_I], ints[FL.I_DRAW_N] = 0, len(draws)
            elif why == FL.X_LATE:
                m = int(ints[FL.I_LATE])
                ints[FL.I_LATE] = 0
                self._t = float(fl[1])
                for e in sorted(late[:m].tolist()):
                    self._take_in(e, float(fl[1]))
            elif why == FL.X_NOARRIVAL:
                if inbox.exhausted():
                    FL.fleet_shut(ref, key, done, eh, ehpos, ints)
                    self._is_shut = True
            elif why == FL.X_WARMUP:
                w = self.warmup_id
                mine = engines[int(first[self.replica_of[w]])]
                for other in engines:
                    if other is not mine:
                        other.s.set_f("itl_from", float(self.table.arrival[w]))
            elif why == FL.X_STALL:
                raise RuntimeError("fleet stalled: no engine has anything to do and no request is left to "
                                   "route, yet the run has not ended (a bug)")
            elif why == FL.X_CALLS and self.progress is not None:
                self.progress(sum(x.s.get_i("ended") for x in engines))
            if why != FL.X_RIDS and why != FL.X_GROW and self._interrupt_now():
                note_routed()
                sync_router()
                return
        sync_router()
        # every engine has ended its run (a duration stop): what arrives by the fleet's final
        # instant is in the system when the run ends, as in ``_run_events``
        keys, heap, dones = key.tolist(), [], [True] * n_eng
        end = self.now
        T = float(fl[0])
        while T <= end:
            self._route_due(T, keys, heap, dones)
            T = inbox.next()
