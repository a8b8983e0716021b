"""The one way searches change how much traffic arrives: a rate scale.

``scale_rate(sc, 2.0)`` is the scenario with twice the request rate, whatever the workload:

    poisson / gamma / constant arrivals   workload.arrival.rate x factor
    trace replay                          workload.trace.rate_scale x factor (gaps divided)
    ServeGen fits                         workload.arrival.rate_scale x factor
    sessions                              their start rate (workload.arrival) x factor
    closed loop                           refused: its rate follows from clients and think time

Every capacity search goes through this function, so when workloads grow a single
``workload.rate_scale`` (every stream's rate at once), only this module changes.
"""

from __future__ import annotations

import math

from servesim.errors import ScenarioError
from servesim.scenario import ClosedArrival, Scenario


def base_rate(sc: Scenario) -> float | None:
    """Requests (or sessions) per second at scale 1, when the scenario states one."""
    rate = getattr(sc.workload.arrival, "rate", None)
    return float(rate) if sc.workload.trace is None and rate is not None else None


def scale_rate(sc: Scenario, factor: float) -> Scenario:
    if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 0):
        raise ScenarioError(f"rate scale {factor!r}: must be a finite number > 0")
    w = sc.workload
    if w.trace is not None:
        return sc.override({"workload.trace.rate_scale": w.trace.rate_scale * factor}, source="rate scale")
    arr = w.arrival
    if isinstance(arr, ClosedArrival):
        raise ScenarioError("workload.arrival.process = 'closed': a closed loop has no arrival rate to scale "
                            "(its rate follows from clients and think_s); search over workload.arrival.clients "
                            "with a sweep instead")
    if getattr(arr, "process", None) == "servegen":
        return sc.override({"workload.arrival.rate_scale": arr.rate_scale * factor}, source="rate scale")
    return sc.override({"workload.arrival.rate": arr.rate * factor}, source="rate scale")
