"""Arrivals generated from ServeGen's per-client arrival fits (Xiang et al., arXiv:2505.09999).

ServeGen publishes, for each client of a production model, one row per 600-s window
(``chunk-<client>-trace.csv``, no header)::

    window_start_s, rate, cv, pattern, shape, scale        pattern: Gamma | Weibull | '' (idle)

Generation, per client and window with a pattern (vectorized over all windows of a chunk):

1. ``N`` = rate x rate_scale x window, rounded *stochastically* (floor, +1 with probability of the
   fraction), so a client at 0.3 req/s x 600 s still averages 180 and a tiny rate is not lost;
2. draw ``N + 1`` inter-arrival times from the fitted distribution (Gamma(shape) or
   Weibull(shape); the ``scale`` column cancels out in the next step);
3. put the ``N`` arrivals at the first ``N`` cumulative sums, rescaled so the ``N+1``-th ends
   the window: the window holds exactly ``N`` requests and keeps the fit's burstiness (its CV).

This is ServeGen's own construction (``servegen/construct.py``: sample IATs, rescale them to fill
the window) except for the stochastic rounding and the ``N+1``-th gap, which keep the expected
count exactly rate x window and leave a gap before the next window instead of bunching arrivals
at window ends. The clients are then merged, and the chosen slice is shifted to time 0.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servesim.errors import TraceError
from servesim.config.traces import ServeGenArrivalConfig
from servesim.workload.trace_readers import resolve_path

_NAME = re.compile(r"^chunk-(.+)-trace\.csv$")
_PATTERNS = {"": 0, "Gamma": 1, "Weibull": 2}
CHUNK_WINDOWS = 36  # windows generated per step (6 h): bounds memory and lets n_max stop early


@dataclass(frozen=True)
class ClientFits:
    """One client's window fits, in time order."""

    client: str
    start_s: np.ndarray  # float64, window starts
    rate: np.ndarray  # float64, requests/s
    cv: np.ndarray  # float64
    pattern: np.ndarray  # int8: 0 idle, 1 Gamma, 2 Weibull
    shape: np.ndarray  # float64
    window_s: float


def read_client_fits(path: Path) -> ClientFits:
    """Parse and validate one ``chunk-<client>-trace.csv`` (row by row; one line per error)."""
    m = _NAME.match(path.name)
    client = m.group(1) if m else path.stem
    cols: list[list[float]] = [[], [], [], [], []]
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            for line_no, row in enumerate(csv.reader(fh), start=1):
                if not row:
                    continue
                where = f"{path}:{line_no}"
                if len(row) != 6:
                    raise TraceError(f"{where}: expected 6 fields (window_start_s, rate, cv, pattern, shape, scale), found {len(row)}")
                vals = []
                for name, text in zip(("window_start_s", "rate", "cv"), row[:3]):
                    vals.append(_number(text, where, name))
                pat = row[3].strip()
                if pat not in _PATTERNS:
                    raise TraceError(f"{where}: column pattern: {pat!r} is not Gamma, Weibull or empty")
                shape = _number(row[4], where, "shape")
                if pat and not shape > 0:
                    raise TraceError(f"{where}: column shape: {row[4]!r} must be > 0 for a {pat} window")
                for buf, v in zip(cols, vals + [_PATTERNS[pat], shape]):
                    buf.append(v)
    except FileNotFoundError:
        raise TraceError(f"{path}: no such ServeGen trace file") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not UTF-8 text") from None
    start = np.asarray(cols[0], dtype=np.float64)
    if len(start) == 0:
        raise TraceError(f"{path}: no windows in the file")
    steps = np.diff(start)
    if len(steps) and (np.any(steps <= 0) or np.ptp(steps) > 1e-6):
        raise TraceError(f"{path}: window starts must rise by a constant step (found steps {sorted(set(steps.tolist()))[:3]})")
    return ClientFits(
        client=client,
        start_s=start,
        rate=np.asarray(cols[1]),
        cv=np.asarray(cols[2]),
        pattern=np.asarray(cols[3], dtype=np.int8),
        shape=np.asarray(cols[4]),
        window_s=float(steps[0]) if len(steps) else 600.0,
    )


def _number(text: str, where: str, col: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = float("nan")
    if not (math.isfinite(x) and x >= 0):
        raise TraceError(f"{where}: column {col}: {text!r} is not a non-negative number")
    return x


def client_files(cfg: ServeGenArrivalConfig, base_dir: Path | str | None) -> list[Path]:
    """The chunk files selected by ``cfg.clients`` (all of them by default), in client order."""
    folder = resolve_path(cfg.dir, base_dir)
    if not folder.is_dir():
        raise TraceError(f"{folder}: no such ServeGen folder")
    found = {}
    for p in folder.iterdir():
        m = _NAME.match(p.name)
        if m:
            found[m.group(1)] = p
    if not found:
        raise TraceError(f"{folder}: no chunk-<client>-trace.csv files")
    if cfg.clients is None:
        keys = sorted(found, key=lambda k: (not k.isdigit(), int(k) if k.isdigit() else 0, k))
    else:
        keys = [str(c) for c in cfg.clients]
        missing = [k for k in keys if k not in found]
        if missing:
            shown = ", ".join(sorted(found, key=lambda k: (len(k), k))[:12])
            raise TraceError(f"{folder}: no client {missing[0]!r} (clients here: {shown}, ...)")
    return [found[k] for k in keys]


def _window_arrivals(fits: ClientFits, w: np.ndarray, rate_scale: float, rng: np.random.Generator) -> np.ndarray:
    """Arrivals of one client in windows ``w`` (indices), steps 1-3 of the module docstring."""
    w = w[(fits.pattern[w] > 0) & (fits.rate[w] > 0)]
    if len(w) == 0:
        return np.empty(0)
    expected = fits.rate[w] * rate_scale * fits.window_s
    n = np.floor(expected).astype(np.int64)
    n += rng.random(len(w)) < (expected - n)
    m = n + 1  # gaps drawn per window
    shape = np.repeat(fits.shape[w], m)
    gamma = np.repeat(fits.pattern[w] == 1, m)
    gaps = np.empty(len(shape))
    gaps[gamma] = rng.gamma(shape[gamma])
    gaps[~gamma] = rng.weibull(shape[~gamma])
    ends = np.cumsum(m)
    csum = np.cumsum(gaps)
    base = np.repeat(np.concatenate([[0.0], csum[ends[:-1] - 1]]), m)
    within = csum - base  # cumulative gap sum inside each window
    total = np.repeat(within[ends - 1], m)
    pos = within / np.where(total > 0, total, 1.0) * fits.window_s + np.repeat(fits.start_s[w], m)
    last = np.zeros(len(gaps), dtype=bool)
    last[ends - 1] = True
    return pos[~last]


def servegen_arrivals(
    cfg: ServeGenArrivalConfig,
    base_dir: Path | str | None,
    rng: np.random.Generator,
    n_max: int | None = None,
    duration_s: float | None = None,
) -> np.ndarray:
    """Sorted arrival times (s, from ``cfg.start_s`` = 0) of at most ``n_max`` requests within
    ``min(duration_s, cfg.duration_s)``; fewer when the data ends first.

    Windows are generated in 6-hour steps, each step drawing client by client from ``rng``, so
    the first k arrivals depend on neither ``n_max`` nor the duration (a longer run extends a
    shorter one)."""
    limits = [d for d in (duration_s, cfg.duration_s) if d is not None]
    if n_max is None and not limits:
        raise TraceError("servegen arrivals need a bound: stop.requests, stop.duration_s or arrival.duration_s")
    fits = [read_client_fits(p) for p in client_files(cfg, base_dir)]
    start = cfg.start_s
    end = start + min(limits) if limits else math.inf
    data_end = max(float(f.start_s[-1]) + f.window_s for f in fits)
    end = min(end, data_end)
    if start >= data_end:
        raise TraceError(f"{cfg.dir}: start_s {start:g} is past the end of the data ({data_end:g} s)")
    window = max(f.window_s for f in fits)
    out: list[np.ndarray] = []
    count = 0
    t = start - (start % window)
    while t < end and (n_max is None or count < n_max):
        t_next = t + CHUNK_WINDOWS * window
        parts = []
        for f in fits:
            # whole windows of the step, whatever the limits: the draws do not depend on them
            w = np.flatnonzero((f.start_s + f.window_s > t) & (f.start_s < t_next))
            parts.append(_window_arrivals(f, w, cfg.rate_scale, rng))
        a = np.sort(np.concatenate(parts))
        a = a[(a >= max(t, start)) & (a < min(t_next, end))]
        out.append(a)
        count += len(a)
        t = t_next
    times = np.concatenate(out) - start if out else np.empty(0)
    return times[:n_max] if n_max is not None else times


def servegen_rate(cfg: ServeGenArrivalConfig, base_dir: Path | str | None, duration_s: float | None = None) -> np.ndarray:
    """Expected total rate (req/s) per window over the selected slice: ``[[window_start, rate]]``,
    for the run header and for tests."""
    fits = [read_client_fits(p) for p in client_files(cfg, base_dir)]
    start = cfg.start_s
    limits = [d for d in (duration_s, cfg.duration_s) if d is not None]
    end = start + min(limits) if limits else math.inf
    starts = np.unique(np.concatenate([f.start_s for f in fits]))
    starts = starts[(starts + fits[0].window_s > start) & (starts < end)]
    total = np.zeros(len(starts))
    for f in fits:
        active = (f.pattern > 0) & (f.rate > 0)
        idx = np.searchsorted(starts, f.start_s[active])
        ok = (idx < len(starts)) & (starts[np.minimum(idx, len(starts) - 1)] == f.start_s[active])
        np.add.at(total, idx[ok], f.rate[active][ok] * cfg.rate_scale)
    return np.stack([starts, total], axis=1)


def servegen_notes(cfg: ServeGenArrivalConfig, base_dir: Path | str | None, arrivals: np.ndarray) -> tuple[str, ...]:
    """Header lines: clients, slice, expected and generated request counts."""
    files = client_files(cfg, base_dir)
    span = float(arrivals[-1]) if len(arrivals) else 0.0
    rates = servegen_rate(cfg, base_dir, span if span > 0 else None)
    return (
        f"servegen {Path(cfg.dir).name}: {len(files)} clients, from {cfg.start_s:,.0f} s, rate_scale {cfg.rate_scale:g}; "
        f"{len(arrivals):,} arrivals over {span:,.1f} s (fit mean {rates[:, 1].mean() if len(rates) else 0:,.2f} req/s)",
    )
