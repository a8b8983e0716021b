"""Build a :class:`~servesim.request.Workload` from a scenario's ``workload`` block.

Each random source has its own named stream (see :mod:`servesim.workload.streams`), so e.g. changing
the output-length distribution does not change the arrival times.
"""

from __future__ import annotations

import numpy as np

from pathlib import Path

from servesim.request import Workload
from servesim.scenario import ClassMix, ClosedArrival, Scenario
from servesim.workload.arrivals import sample_arrivals
from servesim.workload.dists import sample_lengths
from servesim.workload.servegen import servegen_arrivals, servegen_notes
from servesim.workload.sessions import synthesize_sessions
from servesim.workload.streams import stream
from servesim.workload.trace_config import ServeGenArrivalConfig
from servesim.workload.traces import assign_classes, load_trace, sample_length_pairs


def closed_loop_capacity(sc: Scenario) -> int:
    """How many requests to pre-draw lengths for in a closed loop stopped by duration only."""
    a = sc.workload.arrival
    assert isinstance(a, ClosedArrival)
    # at most one request per client per 5 ms of simulated time (nothing serves faster)
    per_client = sc.stop.duration_s / max(a.think_s, 0.005)
    return int(min(a.clients * per_client + a.clients, 20_000_000))


def _cut(w: Workload, n: int | None, duration_s: float | None) -> Workload:
    """The first ``n`` requests arriving before ``duration_s`` (arrivals are sorted)."""
    keep = len(w)
    if duration_s is not None:
        keep = int(np.searchsorted(w.arrival_s, duration_s, side="left"))
    if n is not None:
        keep = min(keep, n)
    if keep == len(w):
        return w
    off = w.prefix_offsets
    return Workload(
        arrival_s=w.arrival_s[:keep], prompt_tokens=w.prompt_tokens[:keep], output_tokens=w.output_tokens[:keep],
        klass=w.klass[:keep], session=None if w.session is None else w.session[:keep],
        prefix_offsets=None if off is None else off[: keep + 1],
        prefix_hashes=None if off is None else w.prefix_hashes[: off[keep]],
        prefix_block_tokens=w.prefix_block_tokens,
        notes=w.notes + (f"run: first {keep:,} of {len(w):,} requests (stop condition)",),
    )


def _with(w: Workload, **changes) -> Workload:
    fields = {k: getattr(w, k) for k in ("arrival_s", "prompt_tokens", "output_tokens", "klass", "session",
                                         "prefix_offsets", "prefix_hashes", "prefix_block_tokens", "notes")}
    fields.update(changes)
    return Workload(**fields)


def generate_workload(sc: Scenario, seed: int | None = None) -> Workload:
    """Draw (or load) the requests of one simulation."""
    seed = sc.seed if seed is None else seed
    w = sc.workload
    base = Path(sc.base_dir)
    n_stop, t_stop = sc.stop.requests, sc.stop.duration_s
    rules = w.classes if not isinstance(w.classes, ClassMix) else None
    if w.trace is not None:
        return _cut(load_trace(w.trace, base, rules), n_stop, t_stop)
    notes: tuple[str, ...] = ()
    # arrivals
    if isinstance(w.arrival, ClosedArrival):
        n = n_stop if n_stop is not None else closed_loop_capacity(sc)
        arrivals = np.full(n, np.nan)
    elif isinstance(w.arrival, ServeGenArrivalConfig):
        arrivals = servegen_arrivals(w.arrival, base, stream(seed, "arrivals"), n_max=n_stop, duration_s=t_stop)
        notes += servegen_notes(w.arrival, base, arrivals)
    else:
        arrivals = sample_arrivals(w.arrival, stream(seed, "arrivals"), n_stop, t_stop)
    if w.sessions is not None:
        wl = synthesize_sessions(w.sessions, arrivals, stream(seed, "sessions"), base,
                                 max_requests=n_stop, until_s=t_stop)
        wl = _with(wl, notes=notes + wl.notes)
        if rules is not None:
            wl = _with(wl, klass=assign_classes(rules, wl.prompt_tokens, wl.output_tokens))
        elif len(w.classes.weights) > 1:
            wl = _with(wl, klass=_class_mix(w.classes, len(wl), seed))
        return wl
    n = len(arrivals)
    # lengths
    if w.lengths is not None:
        prompt, output, lnotes = sample_length_pairs(w.lengths, base, n, stream(seed, "lengths"))
        notes += lnotes
    else:
        prompt = sample_lengths(w.prompt, n, stream(seed, "prompt"))
        output = sample_lengths(w.output, n, stream(seed, "output"))
    # classes
    if rules is not None:
        klass = assign_classes(rules, prompt, output)
    else:
        klass = _class_mix(w.classes, n, seed)
    return Workload(arrival_s=arrivals, prompt_tokens=prompt.astype(np.int32), output_tokens=output.astype(np.int32),
                    klass=klass, notes=notes)


def _class_mix(mix: ClassMix, n: int, seed: int) -> np.ndarray:
    weights = np.asarray(mix.weights, dtype=np.float64)
    if len(weights) == 1:
        return np.zeros(n, dtype=np.int8)
    return stream(seed, "class").choice(len(weights), size=n, p=weights / weights.sum()).astype(np.int8)
