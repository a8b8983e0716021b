"""The one way searches change how much traffic arrives: ``workload.rate_scale``.

``scale_rate(sc, 2.0)`` is the scenario with ``workload.rate_scale`` doubled: every open-loop
arrival rate of every stream twice as high (Poisson, gamma and constant rates, ServeGen fits,
trace replays, session starts; docs/scenario.md). Closed loops keep their clients; a workload of
closed loops only has no rate to scale, and the scenario's validation says so.

A run stopped by ``stop.duration_s`` alone has a warm-up of ``stop.warmup_requests`` requests,
which is meant as a stretch of simulated time (the empty-system transient): at half the rate the
same count would cover twice the time, and at a small enough scale every request of the run
(nothing measured, every SLO "failed"). So such a warm-up is scaled with the rate, keeping the
time it covers. A run of ``stop.requests`` keeps its counts: its rate changes, not its size.
"""

from __future__ import annotations

import math

from servesim.errors import ScenarioError
from servesim.scenario import ClosedArrival, Scenario


def base_rate(sc: Scenario) -> float | None:
    """Open-loop requests (or session starts) per second of ``sc`` as configured (its
    ``rate_scale`` included), when every open-loop source states a rate; None when one does not
    (a trace replay, ServeGen fits)."""
    w = sc.workload

    def rate_of(arr) -> float | None:
        if isinstance(arr, ClosedArrival):
            return 0.0
        r = getattr(arr, "rate", None)
        return float(r) if isinstance(r, (int, float)) else None

    if w.streams is None:
        if w.trace is not None:
            return None
        r = rate_of(w.arrival)
        return None if r is None or r == 0.0 else r * w.rate_scale
    total = 0.0
    if any(s.share is not None for s in w.streams):
        r = rate_of(w.arrival)
        if r is None:
            return None
        total += r
    for s in w.streams:
        if s.trace is not None:
            return None
        if s.arrival is not None:
            r = rate_of(s.arrival)
            if r is None:
                return None
            total += r
    return total * w.rate_scale if total > 0 else None


def scale_rate(sc: Scenario, factor: float) -> Scenario:
    if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 0):
        raise ScenarioError(f"rate scale {factor!r}: must be a finite number > 0")
    if not sc.workload.has_open_loop():
        raise ScenarioError("workload: every arrival process is a closed loop, which has no rate to scale "
                            "(its load follows from clients and think_s); sweep over the clients instead")
    update: dict = {"workload.rate_scale": sc.workload.rate_scale * factor}
    if sc.stop.requests is None and sc.stop.warmup_requests:
        update["stop.warmup_requests"] = int(round(sc.stop.warmup_requests * factor))
    return sc.override(update, source="rate scale")
