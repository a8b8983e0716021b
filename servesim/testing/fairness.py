"""Starvation: every class is served within a stated wait, under a stated load.

No scheduler can promise a bounded wait at any load (overload queues grow without bound, FCFS
included), so this invariant takes the bound from you, for the scenario you state it for: "at
70 % load, no request of any class waits more than 5 s for its first scheduling". A policy that
starves a class -- admits P0..P3 ahead of P4 forever, or ages too slowly to matter at that load
-- breaks it, where every other invariant holds (its requests are conserved, just never run).

    from servesim.testing import check_bounded_wait, check_run
    checked = check_run(raw, max_wait_s=5.0)          # with every other invariant
    check_bounded_wait(result, max_wait_s=5.0)        # on a finished run

The wait of a request is arrival to first scheduling; a request still waiting at the end has
waited at least until then (it counts, with that lower bound). Rejected requests never wait (they
end at arrival) and requests that had not arrived are left out.
"""

from __future__ import annotations

import math

import numpy as np

from servesim.request import CLASS_NAMES, PENDING, REJECTED
from servesim.testing.invariants import InvariantViolation


def waits_by_class(result) -> dict[str, float]:
    """The longest wait for a first scheduling, per SLA class present (seconds; a request never
    scheduled counts from its arrival to the run's end)."""
    t = result.table
    end = float(result.summary.get("sim_time_s") or 0.0)
    arrived = np.isfinite(t.arrival) & (t.arrival <= end) & (t.status != REJECTED) & (t.status != PENDING)
    first = np.where(np.isnan(t.t_first_sched), end, t.t_first_sched)
    wait = np.where(arrived, first - t.arrival, np.nan)
    out: dict[str, float] = {}
    for c in np.unique(t.klass[arrived]):
        out[CLASS_NAMES[int(c)]] = float(np.nanmax(wait[arrived & (t.klass == c)]))
    return out


def check_bounded_wait(result, max_wait_s: float) -> dict[str, float]:
    """bounded_wait: no arrived request of any class waited more than ``max_wait_s`` for its
    first scheduling (see the module docstring). Returns the longest wait per class."""
    if not (isinstance(max_wait_s, (int, float)) and math.isfinite(max_wait_s) and max_wait_s > 0):
        raise ValueError(f"max_wait_s {max_wait_s!r}: a bound in seconds > 0")
    t = result.table
    worst = waits_by_class(result)
    for label, w in worst.items():
        if w > max_wait_s:
            end = float(result.summary.get("sim_time_s") or 0.0)
            c = CLASS_NAMES.index(label)
            first = np.where(np.isnan(t.t_first_sched), end, t.t_first_sched)
            mine = np.flatnonzero((t.klass == c) & np.isfinite(t.arrival) & (t.arrival <= end)
                                  & (t.status != REJECTED) & (t.status != PENDING))
            rid = int(mine[np.argmax(first[mine] - t.arrival[mine])])
            never = " (never scheduled: counted to the run's end)" if np.isnan(t.t_first_sched[rid]) else ""
            shown = ", ".join(f"{k} {v:.3g} s" for k, v in worst.items())
            raise InvariantViolation("bounded_wait", f"class {label} request {rid} waited {w:.6g} s for its first "
                                                     f"scheduling{never}, over the stated bound {max_wait_s:g} s "
                                                     f"(longest wait per class: {shown})")
    return worst
