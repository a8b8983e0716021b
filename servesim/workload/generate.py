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
from servesim.config.arrivals import ClosedArrival, GammaArrival, scaled
from servesim.workload.arrivals import sample_arrivals
from servesim.workload.closed import FASTEST_REQUEST_S, closed_rows, ramp_starts, think_times
from servesim.workload.contaminate import contaminate
from servesim.workload.cut import cut
from servesim.workload.dists import sample_lengths
from servesim.workload.mix import generate_streams
from servesim.workload.servegen import servegen_arrivals, servegen_notes
from servesim.workload.sessions import topped_up_sessions
from servesim.config.streams import ClassMix, WorkloadConfig
from servesim.workload.streams import stream
from servesim.config.traces import ServeGenArrivalConfig
from servesim.workload.traces import assign_classes, load_trace, sample_length_pairs


def generate_workload(wc: WorkloadConfig, *, seed: int, base_dir: str | Path = ".",
                      max_requests: int | None = None, duration_s: float | None = None,
                      fastest_request_s: float = FASTEST_REQUEST_S) -> Workload:
    """Draw (or load) the requests of one simulation: at most ``max_requests`` arriving before
    ``duration_s`` (the scenario's stop condition; relative file paths resolve against
    ``base_dir``). ``fastest_request_s``: the shortest time a request can take (closed loops
    stopped by duration alone draw enough requests for it: :func:`servesim.workload.closed.closed_loop_capacity`)."""
    if wc.streams is not None:
        return generate_streams(wc, seed=seed, base_dir=Path(base_dir), max_requests=max_requests,
                                duration_s=duration_s, fastest_s=fastest_request_s)
    w = _single_stream(wc, seed, Path(base_dir), max_requests, duration_s, fastest_request_s)
    if wc.contaminate is not None:
        w = contaminate(w, np.ones(len(w), dtype=bool), wc.contaminate, wc.stream_specs(),
                        stream(seed, "contaminate"))
    return w


def _single_stream(w: WorkloadConfig, seed: int, base: Path, n_stop: int | None, t_stop: float | None,
                   fastest_s: float = FASTEST_REQUEST_S) -> Workload:
    rules = w.classes if not isinstance(w.classes, ClassMix) else None
    if w.trace is not None:
        trace = w.trace
        if w.rate_scale != 1.0:
            trace = trace.model_copy(update={"rate_scale": trace.rate_scale * w.rate_scale})
        wl = load_trace(trace, base, rules)
        if rules is None and len(w.classes.weights) > 1:  # a class mix over the replayed rows (it was ignored)
            wl = dataclasses.replace(wl, klass=class_mix(w.classes, len(wl), seed))
        return cut(wl, n_stop, t_stop)
    notes: tuple[str, ...] = ()
    arrival = scaled(w.arrival, w.rate_scale)
    scale_note = (f"workload.rate_scale {w.rate_scale:g}: arrival rates multiplied",) if w.rate_scale != 1.0 else ()
    if w.sessions is not None:
        wl = _sessions(w, arrival, seed, base, n_stop, t_stop, scale_note)
        if rules is not None:
            wl = dataclasses.replace(wl, klass=assign_classes(rules, wl.prompt_tokens, wl.output_tokens))
        elif len(w.classes.weights) > 1:
            wl = dataclasses.replace(wl, klass=class_mix(w.classes, len(wl), seed))
        return wl
    groups: tuple[ClosedGroup, ...] = ()
    # arrivals
    if isinstance(arrival, ClosedArrival):
        n = closed_rows(arrival, n_stop, t_stop, fastest_s)
        arrivals = np.full(n, np.nan)
        if arrival.ramp_up_s > 0:  # the engine's own closed loop starts every client at 0
            groups = (ClosedGroup(0, n, arrival.clients, ramp_starts(arrival),
                                  think_times(arrival, n, stream(seed, "think"))),)
    else:
        arrivals, anotes = _open_arrivals(arrival, seed, base, n_stop, t_stop)
        notes += anotes
    notes += scale_note
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


def _open_arrivals(arrival, seed: int, base: Path, n: int | None,
                   t_stop: float | None) -> tuple[np.ndarray, tuple[str, ...]]:
    """At most ``n`` open-loop arrival times before ``t_stop``, and header notes."""
    if isinstance(arrival, ServeGenArrivalConfig):
        arrivals = servegen_arrivals(arrival, base, stream(seed, "arrivals"), n_max=n, duration_s=t_stop)
        return arrivals, servegen_notes(arrival, base, arrivals)
    arrivals = sample_arrivals(arrival, stream(seed, "arrivals"), n, t_stop)
    return arrivals, realised_rate_note(arrival, arrivals)


def realised_rate_note(arrival, arrivals: np.ndarray) -> tuple[str, ...]:
    """A bursty gamma process's mean gap is 1/rate, but over N gaps its relative error is about
    cv/sqrt(N): at cv 1000 a 10,000-request run's rate is decided by a handful of huge gaps and
    has nothing to do with ``rate``. Say so, with the rate the run actually got, when the process
    is burstier than Poisson and that error exceeds 25 %."""
    if not isinstance(arrival, GammaArrival) or arrival.cv <= 1 or len(arrivals) < 2:
        return ()
    if arrival.cv / np.sqrt(len(arrivals)) <= 0.25:
        return ()
    span = float(arrivals[-1])
    got = f"{len(arrivals) / span:.4g} req/s" if span > 0 else "once (every arrival at time 0: gaps underflow)"
    return (f"warning: gamma cv {arrival.cv:g} over {len(arrivals):,} requests: the arrivals came at {got} "
            f"against rate {arrival.rate:g} req/s (the rate is only reached over about 100 x cv^2 = "
            f"{min(100 * arrival.cv ** 2, 1e12):,.0f} requests; a run's rate here is set by a few long gaps)",)


def _sessions(w: WorkloadConfig, arrival, seed: int, base: Path, n_stop: int | None, t_stop: float | None,
              scale_note: tuple[str, ...]) -> Workload:
    """Multi-turn sessions started by the (open-loop) arrival process, until ``stop.requests``
    turns are delivered (or ``stop.duration_s`` binds). A session can give fewer turns than one
    request each (``max_context_tokens`` drops the turns over it, a whole session when its first
    turn is over), so more sessions are drawn until the count is reached; when no number of
    sessions can reach it, one line says why. Every draw restarts the same random streams, so more
    sessions extend the same run."""
    wl, notes = topped_up_sessions(w.sessions, lambda m: _open_arrivals(arrival, seed, base, m, t_stop),
                                   lambda: stream(seed, "sessions"), base, n_stop, t_stop, "workload.sessions")
    return dataclasses.replace(wl, notes=notes + scale_note + wl.notes)


def class_mix(mix: ClassMix, n: int, seed: int) -> np.ndarray:
    weights = np.asarray(mix.weights, dtype=np.float64)
    if len(weights) == 1:
        return np.zeros(n, dtype=np.int8)
    return stream(seed, "class").choice(len(weights), size=n, p=weights / weights.sum()).astype(np.int8)
