"""Build a :class:`~servesim.request.Workload` from a ``workload`` block (a WorkloadConfig).

Each random source has its own named stream (see :mod:`servesim.workload.streams`), so e.g. changing
the output-length distribution does not change the arrival times. The single-stream form draws
from the names it always used (``arrivals``, ``prompt``, ...), so its results never change;
``workload.streams`` are built by :mod:`servesim.workload.mix`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from servesim.request import ClosedGroup, Workload
from servesim.workload.arrival_config import ClosedArrival, scaled
from servesim.workload.arrivals import sample_arrivals
from servesim.workload.contaminate import contaminate
from servesim.workload.dists import sample_lengths
from servesim.workload.servegen import servegen_arrivals, servegen_notes
from servesim.workload.sessions import synthesize_sessions
from servesim.workload.stream_config import ClassMix, WorkloadConfig
from servesim.workload.streams import stream
from servesim.workload.trace_config import ServeGenArrivalConfig
from servesim.workload.traces import assign_classes, load_trace, sample_length_pairs


def closed_loop_capacity(a: ClosedArrival, duration_s: float) -> int:
    """How many requests to pre-draw lengths for in a closed loop stopped by duration only."""
    # at most one request per client per 5 ms of simulated time (nothing serves faster)
    per_client = duration_s / max(a.think_s, 0.005)
    return int(min(a.clients * per_client + a.clients, 20_000_000))


def closed_rows(a: ClosedArrival, max_requests: int | None, duration_s: float | None) -> int:
    return max_requests if max_requests is not None else closed_loop_capacity(a, duration_s)  # type: ignore[arg-type]


def think_times(a: ClosedArrival, n: int, rng: np.random.Generator) -> np.ndarray:
    """Think time after each of ``n`` requests (drawn up front, as the engine's inbox does)."""
    if a.think_dist == "exponential" and a.think_s > 0:
        return rng.exponential(a.think_s, n)
    return np.full(n, float(a.think_s))


def ramp_starts(a: ClosedArrival) -> np.ndarray:
    """Client ``c`` sends its first request at ``c * ramp_up_s / clients``."""
    return np.arange(a.clients, dtype=np.float64) * (a.ramp_up_s / a.clients)


def cut(w: Workload, n: int | None, duration_s: float | None) -> Workload:
    """The first ``n`` requests arriving before ``duration_s`` (arrivals are sorted)."""
    keep = len(w)
    if duration_s is not None:
        keep = int(np.searchsorted(w.arrival_s, duration_s, side="left"))
    if n is not None:
        keep = min(keep, n)
    if keep == len(w):
        return w
    return dataclasses.replace(
        take_rows(w, slice(0, keep)),
        notes=w.notes + (f"run: first {keep:,} of {len(w):,} requests (stop condition)",))


def take_rows(w: Workload, rows: slice) -> Workload:
    """Rows ``rows`` (a slice from 0) of every column, prefix chains included."""
    keep = rows.stop
    off = w.prefix_offsets
    return dataclasses.replace(
        w, arrival_s=w.arrival_s[:keep], prompt_tokens=w.prompt_tokens[:keep], output_tokens=w.output_tokens[:keep],
        klass=w.klass[:keep], session=None if w.session is None else w.session[:keep], stream=w.stream[:keep],
        prefix_offsets=None if off is None else off[: keep + 1],
        prefix_hashes=None if off is None else w.prefix_hashes[: off[keep]])


def generate_workload(wc: WorkloadConfig, *, seed: int, base_dir: str | Path = ".",
                      max_requests: int | None = None, duration_s: float | None = None) -> Workload:
    """Draw (or load) the requests of one simulation: at most ``max_requests`` arriving before
    ``duration_s`` (the scenario's stop condition; relative file paths resolve against
    ``base_dir``)."""
    if wc.streams is not None:
        from servesim.workload.mix import generate_streams

        return generate_streams(wc, seed=seed, base_dir=Path(base_dir), max_requests=max_requests,
                                duration_s=duration_s)
    w = _single_stream(wc, seed, Path(base_dir), max_requests, duration_s)
    if wc.contaminate is not None:
        w = contaminate(w, np.ones(len(w), dtype=bool), wc.contaminate, wc.stream_specs(),
                        stream(seed, "contaminate"))
    return w


def _single_stream(w: WorkloadConfig, seed: int, base: Path, n_stop: int | None, t_stop: float | None) -> Workload:
    rules = w.classes if not isinstance(w.classes, ClassMix) else None
    if w.trace is not None:
        trace = w.trace
        if w.rate_scale != 1.0:
            trace = trace.model_copy(update={"rate_scale": trace.rate_scale * w.rate_scale})
        return cut(load_trace(trace, base, rules), n_stop, t_stop)
    notes: tuple[str, ...] = ()
    arrival = scaled(w.arrival, w.rate_scale)
    groups: tuple[ClosedGroup, ...] = ()
    # arrivals
    if isinstance(arrival, ClosedArrival):
        n = closed_rows(arrival, n_stop, t_stop)
        arrivals = np.full(n, np.nan)
        if arrival.ramp_up_s > 0:  # the engine's own closed loop starts every client at 0
            groups = (ClosedGroup(0, n, arrival.clients, ramp_starts(arrival),
                                  think_times(arrival, n, stream(seed, "think"))),)
    elif isinstance(arrival, ServeGenArrivalConfig):
        arrivals = servegen_arrivals(arrival, base, stream(seed, "arrivals"), n_max=n_stop, duration_s=t_stop)
        notes += servegen_notes(arrival, base, arrivals)
    else:
        arrivals = sample_arrivals(arrival, stream(seed, "arrivals"), n_stop, t_stop)
    if w.rate_scale != 1.0:
        notes += (f"workload.rate_scale {w.rate_scale:g}: arrival rates multiplied",)
    if w.sessions is not None:
        wl = synthesize_sessions(w.sessions, arrivals, stream(seed, "sessions"), base,
                                 max_requests=n_stop, until_s=t_stop)
        wl = dataclasses.replace(wl, notes=notes + wl.notes)
        if rules is not None:
            wl = dataclasses.replace(wl, klass=assign_classes(rules, wl.prompt_tokens, wl.output_tokens))
        elif len(w.classes.weights) > 1:
            wl = dataclasses.replace(wl, klass=class_mix(w.classes, len(wl), seed))
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
        klass = class_mix(w.classes, n, seed)
    return Workload(arrival_s=arrivals, prompt_tokens=prompt.astype(np.int32), output_tokens=output.astype(np.int32),
                    klass=klass, notes=notes, closed_groups=groups)


def class_mix(mix: ClassMix, n: int, seed: int) -> np.ndarray:
    weights = np.asarray(mix.weights, dtype=np.float64)
    if len(weights) == 1:
        return np.zeros(n, dtype=np.int8)
    return stream(seed, "class").choice(len(weights), size=n, p=weights / weights.sum()).astype(np.int8)
