"""Closed loops: how many requests a closed loop of clients pre-draws, their think times and
ramp-up starts (read by the single-stream workload, :mod:`servesim.workload.generate`, and the
stream mix, :mod:`servesim.workload.mix`)."""

from __future__ import annotations

import numpy as np

from servesim.errors import ScenarioError
from servesim.config.arrivals import ClosedArrival


FASTEST_REQUEST_S = 0.005  # a request's shortest service when the caller knows none (see below)
MAX_CLOSED_ROWS = 20_000_000  # requests a closed loop stopped by duration alone may pre-draw


def closed_loop_capacity(a: ClosedArrival, duration_s: float, fastest_s: float = FASTEST_REQUEST_S) -> int:
    """How many requests to pre-draw in a closed loop stopped by duration only: more than its
    clients can send. A client's requests follow one another, each taking at least ``fastest_s``
    (one iteration: the simulation passes its step-time model's cheapest) plus a think time of
    mean ``think_s``; a renewal count's spread (6 sigma) covers exponential think times. Too many
    to draw: a one-line error (running dry would end the load early without a word)."""
    per_client = duration_s / (a.think_s + fastest_s)
    n = int(a.clients * (per_client + 6.0 * per_client ** 0.5 + 2.0))
    if n > MAX_CLOSED_ROWS:
        raise ScenarioError(
            f"workload.arrival: a closed loop of {a.clients:,} clients over stop.duration_s {duration_s:g} s could "
            f"send about {n:,} requests (think_s {a.think_s:g}, the fastest request {fastest_s * 1e3:.3g} ms), more "
            f"than the {MAX_CLOSED_ROWS:,} servesim draws up front; set stop.requests (the run ends at whichever "
            f"limit comes first) or a shorter stop.duration_s")
    return n


def closed_rows(a: ClosedArrival, max_requests: int | None, duration_s: float | None,
                fastest_s: float = FASTEST_REQUEST_S) -> int:
    if max_requests is not None:
        return max_requests
    return closed_loop_capacity(a, duration_s, fastest_s)  # type: ignore[arg-type]


def think_times(a: ClosedArrival, n: int, rng: np.random.Generator) -> np.ndarray:
    """Think time after each of ``n`` requests (drawn up front, as the engine's inbox does)."""
    if a.think_dist == "exponential" and a.think_s > 0:
        return rng.exponential(a.think_s, n)
    return np.full(n, float(a.think_s))


def ramp_starts(a: ClosedArrival) -> np.ndarray:
    """Client ``c`` sends its first request at ``c * ramp_up_s / clients``."""
    return np.arange(a.clients, dtype=np.float64) * (a.ramp_up_s / a.clients)
