"""What changes during a run: arrival-rate schedules and user processes (typed, frozen; docs/processes.md).

Each runs as a SimPy process on the run's clock (servesim/engine/processes.py)::

    rate_schedule:
      steps: [{at_s: 0, factor: 1.0}, {at_s: 600, factor: 2.0}]     # piecewise constant
    rate_schedule:
      diurnal: {period_s: 86400, amplitude: 0.5, peak_s: 50400, step_s: 600}
    processes: ["mypackage.autoscale:watch"]                         # SimPy generator functions

A factor multiplies the workload's own open-loop rate from that instant on (the requests not yet
sent move in time; closed-loop clients are not moved). A diurnal curve is
``1 + amplitude * cos(2 pi (t - peak_s) / period_s)``, held constant over steps of ``step_s``
(its value at each step's middle).
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field, model_validator

from servesim.fields import Seconds, Seconds0, StrictModel

Factor = Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)]


class RateStep(StrictModel):
    at_s: Seconds0  # from this simulated second on ...
    factor: Factor  # ... open-loop arrivals come at this multiple of the workload's rate


class DiurnalConfig(StrictModel):
    period_s: Seconds = 86400.0  # one cycle (a day)
    amplitude: Annotated[float, Field(ge=0, lt=1)] = 0.5  # the factor swings 1 +- this
    peak_s: Seconds0 = 0.0  # when the factor is highest
    step_s: Seconds = 60.0  # the factor is held constant this long (its value mid-step)

    def factor(self, t: float) -> float:
        return 1.0 + self.amplitude * math.cos(2 * math.pi * (t - self.peak_s) / self.period_s)


class RateScheduleConfig(StrictModel):
    """A time-varying arrival rate: ``steps`` (piecewise constant) or a ``diurnal`` curve."""

    steps: Annotated[list[RateStep], Field(min_length=1, max_length=100_000)] | None = None  # piecewise constant
    diurnal: DiurnalConfig | None = None  # a cosine over a period

    @model_validator(mode="after")
    def _one(self) -> "RateScheduleConfig":
        if (self.steps is None) == (self.diurnal is None):
            raise ValueError("rate_schedule: give either steps or diurnal (one of the two)")
        return self


ProcessPath = Annotated[str, Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", max_length=300)]


class AutoscaleConfig(StrictModel):
    """``cluster.autoscale``: keep the per-replica ``metric`` near ``target`` by starting and
    stopping replicas, as Kubernetes' horizontal autoscaler does: every ``interval_s`` the wanted
    count is ``ceil(serving * value / target)`` within ``[min_replicas, the fleet's replicas]``.
    A started replica takes requests ``scale_up_delay_s`` later (the model loads); a stopped one
    is drained and released once it holds no request. Decisions are at least ``cooldown_s``
    apart. The fleet's ``hardware.replicas`` (or groups) are the slots; ``initial_replicas`` of
    them (default ``min_replicas``) serve from the start."""

    metric: Literal["waiting", "outstanding", "running", "kv_used"] = "outstanding"  # per serving replica
    target: Annotated[float, Field(gt=0, le=1e9, allow_inf_nan=False)] = 8.0  # the metric's wanted value
    min_replicas: Annotated[int, Field(ge=1, le=4096)] = 1
    initial_replicas: Annotated[int, Field(ge=1, le=4096)] | None = None  # default: min_replicas
    interval_s: Seconds = 10.0  # how often the autoscaler looks
    scale_up_delay_s: Seconds0 = 60.0  # a started replica loads the model this long before it serves
    cooldown_s: Seconds0 = 60.0  # at least this long between two decisions

    @model_validator(mode="after")
    def _initial(self) -> "AutoscaleConfig":
        if self.initial_replicas is not None and self.initial_replicas < self.min_replicas:
            raise ValueError(f"cluster.autoscale.initial_replicas {self.initial_replicas} is below min_replicas "
                             f"{self.min_replicas}")
        return self

    @property
    def initial(self) -> int:
        return self.initial_replicas if self.initial_replicas is not None else self.min_replicas


class FaultEvent(StrictModel):
    replica: Annotated[int, Field(ge=0, le=4095)]  # which replica fails ...
    at_s: Seconds0  # ... at this simulated second ...
    down_s: Seconds0 = 300.0  # ... and serves again this long after (repaired, model reloaded)


class FaultsConfig(StrictModel):
    """``cluster.faults``: replicas fail -- at random (``mtbf_s``: each replica's time to failure
    is exponential with this mean, from the run's ``faults`` random stream) or on a
    ``schedule`` -- and come back ``mttr_s`` (or the event's ``down_s``) later, empty. What a
    failed replica held is retried through the router (``on_failure: retry``) or lost
    (``lost``: rejected with reason ``replica_failed``); its KV cache is lost either way."""

    mtbf_s: Seconds | None = None  # mean time between failures of one replica
    mttr_s: Seconds0 = 300.0  # time to repair: down this long after each random failure
    schedule: Annotated[list[FaultEvent], Field(min_length=1, max_length=100_000)] | None = None
    on_failure: Literal["retry", "lost"] = "retry"  # what happens to the requests a failed replica held

    @model_validator(mode="after")
    def _some(self) -> "FaultsConfig":
        if self.mtbf_s is None and self.schedule is None:
            raise ValueError("cluster.faults: give mtbf_s (random failures) or a schedule (or both)")
        return self
