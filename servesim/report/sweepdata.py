"""A sweep's results as the sweep report reads them (the documented folder format, docs/sweeps.md).

::

    DIR/spec.yaml            the spec as last run
    DIR/points.parquet       the design: one row per run (point, key, seed, replication), one
                             column per axis (dotted scenario path)
    DIR/rows/part-*.parquet  one row per (key, seed): seed, replication, axis values, metrics,
                             wall_s, metrics_kept (the metric names the row was computed with)
    DIR/invalid.csv          points set aside by ``invalid: skip``

The report reads these files itself rather than importing the sweep package: the two sit on the
same floor of the layout (docs/architecture.md), and the files are the contract. Rows are deduplicated by
task ``(key, seed)`` as the store's reader does (the copy holding the most metrics, else the
first); rows join the design by ``(key, seed)`` (points sharing a key share rows; rows of seeds
the last design does not have are left out), by ``key`` in a design written before it listed
seeds. A metric some of the joined rows were not computed with is left out (it would read NaN,
"could not measure"). A single parquet file (what ``simulate_many`` returns, saved) is read too:
its axes are the dotted column names.

Axis columns are scenario paths (``workload.arrival.rate``); metric columns are the flat metric
names (``ttft_p99``, ``req_per_s``, ``ttft_p99@chat``); the scenario's own ``seed`` as an axis is
``scenario.seed``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from servesim.errors import ReportError
from servesim.metrics.flat import metric_path
from servesim.report.curves import t_interval

if TYPE_CHECKING:
    import pandas as pd

KEPT = "metrics_kept"
META_COLUMNS = ("point", "key", "seed", "replication", "wall_s", "error", KEPT)
LOWER_IS_BETTER_PREFIXES = ("ttft_", "tpot_", "itl_", "e2e_", "queue_", "waiting_s", "wait_share_", "rejected",
                            "preemptions", "in_flight", "wall_s", "gpus")
HIGHER_IS_BETTER_PREFIXES = ("req_per_s", "output_tok_per_s", "input_tok_per_s", "goodput_req_per_s",
                             "slo_attainment", "completed", "measured", "prefix_hit_rate")


@dataclass
class SweepData:
    folder: Path
    rows: "pd.DataFrame"  # one row per point and seed
    axes: list[str]
    metrics: list[str]
    spec_text: str = ""
    invalid_points: int = 0
    failed_rows: int = 0
    slos: dict | None = None  # slos.json: the SLO lines to draw (servesim/sweep/slo.py: slo_lines)

    @property
    def seeds_per_point(self) -> tuple[int, int]:
        """(fewest, most) replications of a point."""
        n = self.rows.groupby("point")["seed"].nunique() if len(self.rows) else []
        return (int(min(n)), int(max(n))) if len(n) else (0, 0)


def is_sweep_folder(folder: str | Path) -> bool:
    d = Path(folder)
    return d.is_dir() and (d / "rows").is_dir()


def read_sweep(path: str | Path) -> SweepData:
    import pandas as pd

    p = Path(path)
    if p.is_file() and p.suffix == ".parquet":
        rows = _read_parquet(p)
        return _finish(p, rows, None, "", 0)
    if not is_sweep_folder(p):
        raise ReportError(f"{p}: not a sweep folder (no rows/ folder of parquet parts; a sweep writes "
                          f"DIR/points.parquet and DIR/rows/part-*.parquet, see docs/sweeps.md)")
    parts = sorted(x for x in (p / "rows").glob("*.parquet") if not x.name.startswith("."))
    frames = [f for f in (_read_parquet(x) for x in parts) if len(f)]
    if not frames:
        raise ReportError(f"{p}: the sweep holds no result rows yet (rows/ is empty); run it first: "
                          f"servesim sweep SPEC --out {p}")
    rows = pd.concat(frames, ignore_index=True)
    if {"key", "seed"} <= set(rows.columns):
        rows = _best_copies(rows)
    design = None
    if (p / "points.parquet").is_file():
        design = _read_parquet(p / "points.parquet")
    spec = (p / "spec.yaml").read_text() if (p / "spec.yaml").is_file() else ""
    invalid = 0
    if (p / "invalid.csv").is_file():
        invalid = max(0, sum(1 for line in (p / "invalid.csv").read_text().splitlines() if line.strip()) - 1)
    sd = _finish(p, rows, design, spec, invalid)
    if (p / "slos.json").is_file():
        try:
            sd.slos = json.loads((p / "slos.json").read_text())
        except ValueError:
            sd.slos = None  # a damaged file: the charts go without SLO lines
    return sd


def slo_line(sd: SweepData, metric: str) -> tuple[float, str] | None:
    """The SLO line of a metric: a target a stream states for it (``ttft_p99 <= 0.8``), else, for
    a TTFT or TPOT statistic, the scenario's per-request threshold (``slo.ttft_s``)."""
    if not sd.slos:
        return None
    t = (sd.slos.get("targets") or {}).get(metric)
    if isinstance(t, (int, float)):
        return float(t), f"SLO {metric} <= {t:g}"
    base = metric.split("@", 1)[0].split("_", 1)[0]
    pr = (sd.slos.get("per_request") or {}).get(base)
    if isinstance(pr, (int, float)) and base in ("ttft", "tpot"):
        return float(pr), f"per-request slo.{base}_s = {pr:g}"
    return None


def _kept(rows: "pd.DataFrame") -> list[frozenset[str] | None]:
    """Each row's ``metrics_kept`` as a set (None: a row written before rows listed them)."""
    if KEPT not in rows.columns:
        return [None] * len(rows)
    return [frozenset(json.loads(t)) if isinstance(t, str) else None for t in rows[KEPT]]


def _best_copies(rows: "pd.DataFrame") -> "pd.DataFrame":
    """One row per task: the copy computed with the most metrics (a task run again for a metric
    its first row lacked), the first among equals."""
    metric_cols = [c for c in rows.columns if metric_path(c) is not None]
    present = rows[metric_cols].notna().sum(axis=1).to_numpy()  # a row that lists none: its values
    size = np.array([len(k) if k is not None else int(n) for k, n in zip(_kept(rows), present)])
    order = np.argsort(-size, kind="stable")
    return rows.iloc[order].drop_duplicates(["key", "seed"], keep="first").sort_index().reset_index(drop=True)


def _complete(rows: "pd.DataFrame") -> "pd.DataFrame":
    """Without the metrics some listed rows were not computed with, nor the bookkeeping column."""
    listed = [k for k in _kept(rows) if k is not None]
    if not listed:
        return rows.drop(columns=[KEPT], errors="ignore")
    common = frozenset.intersection(*listed)
    return rows.drop(columns=[c for c in rows.columns if c == KEPT or (metric_path(c) is not None and c not in common)])


def _read_parquet(path: Path) -> "pd.DataFrame":
    import pandas as pd

    try:
        return pd.read_parquet(path)
    except (OSError, ValueError) as exc:
        raise ReportError(f"{path}: cannot be read as parquet ({exc})") from None


def _finish(folder: Path, rows: "pd.DataFrame", design: "pd.DataFrame | None", spec: str, invalid: int) -> SweepData:
    failed = 0
    if "error" in rows.columns:
        bad = rows["error"].notna() & (rows["error"].astype(str) != "")
        failed = int(bad.sum())
        rows = rows[~bad]
    if design is not None and "key" in rows.columns and "key" in design.columns:
        on = ["key", "seed"] if "seed" in design.columns and "seed" in rows.columns else ["key"]
        keep = [c for c in rows.columns if c not in design.columns or c in on]
        rows = _complete(design.merge(rows[keep], on=on, how="inner"))
        axes = [c for c in design.columns if c not in META_COLUMNS]
    else:
        axes = [c for c in rows.columns if "." in c and "@" not in c and c not in META_COLUMNS]
    if not axes:
        raise ReportError(f"{folder}: no axis columns (dotted scenario paths) in the sweep's rows")
    metrics = [c for c in rows.columns if c not in axes and c not in META_COLUMNS and _numeric(rows[c])]
    if "point" not in rows.columns:
        rows = rows.assign(point=rows.groupby(axes, dropna=False, sort=False).ngroup())
    if "seed" not in rows.columns:
        rows = rows.assign(seed=0)
    sort = ["point"] + (["replication"] if "replication" in rows.columns else ["seed"])
    rows = rows.sort_values(sort, kind="stable").reset_index(drop=True)
    return SweepData(folder, rows, axes, metrics, spec, invalid, failed)


def check_names(sd: SweepData, metrics: list[str] | None = None, axes: list[str] | None = None) -> None:
    """A metric or axis the sweep does not hold: one line listing what it holds."""
    for m in metrics or []:
        if m not in sd.metrics and m not in derived_columns(sd):
            raise ReportError(f"--metric {m!r}: not a metric of this sweep (it holds: {', '.join(sd.metrics)})")
    for a in axes or []:
        if a not in sd.axes:
            raise ReportError(f"axis {a!r}: not an axis of this sweep (its axes: {', '.join(sd.axes)})")


def derived_columns(sd: SweepData) -> dict[str, "pd.Series"]:
    """Columns computed from the axes: ``gpus`` = replicas x GPUs per replica, when an axis moves
    either (the other read from the axis, else 1: the scenario default)."""
    r = sd.rows
    reps, per = "hardware.replicas", "hardware.gpus_per_replica"
    if reps in sd.axes or per in sd.axes:
        a = r[reps] if reps in sd.axes else 1
        b = r[per] if per in sd.axes else 1
        return {"gpus": (a * b).astype(float)}
    return {}


def direction(name: str) -> str:
    """"min" or "max": which way a metric (or axis) is better, for the Pareto front."""
    base = name.split("@", 1)[0]
    if base.startswith(HIGHER_IS_BETTER_PREFIXES):
        return "max"
    return "min"


def _numeric(col: "pd.Series") -> bool:
    """Numbers, not booleans nor text (axis values that are mappings are JSON text)."""
    from pandas.api.types import is_bool_dtype, is_numeric_dtype

    return is_numeric_dtype(col) and not is_bool_dtype(col)


def is_numeric_axis(sd: SweepData, axis: str) -> bool:
    return _numeric(sd.rows[axis])


BOUNDED_BY_ONE = ("slo_attainment", "busy_fraction", "kv_peak_usage", "kv_mean_usage", "prefix_hit_rate")


def point_stats(sd: SweepData, metric: str, confidence: float = 0.95) -> "pd.DataFrame":
    """One row per point: its axis values, the metric's mean over seeds and the t interval
    (``lo``, ``hi``; equal to the mean with one seed), ``n`` seeds."""
    import pandas as pd

    r = sd.rows
    col = r[metric] if metric in r.columns else derived_columns(sd)[metric]
    rows = []
    for pid, idx in r.groupby("point", sort=True).groups.items():
        m, lo, hi, n = t_interval(col.loc[idx].to_numpy(dtype=np.float64), confidence)
        # every metric a sweep holds is >= 0 (latencies, rates, counts) and a share is <= 1: a
        # t interval of two seeds can reach past either; the band stops at the bound
        lo = max(lo, 0.0) if np.isfinite(lo) else lo
        base = metric.split("@", 1)[0]
        if (base in BOUNDED_BY_ONE or base.startswith("wait_share_")) and np.isfinite(hi):
            hi = min(hi, 1.0)
        first = r.loc[idx[0]]
        rows.append({"point": int(pid), **{a: first[a] for a in sd.axes}, "mean": m, "lo": lo, "hi": hi, "n": n})
    return pd.DataFrame(rows)


def default_metrics(sd: SweepData) -> list[str]:
    """What to draw when the user names nothing: the headline metrics the sweep holds."""
    wanted = ["ttft_p99", "tpot_p99", "e2e_p99", "req_per_s", "goodput_req_per_s", "slo_attainment"]
    have = [m for m in wanted if m in sd.metrics and sd.rows[m].notna().any()]
    return have or [m for m in sd.metrics if sd.rows[m].notna().any()][:4]


def default_pareto(sd: SweepData) -> tuple[str, str] | None:
    """(latency-like, throughput-like) pair for the Pareto chart, when the sweep holds both."""
    lat = next((m for m in ("ttft_p99", "e2e_p99", "tpot_p99", "ttft_mean") if m in sd.metrics), None)
    thr = next((m for m in ("goodput_req_per_s", "req_per_s", "output_tok_per_s") if m in sd.metrics), None)
    if "gpus" in derived_columns(sd) and "goodput_req_per_s" in sd.metrics:
        return ("gpus", "goodput_req_per_s")
    return (lat, thr) if lat and thr else None
