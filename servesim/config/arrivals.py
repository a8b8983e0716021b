"""Arrival processes in configs: open loop (Poisson, gamma, constant) and closed loop.

Plain, frozen, validated data; sampling lives in :mod:`servesim.workload.arrivals`, the closed
loop's run-time part in :mod:`servesim.engine.inbox`. ServeGen fits
(:class:`~servesim.config.traces.ServeGenArrivalConfig`) are the fifth process.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field

from servesim.fields import Rate, StrictModel
from servesim.fields import Seconds0 as Seconds
from servesim.config.traces import ServeGenArrivalConfig

# finite, bounded numbers only (servesim.fields): an infinite rate or think time is a typo, never a workload
Frozen = StrictModel


class PoissonArrival(Frozen):
    process: Literal["poisson"]
    rate: Rate


class GammaArrival(Frozen):
    """Gamma inter-arrival times with mean 1/rate and coefficient of variation ``cv`` (cv=1 is
    Poisson, cv>1 bursty)."""

    process: Literal["gamma"]
    rate: Rate
    cv: Annotated[float, Field(ge=1e-3, le=1e3)] = 1.0  # shape 1/cv^2 within [1e-6, 1e6]


class ConstantArrival(Frozen):
    process: Literal["constant"]
    rate: Rate


class ClosedArrival(Frozen):
    """Closed loop: ``clients`` users, each sends a request, waits for its last token, thinks for
    ``think_s`` seconds (exponential with that mean when ``think_dist: exponential``), repeats.

    ``ramp_up_s`` spreads the clients' first requests evenly over that window (client ``c`` starts
    at ``c * ramp_up_s / clients``), so clients with fixed lengths do not all march in lockstep."""

    process: Literal["closed"]
    clients: Annotated[int, Field(ge=1, le=1_000_000, strict=True)]
    think_s: Seconds = 0.0
    think_dist: Literal["fixed", "exponential"] = "fixed"
    ramp_up_s: Seconds = 0.0


OPEN_LOOP = (PoissonArrival, GammaArrival, ConstantArrival)

ArrivalConfig = Annotated[
    Union[PoissonArrival, GammaArrival, ConstantArrival, ClosedArrival, ServeGenArrivalConfig],
    Field(discriminator="process"),
]


def scaled(cfg, factor: float):
    """The same process with every rate multiplied by ``factor`` (``workload.rate_scale``).
    Closed loops have no rate and are returned unchanged; ServeGen fits multiply their own
    ``rate_scale``. ``factor == 1`` returns ``cfg`` itself, so results stay bit-identical."""
    if factor == 1.0 or isinstance(cfg, ClosedArrival):
        return cfg
    if isinstance(cfg, ServeGenArrivalConfig):
        return cfg.model_copy(update={"rate_scale": cfg.rate_scale * factor})
    return cfg.model_copy(update={"rate": cfg.rate * factor})
