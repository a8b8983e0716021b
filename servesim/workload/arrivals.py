"""Open-loop arrival processes: absolute arrival times, vectorized."""

from __future__ import annotations

import numpy as np

from servesim.config.arrivals import ConstantArrival, GammaArrival, PoissonArrival


def _gaps(cfg, n: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(cfg, PoissonArrival):
        return rng.exponential(1.0 / cfg.rate, n)
    if isinstance(cfg, GammaArrival):
        shape = 1.0 / cfg.cv**2
        return rng.gamma(shape, 1.0 / (cfg.rate * shape), n)
    if isinstance(cfg, ConstantArrival):
        return np.full(n, 1.0 / cfg.rate)
    raise TypeError(f"not an open-loop arrival process: {cfg!r}")  # pragma: no cover


def sample_arrivals(cfg, rng: np.random.Generator, n: int | None, duration_s: float | None) -> np.ndarray:
    """Arrival times of at most ``n`` requests, all before ``duration_s`` (either may be None).

    The first request arrives after one gap (a Poisson process started at 0), except for the
    constant process, whose first request arrives at 0.
    """
    if n is None and duration_s is None:
        raise ValueError("need n or duration_s")
    if n is not None:
        gaps = _gaps(cfg, n, rng)
        times = np.cumsum(gaps)
    else:
        expected = cfg.rate * duration_s
        chunk = int(expected + 10 * np.sqrt(expected) + 16)
        parts = [np.cumsum(_gaps(cfg, chunk, rng))]
        while parts[-1][-1] < duration_s:
            parts.append(parts[-1][-1] + np.cumsum(_gaps(cfg, chunk, rng)))
        times = np.concatenate(parts)
    if isinstance(cfg, ConstantArrival):
        times = times - times[0] if len(times) else times
    if duration_s is not None:
        times = times[times < duration_s]
    return times
