"""Token-length distributions in configs: one definition for every place lengths are drawn
(prompt/output in ``workload``, new input, outputs and turn counts of ``workload.sessions``).
Sampling lives in :mod:`servesim.workload.dists`."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field, model_validator

from servesim.fields import MAX_TOKENS, StrictModel, TokenCount

Frozen = StrictModel
LengthMean = Annotated[float, Field(gt=0, le=MAX_TOKENS)]


class _Bounded(Frozen):
    min: TokenCount = 1
    max: TokenCount = 1 << 20

    @model_validator(mode="after")
    def _order(self):
        if self.min > self.max:
            raise ValueError(f"min {self.min} must not exceed max {self.max}")
        return self


class FixedDist(Frozen):
    dist: Literal["fixed"]
    value: TokenCount


class NormalDist(_Bounded):
    """Normal, rounded and clipped to [min, max]."""

    dist: Literal["normal"]
    mean: LengthMean
    std: Annotated[float, Field(ge=0, le=MAX_TOKENS)]


class LognormalDist(_Bounded):
    """Lognormal with arithmetic mean ``mean`` and log-space standard deviation ``sigma``
    (mu = ln(mean) - sigma^2/2), rounded and clipped to [min, max]."""

    dist: Literal["lognormal"]
    mean: LengthMean
    sigma: Annotated[float, Field(ge=0, le=10)]  # log-space spread (real data: 0.5..2)


class UniformDist(_Bounded):
    """Integers uniform on [min, max]."""

    dist: Literal["uniform"]


class ExponentialDist(_Bounded):
    dist: Literal["exponential"]
    mean: LengthMean


class GeometricDist(_Bounded):
    """Geometric on {1, 2, ...} with the given mean (success probability 1/mean)."""

    dist: Literal["geometric"]
    mean: Annotated[float, Field(ge=1, le=MAX_TOKENS)]


LengthDist = Annotated[
    Union[FixedDist, NormalDist, LognormalDist, UniformDist, ExponentialDist, GeometricDist],
    Field(discriminator="dist"),
]
