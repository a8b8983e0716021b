"""The fleet's handles on the kernels it interleaves (engine/cluster.py runs the loop).

:class:`Engine` is one kernel instance -- a replica, or a virtual engine of a pipeline replica --
as the fleet's loop calls it: advance to a bound, take a routed request in, read its load and
the requests it ended. :class:`FleetInbox` is the fleet's arrivals: the lone replica's inbox
kernels on a state of the fleet's own. Both call the compiled kernels through their machine-code
entry points (:func:`entry_point`), or the same kernels uncompiled (``servesim.jit.pure``), and
read the engines' scalars through :class:`Scalars` (record-array views, or the Python mirror).
"""

from __future__ import annotations

import numpy as np

from servesim.engine import kernel as K
from servesim.jit import pure
from servesim.sched.state import SCALARS, ScalarsMirror, compiled_state

INF = float("inf")
SCALAR_INDEX = {name: i for i, name in enumerate(SCALARS.names)}


def entry_point(dispatcher, *args):
    """The compiled machine-code entry of ``dispatcher`` for these arguments' types: calls skip
    numba's per-call typing of the NamedTuple arguments (~20 us of an advance call)."""
    from numba import typeof

    sig = tuple(typeof(a) for a in args)
    dispatcher.compile(sig)
    return dispatcher.overloads[sig].entry_point


class Scalars:
    """Fast reads and writes of an engine's scalars: views of the record array (compiled), or
    the Python mirror's attributes (uncompiled)."""

    def __init__(self, st, array: np.ndarray | None):
        self.mirror = st.s if isinstance(st.s, ScalarsMirror) else None
        if self.mirror is None:  # (a plain ndarray view: a recarray's indexing is ~1 us)
            plain = array.view(np.ndarray)
            self.f = plain.view(np.float64)
            self.i = plain.view(np.int64)

    def get_f(self, name: str) -> float:
        return getattr(self.mirror, name) if self.mirror is not None else float(self.f[SCALAR_INDEX[name]])

    def get_i(self, name: str) -> int:
        return getattr(self.mirror, name) if self.mirror is not None else int(self.i[SCALAR_INDEX[name]])

    def set_f(self, name: str, v: float) -> None:
        if self.mirror is not None:
            setattr(self.mirror, name, float(v))
        else:
            self.f[SCALAR_INDEX[name]] = v

    def set_i(self, name: str, v: int) -> None:
        if self.mirror is not None:
            setattr(self.mirror, name, int(v))
        else:
            self.i[SCALAR_INDEX[name]] = v


class Engine:
    """One kernel instance of a fleet (a replica, or a virtual engine of a pipeline replica)."""

    def __init__(self, rep, index: int, plan, kv):
        self.rep, self.index = rep, index
        # what the results need (a virtual engine's plan: its share of the replica's blocks)
        self.recorder, self.plan, self.kv = rep.rec, plan, kv
        self.s = Scalars(rep.st, rep.scalars)
        if rep.path == "compiled":  # one pointer per call (kernel.EngineRef)
            ref = K.make_engine_ref(rep.cfg, rep.kst, rep.kkv, rep.tab)
            adv = entry_point(K.advance_ref, ref, 0.0)
            route = entry_point(K.route_in_ref, ref, 0)
            work = entry_point(K.outstanding_work_ref, ref, 0.0)
            self._advance = lambda until: adv(ref, until)
            self._route = lambda rid: route(ref, rid)
            self._work = lambda t: work(ref, t)
            self._ref = ref
        else:
            cfg, kst, kv, tab = rep.cfg, rep.kst, rep.kv, rep.tab
            adv, route, work = rep._advance, pure(K.route_in), pure(K.outstanding_work)
            self._advance = lambda until: adv(cfg, kst, kv, tab, until)
            self._route = lambda rid: route(cfg, kst, rid)
            self._work = lambda t: work(cfg, kst, t)
        self.in_next = rep.st.in_next
        self.routed = 0

    def advance(self, until: float) -> int:
        rep = self.rep
        code = self._advance(until)
        if code == K.FLUSH:  # (not at PROGRESS: the Python engine returns it more often -- Ctrl-C,
            rep._drain()     # engine/driver.py -- and draining groups the recorder's float sums)
        elif code == K.ERROR:
            rep._drain()
            rep.raise_error()
        return code

    def route_in(self, rid: int) -> None:
        self._route(rid)
        self.routed += 1
        self.recorder.note_arrivals(self.rep.st.arrival[rid])  # waits during a step count (metrics/collect.py)

    def append_inbox(self, ids: np.ndarray) -> None:
        """Send ``ids`` (in arrival order) to an engine that has not started: its inbox list."""
        if not len(ids):
            return
        assert not self.s.get_i("inflight") and self.s.get_i("in_head") < 0
        nxt = self.in_next
        nxt[ids[:-1]] = ids[1:]
        nxt[ids[-1]] = -1
        self.s.set_i("in_head", int(ids[0]))
        self.s.set_i("in_tail", int(ids[-1]))
        self.routed += len(ids)
        self.recorder.note_arrivals(self.rep.st.arrival[ids])

    def last_arrival_by(self, t: float) -> float | None:
        """The latest arrival at or before ``t`` among the requests routed here and not pulled yet
        (None: none)."""
        r = self.s.get_i("in_head")
        arrival = self.rep.st.arrival
        last = None
        while r >= 0 and arrival[r] <= t:
            last = float(arrival[r])
            r = int(self.in_next[r])
        return last

    def work(self, t: float) -> int:
        return int(self._work(t))

    def outstanding(self) -> int:
        return self.routed - self.s.get_i("ended")

    def take_ended(self) -> list[int]:
        """Requests ended since the last look (routed with report_ended), in the order they ended."""
        s = self.s
        r = s.get_i("end_head")
        if r < 0:
            return []
        out = []
        nxt = self.in_next
        while r >= 0:
            out.append(r)
            r = int(nxt[r])
        s.set_i("end_head", -1)
        s.set_i("end_tail", -1)
        return out

    def next_key(self, code: int) -> float:
        """When this engine next needs a call: its iteration's end, its idle wake-up, or now
        (a boundary it has not planned yet)."""
        s = self.s
        if s.get_i("inflight"):
            return s.get_f("t_end")
        if code == K.UNTIL:
            return s.get_f("wake")
        return s.get_f("now")

    def finish(self) -> None:
        self.rep._drain()
        self.rep._finish()


class FleetInbox:
    """The fleet's arrivals: the lone replica's inbox kernels (``next_arrival``, ``due_arrivals``,
    ``request_ended``) on a state of the fleet's own (open-loop cursor, closed-loop heap, cap)."""

    def __init__(self, cfg, st, scalars: np.ndarray, compiled: bool):
        self.cfg = cfg
        self.st = st
        if compiled:
            self.kst = compiled_state(st)
            self._next = entry_point(K.next_arrival, cfg, self.kst)
            self._due = entry_point(K.due_arrivals, cfg, self.kst, 0.0)
            self._ended = entry_point(K.request_ended, cfg, self.kst, 0, 0.0)
            self.s = Scalars(st, scalars)
        else:
            st = st._replace(s=ScalarsMirror(st.s))
            self.st = self.kst = st
            self._next, self._due, self._ended = pure(K.next_arrival), pure(K.due_arrivals), pure(K.request_ended)
            self.s = Scalars(st, None)

    def next(self) -> float:
        return float(self._next(self.cfg, self.kst))

    def due(self, t: float) -> np.ndarray:
        return self._due(self.cfg, self.kst, t)

    def ended(self, rid: int, t: float) -> None:
        self._ended(self.cfg, self.kst, rid, t)

    def exhausted(self) -> bool:
        """Nothing will ever arrive again: the cap was reached, or every open-loop row was sent
        and every closed loop has sent its last row."""
        s = self.s
        if s.get_i("inbox_shut"):
            return True
        if s.get_i("heap_len") > 0 or s.get_i("cursor") < self.cfg.n:
            return False
        st = self.st
        return bool(np.all(st.g_next >= st.g_hi)) if len(st.g_next) else True
