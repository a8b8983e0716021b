"""The one way searches change how much traffic arrives: ``workload.rate_scale``.

``scale_rate(sc, 2.0)`` is the scenario with ``workload.rate_scale`` doubled: every open-loop
arrival rate of every stream twice as high (Poisson, gamma and constant rates, ServeGen fits,
trace replays, session starts; docs/scenario.md). Closed loops keep their clients; a workload of
closed loops only has no rate to scale, and the scenario's validation says so.

What the scale multiplies is not always a request rate: a sessions workload's arrival process
starts sessions (of several turns each), a closed loop's requests follow from latency, a trace
states no single rate. ``request_rate`` is the request rate only when the configuration says it
exactly; otherwise searches report the request rate measured in their runs
(``measured_req_per_s``) and say what the scale moved (``scaled_rates``), never a session rate
labelled as requests.

A run stopped by ``stop.duration_s`` alone has a warm-up of ``stop.warmup_requests`` requests,
which is meant as a stretch of simulated time (the empty-system transient): at half the rate the
same count would cover twice the time, and at a small enough scale every request of the run
(nothing measured, every SLO "failed"). So such a warm-up is scaled with the rate, keeping the
time it covers. A run of ``stop.requests`` keeps its counts: its rate changes, not its size.
"""

from __future__ import annotations

import math

import numpy as np

from servesim.errors import ScenarioError
from servesim.scenario import ClosedArrival, Scenario


def _sources(sc: Scenario) -> tuple[list[tuple[float | None, str]], int]:
    """What ``workload.rate_scale`` moves: ``(per second before the scale, unit)`` of each
    open-loop source (``"req/s"``, or ``"session starts/s"`` for sessions: a start is one
    session, not one request; ``None`` per second for a trace replay or ServeGen fits, which state
    no single rate), and the number of closed loops (their requests follow from latency)."""
    w = sc.workload
    out: list[tuple[float | None, str]] = []

    def add(arr, sessions) -> None:
        r = getattr(arr, "rate", None)
        out.append((float(r) if isinstance(r, (int, float)) else None,
                    "session starts/s" if sessions is not None else "req/s"))

    if w.streams is None:
        if w.trace is not None:
            out.append((None, "req/s"))
        elif not isinstance(w.arrival, ClosedArrival):
            add(w.arrival, w.sessions)
        return out, len(w.closed_loops())
    shared = [s for s in w.streams if s.share is not None]
    if shared and not isinstance(w.arrival, ClosedArrival):
        # one process split between streams: a request or a session start, by the stream it lands in
        if any(s.sessions is not None for s in shared):
            r = getattr(w.arrival, "rate", None)
            out.append((float(r) if isinstance(r, (int, float)) else None, "arrivals/s (requests and session starts)"))
        else:
            add(w.arrival, None)
    for s in w.streams:
        if s.trace is not None:
            out.append((None, "req/s"))
        elif s.arrival is not None and not isinstance(s.arrival, ClosedArrival):
            add(s.arrival, s.sessions)
    return out, len(w.closed_loops())


def base_rate(sc: Scenario) -> float | None:
    """Open-loop arrivals per second of ``sc`` as configured (its ``rate_scale`` included):
    requests, or session starts for sessions (a start is a session of several turns, not one
    request; closed loops count 0), when every open-loop source states a rate; None when one does
    not (a trace replay, ServeGen fits). What the scale multiplies, not a request rate: for that,
    :func:`request_rate`."""
    parts, _ = _sources(sc)
    if not parts or any(r is None for r, _ in parts):
        return None
    total = sum(r for r, _ in parts)
    return total * sc.workload.rate_scale if total > 0 else None


def request_rate(sc: Scenario) -> float | None:
    """Requests per second of ``sc`` as configured (its ``rate_scale`` included), when the
    configuration says it exactly: every source an open-loop request process that states a rate.
    None otherwise: a trace replay or ServeGen fits (no single rate), sessions (the arrival
    process starts sessions of several turns each), closed loops (their requests per second
    follow from latency); a capacity search then measures the request rate of its runs."""
    parts, closed = _sources(sc)
    if closed or not parts or any(r is None or unit != "req/s" for r, unit in parts):
        return None
    total = sum(r for r, _ in parts)
    return total * sc.workload.rate_scale if total > 0 else None


def scaled_rates(sc: Scenario, factor: float = 1.0) -> str:
    """What the rate scale ``factor`` means for ``sc``, in words: ``"13.54 session starts/s"``,
    ``"5 req/s open loop + closed loops (their clients unchanged)"``, ``"trace/ServeGen arrivals
    x2"``: the configured numbers, each in its own unit, never summed across units."""
    parts, closed = _sources(sc)
    sums: dict[str, float] = {}
    unknown = False
    for r, unit in parts:
        if r is None:
            unknown = True
        else:
            sums[unit] = sums.get(unit, 0.0) + r * sc.workload.rate_scale * factor
    words = [f"{v:.4g} {unit}" + (" open loop" if unit == "req/s" and (closed or len(sums) > 1 or unknown) else "")
             for unit, v in sums.items()]
    if unknown:
        words.append("trace/ServeGen arrivals " + ("as recorded" if factor == 1 else f"x{factor:.4g}"))
    if closed:
        words.append("closed loops (their clients unchanged)")
    return " + ".join(words)


def measured_req_per_s(arrival_s, until_s: float, warmup: int) -> float:
    """Requests per second that arrived in one run: of the arrivals up to ``until_s`` (the run's
    end), after the first ``warmup`` (its warm-up), ``(n - 1) / (last - first)``; NaN with fewer
    than two. The request rate that ran, whatever started the requests (sessions' turns, closed
    loops' clients)."""
    t = np.asarray(arrival_s, dtype=np.float64)
    t = np.sort(t[np.isfinite(t) & (t <= until_s)])[max(int(warmup), 0):]
    if len(t) < 2 or not t[-1] > t[0]:
        return math.nan
    return float((len(t) - 1) / (t[-1] - t[0]))


def scale_rate(sc: Scenario, factor: float) -> Scenario:
    if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 0):
        raise ScenarioError(f"rate scale {factor!r}: must be a finite number > 0")
    if not sc.workload.has_open_loop():
        raise ScenarioError("workload: every arrival process is a closed loop, which has no rate to scale "
                            "(its load follows from clients and think_s); sweep over the clients instead")
    update: dict = {"workload.rate_scale": sc.workload.rate_scale * factor}
    if sc.stop.requests is None and sc.stop.warmup_requests:
        update["stop.warmup_requests"] = int(round(sc.stop.warmup_requests * factor))
    return sc.override(update, source="rate scale")
