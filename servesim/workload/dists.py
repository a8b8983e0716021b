"""Token-length distributions, vectorized.

All samples are integers clipped to the distribution's ``[min, max]`` (and at least 1): a request
has at least one prompt token and produces at least one output token.
"""

from __future__ import annotations

import numpy as np

from servesim.config.dists import (
    ExponentialDist,
    FixedDist,
    GeometricDist,
    LognormalDist,
    NormalDist,
    UniformDist,
)


def sample_lengths(cfg, n: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(cfg, FixedDist):
        return np.full(n, cfg.value, dtype=np.int64)
    if isinstance(cfg, NormalDist):
        x = rng.normal(cfg.mean, cfg.std, n)
    elif isinstance(cfg, LognormalDist):
        mu = np.log(cfg.mean) - 0.5 * cfg.sigma**2
        x = rng.lognormal(mu, cfg.sigma, n)
    elif isinstance(cfg, UniformDist):
        return rng.integers(cfg.min, cfg.max + 1, n, dtype=np.int64)
    elif isinstance(cfg, ExponentialDist):
        x = rng.exponential(cfg.mean, n)
    elif isinstance(cfg, GeometricDist):
        x = rng.geometric(1.0 / cfg.mean, n).astype(np.float64)
    else:  # pragma: no cover - the scenario union is closed
        raise TypeError(f"unknown length distribution {cfg!r}")
    lo = max(1, cfg.min)
    return np.clip(np.rint(x), lo, cfg.max).astype(np.int64)


def mean_length(cfg) -> float:
    """Mean before clipping, for capacity estimates in headers."""
    if isinstance(cfg, FixedDist):
        return float(cfg.value)
    if isinstance(cfg, UniformDist):
        return (cfg.min + cfg.max) / 2
    return float(cfg.mean)
