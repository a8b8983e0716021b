"""The fleet's arrivals (engine/cluster.py runs the loop; engine/driver.py ``Engine`` is each
kernel instance it calls).

:class:`FleetInbox` is a routed fleet's arrivals: the lone replica's inbox kernels on a state of
the fleet's own (open-loop cursor, closed-loop heap, the cap), called through their machine-code
entry points (:func:`~servesim.engine.driver.entry_point`) or uncompiled (``servesim.jit.pure``).
A solo fleet has none: its engine's own inbox holds the arrivals.
"""

from __future__ import annotations

import numpy as np

from servesim.engine import kernel as K
from servesim.engine.driver import SCALAR_INDEX, Scalars, entry_point  # noqa: F401 (SCALAR_INDEX: load_index)
from servesim.jit import pure
from servesim.sched.state import ScalarsMirror, compiled_state

INF = float("inf")


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
