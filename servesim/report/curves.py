"""The numbers behind the charts, as small data frames (no plotting here, so tests can check them).

**The tail axis.** A latency CDF drawn on a linear probability axis squeezes everything above
P95 into the top few pixels, where the SLOs live. We plot the CDF against *nines*:
``nines(q) = -log10(1 - q)``, so P50 sits at 0.3, P90 at 1, P99 at 2 and P99.9 at 3, each decade
of the tail getting the same height. A sample of n values has about one value beyond
``nines = log10(n)``; the summary still reports P99 and P99.9 of smaller samples (numpy
interpolates between the largest values), so the curves go on to P99.9 as well, and a mark the
sample does not reach (fewer than ``1 / (1 - q)`` values) is flagged ``reached = False`` and
drawn hollow: such a P99.9 is the largest values, not a tail estimate.

Points are quantiles on a fixed grid of nines (evenly spaced, plus the marked percentiles), never
one point per request, so a 10-million-request run draws as fast as a 300-request one. The
quantiles are numpy's default (linear) percentiles, the definition summary.json uses
(servesim/metrics/stats.py), so the marked P99 on the curve is the summary's P99. ITL comes from
the run's mergeable sketch (within 1 % relative error), as ITL is not kept per request.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Iterable

import numpy as np

from servesim.metrics.sketch import LogSketch
from servesim.request import CAUSE_LABELS, CAUSE_NAMES, Cause

if TYPE_CHECKING:
    import pandas as pd

    from servesim.report.rundata import RunData

MARKS = {"P50": 50.0, "P90": 90.0, "P99": 99.0, "P99.9": 99.9}
GRID_POINTS = 160
LATENCIES = ("ttft", "tpot", "itl", "e2e")
LATENCY_TITLES = {"ttft": "TTFT (time to first token)", "tpot": "TPOT (time per output token)",
                  "itl": "ITL (inter-token latency)", "e2e": "E2E (end-to-end latency)"}


def nines(q: np.ndarray | float) -> np.ndarray:
    """Tail coordinate of quantile ``q`` in [0, 1): -log10(1 - q)."""
    return -np.log10(1.0 - np.asarray(q, dtype=np.float64))


def nines_grid(n: int) -> np.ndarray:
    """Nines at which to draw a sample of ``n`` values: 0 .. log10(n), and every marked
    percentile (sorted, distinct)."""
    if n < 2:
        return np.zeros(min(n, 1))
    grid = np.linspace(0.0, math.log10(n), GRID_POINTS)
    marks = nines(np.array(list(MARKS.values())) / 100.0)
    return np.unique(np.concatenate([grid, marks]))


def reached(n: int, at_nines: float) -> bool:
    """Whether a sample of ``n`` values has at least ``1 / (1 - q)`` of them for this quantile."""
    return n >= 2 and at_nines <= math.log10(n) + 1e-12


def sample_curve(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(nines, latency) of a plain sample (NaN dropped)."""
    x = np.asarray(x, dtype=np.float64)
    x = x[~np.isnan(x)]
    g = nines_grid(len(x))
    if len(g) == 0:
        return g, g
    q = 100.0 * (1.0 - 10.0 ** (-g))
    return g, np.percentile(x, q)


def sketch_curve(sk: LogSketch) -> tuple[np.ndarray, np.ndarray]:
    """(nines, latency) of a sketch (ITL); each value within the sketch's relative error."""
    g = nines_grid(sk.count)
    return g, np.array([sk.quantile(1.0 - 10.0 ** (-v)) for v in g], dtype=np.float64)


def series_name(run: str, klass: str, many_runs: bool, many_classes: bool) -> str:
    """The legend entry of one curve: the run, the class, or both when both vary."""
    if many_runs and many_classes:
        return f"{run} · {klass}"
    return run if many_runs else klass


def curve_groups(run: "RunData") -> list[tuple[str, "pd.DataFrame"]]:
    """("all", every measured request) and, when the run has several classes, one per class."""
    req = run.requests
    groups = [("all", req)]
    labels = [c for c in run.classes if (req["class_label"] == c).any()]
    if len(labels) > 1:
        groups += [(run.class_title(c), req[req["class_label"] == c]) for c in labels]
    return groups


def latency_curves(runs: list["RunData"]) -> "pd.DataFrame":
    """Rows (metric, run, class, series, nines, latency_s) of every latency CDF of every run.
    Non-positive latencies cannot sit on the log latency axis and are left out of the curves
    (a multi-step burst delivers tokens together: ITL 0); ``zero_share`` says how many."""
    import pandas as pd

    many_runs = len(runs) > 1
    frames = []
    for run in runs:
        groups = curve_groups(run)
        many_classes = len(groups) > 1
        for metric in LATENCIES:
            for klass, req in groups:
                if metric == "itl":
                    if klass != "all" or run.itl is None or run.itl.count == 0:
                        continue  # ITL is one weighted sample per run, not per class
                    g, v = sketch_curve(run.itl)
                else:
                    g, v = sample_curve(req[f"{metric}_s"].to_numpy())
                if len(g) == 0:
                    continue
                zero = float(np.mean(v <= 0))
                keep = v > 0
                n = run.itl.count if metric == "itl" else int(req[f"{metric}_s"].notna().sum())
                frames.append(pd.DataFrame({
                    "metric": metric, "run": run.label, "class": klass,
                    "series": series_name(run.label, klass, many_runs, many_classes),
                    "nines": g[keep], "latency_s": v[keep], "zero_share": zero, "n": n}))
    cols = ["metric", "run", "class", "series", "nines", "latency_s", "zero_share", "n"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)


def latency_marks(curves: "pd.DataFrame") -> "pd.DataFrame":
    """The marked percentiles (P50, P90, P99, P99.9) of each curve that reaches them."""
    import pandas as pd

    rows = []
    for name, pct in MARKS.items():
        at = float(nines(pct / 100.0))
        hit = curves[np.isclose(curves["nines"], at)]
        for r in hit.to_dict("records"):
            rows.append({"metric": r["metric"], "run": r["run"], "class": r["class"], "series": r["series"],
                         "mark": name, "nines": at, "latency_s": r["latency_s"],
                         "reached": reached(int(r["n"]), at), "n": int(r["n"])})
    return pd.DataFrame(rows, columns=["metric", "run", "class", "series", "mark", "nines", "latency_s", "reached", "n"])


# ------------------------------------------------------------------------------- time series
def coarsen(ts: "pd.DataFrame", sim_time: float | None, max_points: int = 1200) -> "pd.DataFrame":
    """At most ``max_points`` time bins: neighbouring bins merge ``k`` at a time, means weighted
    by the time each bin covers (exact for time-weighted means), peaks by max."""
    import pandas as pd

    n = len(ts)
    if n <= max_points or n < 2:
        return ts.reset_index(drop=True)
    k = int(math.ceil(n / max_points))
    t = ts["t_s"].to_numpy()
    b = float(t[1] - t[0])
    end = sim_time if sim_time and sim_time > t[-1] else t[-1] + b
    width = np.minimum(b, np.maximum(end - t, 0.0))
    grp = np.arange(n) // k
    out = {"t_s": t[::k]}
    for col in ts.columns:
        if col == "t_s":
            continue
        v = ts[col].to_numpy(dtype=np.float64)
        if col.endswith("_peak"):
            out[col] = pd.Series(v).groupby(grp).max().to_numpy()
        else:
            ok = ~np.isnan(v)
            num = np.bincount(grp, weights=np.where(ok, v * width, 0.0))
            den = np.bincount(grp, weights=np.where(ok, width, 0.0))
            with np.errstate(invalid="ignore", divide="ignore"):
                out[col] = np.where(den > 0, num / den, np.nan)
    return pd.DataFrame(out)


def long_series(runs: list["RunData"], columns: dict[str, str], max_points: int = 1200) -> "pd.DataFrame":
    """Rows (run, t_s, signal, value) of the given time-series columns (``column: label``);
    columns a run lacks (older runs) are skipped."""
    import pandas as pd

    frames = []
    for run in runs:
        ts = coarsen(run.timeseries, run.summary.get("sim_time_s"), max_points)
        for col, label in columns.items():
            if col in ts:
                frames.append(pd.DataFrame({"run": run.label, "t_s": ts["t_s"].to_numpy(), "signal": label,
                                            "value": ts[col].to_numpy(dtype=np.float64)}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["run", "t_s", "signal", "value"])


# ------------------------------------------------------------------------------ wait causes
def wait_attribution(runs: list["RunData"]) -> "pd.DataFrame":
    """Rows (run, class, cause, mean_s, share): mean seconds a measured request of the class
    waited, by cause, and the cause's share of the class's waiting time (summary.json's
    ``blockage`` shares, recomputed per class label)."""
    import pandas as pd

    rows = []
    for run in runs:
        for klass, req in curve_groups(run):
            n = len(req)
            if n == 0:
                continue
            secs = {c: float(np.nansum(req[f"blocked_{c}_s"].to_numpy())) if f"blocked_{c}_s" in req else 0.0
                    for c in CAUSE_NAMES}
            total = sum(secs.values())
            for i, c in enumerate(CAUSE_NAMES):
                rows.append({"run": run.label, "class": klass, "cause": CAUSE_LABELS[Cause(i)],
                             "mean_s": secs[c] / n, "share": secs[c] / total if total > 0 else 0.0})
    return pd.DataFrame(rows, columns=["run", "class", "cause", "mean_s", "share"])


# ---------------------------------------------------------------------------------- sweeps
def t_interval(x: np.ndarray, confidence: float = 0.95) -> tuple[float, float, float, int]:
    """(mean, lo, hi, n) of the Student-t interval of the mean over independent replications
    (``mean +- t(n-1) s / sqrt(n)``; lo = hi = mean with one replication; NaN dropped)."""
    from scipy import stats

    x = np.asarray(x, dtype=np.float64)
    x = x[~np.isnan(x)]
    n = len(x)
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    m = float(x.mean())
    if n == 1:
        return m, m, m, 1
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1) * x.std(ddof=1) / math.sqrt(n))
    return m, m - half, m + half, n


def pareto_front(x: Iterable[float], y: Iterable[float], x_better: str, y_better: str) -> np.ndarray:
    """Mask of the points no other point dominates (at least as good on both, better on one).
    ``*_better``: "min" or "max". NaN points are never on the front."""
    x = np.asarray(list(x), dtype=np.float64)
    y = np.asarray(list(y), dtype=np.float64)
    sx = 1.0 if x_better == "min" else -1.0
    sy = 1.0 if y_better == "min" else -1.0
    a, b = sx * x, sy * y  # now smaller is better on both
    ok = ~(np.isnan(a) | np.isnan(b))
    front = np.zeros(len(a), dtype=bool)
    idx = np.flatnonzero(ok)
    order = idx[np.lexsort((b[idx], a[idx]))]  # by a, then b
    best_b = math.inf
    for i in order:
        if b[i] < best_b:
            front[i] = True
            best_b = b[i]
    # equal points: a duplicate of a front point is on the front too
    for i in idx:
        if not front[i] and np.any(front & (a == a[i]) & (b == b[i])):
            front[i] = True
    return front
