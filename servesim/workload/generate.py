"""Build a :class:`~servesim.request.Workload` from a scenario's ``workload`` block.

Each random source has its own named stream (see :mod:`servesim.workload.streams`), so e.g. changing
the output-length distribution does not change the arrival times.
"""

from __future__ import annotations

import numpy as np

from servesim.request import Workload
from servesim.scenario import ClosedArrival, Scenario
from servesim.workload.arrivals import sample_arrivals
from servesim.workload.dists import sample_lengths
from servesim.workload.streams import stream


def closed_loop_capacity(sc: Scenario) -> int:
    """How many requests to pre-draw lengths for in a closed loop stopped by duration only."""
    a = sc.workload.arrival
    assert isinstance(a, ClosedArrival)
    # at most one request per client per 5 ms of simulated time (nothing serves faster)
    per_client = sc.stop.duration_s / max(a.think_s, 0.005)
    return int(min(a.clients * per_client + a.clients, 20_000_000))


def generate_workload(sc: Scenario, seed: int | None = None) -> Workload:
    seed = sc.seed if seed is None else seed
    w = sc.workload
    if isinstance(w.arrival, ClosedArrival):
        n = sc.stop.requests if sc.stop.requests is not None else closed_loop_capacity(sc)
        arrivals = np.full(n, np.nan)
    else:
        arrivals = sample_arrivals(w.arrival, stream(seed, "arrivals"), sc.stop.requests, sc.stop.duration_s)
        n = len(arrivals)
    prompt = sample_lengths(w.prompt, n, stream(seed, "prompt"))
    output = sample_lengths(w.output, n, stream(seed, "output"))
    weights = np.asarray(w.classes.weights, dtype=np.float64)
    if len(weights) == 1:
        klass = np.zeros(n, dtype=np.int8)
    else:
        klass = stream(seed, "class").choice(len(weights), size=n, p=weights / weights.sum()).astype(np.int8)
    return Workload(arrival_s=arrivals, prompt_tokens=prompt, output_tokens=output, klass=klass)
