"""Closing the waits still open when a run ends (a duration stop, Ctrl-C).

A waiting request's blockage row holds ``-K(arrival)`` (servesim/sched/state.py: the class
clocks it started from) until its admission adds ``K(admission)``; a request preempted back to
waiting holds ``-t(preemption)`` in ``PREEMPTED``; one waiting for its KV from a lower tier holds
``-t(suspension)`` in ``TIER_TRANSFER``. A request still waiting at the end was never admitted,
so its row was left open: requests.parquet showed no blocked seconds at all after seconds of
waiting. Here each open wait is closed at the run's end, as if admitted then, so the row holds
the seconds waited so far by cause (summing to end - arrival for a request never admitted).
Only requests that have not finished are touched: the summary's blockage, over finished
requests, is unchanged.
"""

from __future__ import annotations

import numpy as np

from servesim.request import WAITING
from servesim.sched.state import C_PREEMPTED, C_TIER


def _scalar(s, name: str):
    return np.asarray(getattr(s, name)).reshape(-1)[0]


def close_open_waits(st, end: float) -> int:
    """Close, at ``end``, the blockage rows of every request waiting in this engine's queues or
    fetching its KV (``st``: the engine's ReplicaState as Python sees it). Returns how many."""
    clock_t = float(_scalar(st.s, "clock_t"))
    cause_now = st.cause_now
    closed = 0
    for q in range(st.q_head.shape[0]):
        rid, left = int(st.q_head[q]), int(st.q_len[q])
        while left > 0 and rid >= 0:
            if st.status[rid] == WAITING:
                if np.isnan(st.t_sched[rid]):  # never admitted: the class clocks, as clocks_into adds them
                    g = st.klass[rid]
                    for c in range(st.K.shape[1]):
                        v = st.K[g, c]
                        if c == cause_now[g]:
                            v += end - clock_t
                        st.blocked[rid, c] += v
                else:  # preempted, waiting to resume
                    st.blocked[rid, C_PREEMPTED] += end
                closed += 1
            rid, left = int(st.q_next[rid]), left - 1
    for i in range(int(_scalar(st.s, "n_fetching"))):
        rid = int(st.fetching[i])
        # a first wait suspended for a tier fetch (sched/parts.py ready): its own clock; a
        # resumed request's wait stays charged to its preemption
        st.blocked[rid, C_TIER if st.preempt[rid] == 0 else C_PREEMPTED] += end
        closed += 1
    return closed
