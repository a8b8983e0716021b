"""A sweep's results on disk: parquet parts appended as rows arrive, deduplicated by task.

Layout of a sweep folder::

    DIR/spec.yaml           the spec as last run
    DIR/points.parquet      the design: one row per run of it (point, key, seed, replication,
                            axis values), rewritten on each run
    DIR/rows/part-*.parquet result rows, one per (key, seed): appended while the sweep runs
    DIR/invalid.csv         points the scenario rejected (with ``invalid: skip``; removed when
                            the last design has none)

Results are the last design's runs only: rows join the design on ``(key, seed)``, so rows of
seeds or points an earlier spec had stay in the store (a later spec that has them again reuses
them) but are not results. Each row lists the metrics it was computed with (``metrics_kept``): a
spec asking for a metric a stored row lacks runs that task again, and the new row (holding the
old metrics and the new) supersedes the old on reading; a metric only some rows hold is left
out of the results, never reported as NaN (NaN means the run could not measure it).

Appends are atomic (a part is written under a temporary name and renamed), so a crash or Ctrl-C
loses at most the rows not yet flushed (a second's worth), never a half-written file; those
tasks simply run again on resume. A task is one ``(key, seed)``: the writer refuses a task it
already holds and the reader keeps the first copy, so a task that finished twice (a worker
presumed dead that was not) is stored once. One sweep process writes a folder at a time.
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from servesim.metrics.flat import metric_path

ID_COLUMNS = ["key", "seed"]
KEPT = "metrics_kept"  # JSON list of the metric names a row was computed with
META_COLUMNS = ("point", "key", "seed", "replication", "wall_s", "error", KEPT)


def axis_columns(values: dict[str, Any]) -> dict[str, Any]:
    """A point's values as row cells. A path that is also a row column (the scenario's ``seed``)
    becomes ``scenario.<path>``: the ``seed`` column is the run's seed."""
    return {(f"scenario.{k}" if k in META_COLUMNS else k): storable(v) for k, v in values.items()}


def storable(v: Any) -> Any:
    """Axis values as parquet cells: mappings and lists as JSON text, scalars as they are."""
    return json.dumps(v, sort_keys=True) if isinstance(v, (dict, list, tuple)) else v


SWEEP_MARKERS = ("rows", "points.parquet", "spec.yaml")  # what a sweep writes into its folder


def holds_sweep(folder: str | Path) -> str | None:
    """The first thing of a sweep's ``folder`` holds (a sweep wrote there), or None."""
    f = Path(folder)
    return next((name for name in SWEEP_MARKERS if (f / name).exists()), None)


class SweepStore:
    def __init__(self, root: str | Path, flush_every_s: float = 1.0, flush_rows: int = 512):
        self.root = Path(root)
        self.rows_dir = self.root / "rows"
        self.rows_dir.mkdir(parents=True, exist_ok=True)
        self.flush_every_s = flush_every_s
        self.flush_rows = flush_rows
        self._buffer: list[dict] = []
        self._last_flush = time.monotonic()
        self._held: dict[tuple[str, int], frozenset[str]] = self.held_metrics()
        self.duplicates = 0

    # ------------------------------------------------------------------------------ reading
    def parts(self) -> list[Path]:
        return sorted(p for p in self.rows_dir.glob("*.parquet"))

    def done_keys(self) -> set[tuple[str, int]]:
        return set(self._held)

    def held_metrics(self) -> dict[tuple[str, int], frozenset[str]]:
        """``(key, seed) -> the metrics its best stored copy holds`` for every stored task."""
        held: dict[tuple[str, int], frozenset[str]] = {}
        for p in self.parts():
            f = None
            if KEPT in pq.read_schema(p).names:  # rows that list their metrics: three columns suffice
                f = pd.read_parquet(p, columns=[*ID_COLUMNS, KEPT])
            if f is None or f[KEPT].isna().any():
                f = pd.read_parquet(p)
            for k, s, m in zip(f["key"], f["seed"], kept_sets(f)):
                tid = (k, int(s))
                if len(m) > len(held.get(tid, ())):
                    held[tid] = m
                else:
                    held.setdefault(tid, m)
        return held

    def read(self) -> pd.DataFrame:
        """Every stored task once: the copy holding the most metrics (a task run again for a
        metric its first row lacked), else the first copy."""
        frames = [pd.read_parquet(p) for p in self.parts()]
        frames = [f for f in frames if len(f)]
        if not frames:
            return pd.DataFrame(columns=ID_COLUMNS)
        return best_copies(pd.concat(frames, ignore_index=True))

    # ------------------------------------------------------------------------------ writing
    def holds(self, key: str, seed: int, metrics: Iterable[str] = ()) -> bool:
        """Whether the task is stored with every metric of ``metrics``."""
        have = self._held.get((key, int(seed)))
        return have is not None and set(metrics) <= have

    def metrics_of(self, key: str, seed: int) -> frozenset[str]:
        """The metrics the stored copy of a task holds (empty when it is not stored)."""
        return self._held.get((key, int(seed)), frozenset())

    def add(self, row: dict) -> bool:
        """Buffer a row; False (and not kept) when its task is already stored with every metric
        the row holds."""
        tid = (row["key"], int(row["seed"]))
        kept = row_kept(row)
        if tid in self._held and kept <= self._held[tid]:
            self.duplicates += 1
            return False
        self._held[tid] = kept | self._held.get(tid, frozenset())
        self._buffer.append(row)
        if len(self._buffer) >= self.flush_rows or time.monotonic() - self._last_flush >= self.flush_every_s:
            self.flush()
        return True

    def flush(self) -> None:
        self._last_flush = time.monotonic()
        if not self._buffer:
            return
        frame = pd.DataFrame(self._buffer)
        self._write(frame, f"part-{time.time_ns()}-{uuid.uuid4().hex[:8]}.parquet")
        self._buffer = []

    def _write(self, frame: pd.DataFrame, name: str) -> Path:
        tmp = self.rows_dir / f".{name}.tmp"
        frame.to_parquet(tmp, index=False)
        final = self.rows_dir / name
        os.replace(tmp, final)
        return final

    def compact(self) -> None:
        """Many small parts into one: write the union first, then delete what it replaces (a crash
        in between leaves duplicates, which reading removes)."""
        self.flush()
        parts = self.parts()
        if len(parts) <= 1:
            return
        frame = self.read()
        keep = self._write(frame, f"part-{time.time_ns()}-compact.parquet")
        for p in parts:
            if p != keep:
                p.unlink(missing_ok=True)

    def write_design(self, points: pd.DataFrame, spec_text: str | None = None) -> None:
        tmp = self.root / ".points.parquet.tmp"
        points.to_parquet(tmp, index=False)
        os.replace(tmp, self.root / "points.parquet")
        if spec_text is not None:
            (self.root / "spec.yaml").write_text(spec_text)


def row_kept(row: dict) -> frozenset[str]:
    """The metrics a row (as ``make_row`` builds it) was computed with."""
    text = row.get(KEPT)
    if isinstance(text, str):
        return frozenset(json.loads(text))
    return frozenset(c for c, v in row.items() if metric_path(c) is not None and not _missing(v))


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def kept_sets(frame: pd.DataFrame) -> list[frozenset[str]]:
    """Each row's metrics: its ``metrics_kept`` list; a row stored before that column existed
    holds the metric columns it has a value in (a NaN there may be a metric it was not asked
    for: such a row is run again when the metric is asked for)."""
    listed = frame[KEPT].tolist() if KEPT in frame.columns else [None] * len(frame)
    parsed: dict[str, frozenset[str]] = {}  # rows of one spec share one list: parse it once
    out = []
    present = metric_cols = None
    for i, text in enumerate(listed):
        if isinstance(text, str):
            if text not in parsed:
                parsed[text] = frozenset(json.loads(text))
            out.append(parsed[text])
            continue
        if metric_cols is None:
            metric_cols = [c for c in frame.columns if metric_path(c) is not None]
            present = frame[metric_cols].notna().to_numpy() if metric_cols else None
        out.append(frozenset(c for c, on in zip(metric_cols, present[i]) if on) if present is not None
                   else frozenset())
    return out


def best_copies(df: pd.DataFrame) -> pd.DataFrame:
    """One row per task ``(key, seed)``: the copy holding the most metrics, the first among equals."""
    if df.empty:
        return df.reset_index(drop=True)
    size = np.array([len(m) for m in kept_sets(df)])
    order = np.argsort(-size, kind="stable")
    return df.iloc[order].drop_duplicates(ID_COLUMNS, keep="first").sort_index().reset_index(drop=True)


def complete_metrics(df: pd.DataFrame) -> pd.DataFrame:
    """Results as reported: the metric columns every row was computed with (a column only some
    rows hold would read NaN, "could not measure", where the metric was never asked for), without
    the ``metrics_kept`` bookkeeping. Rows stored before rows listed their metrics restrict
    nothing (their folder is read as it was written)."""
    if KEPT not in df.columns:
        return df
    listed = [json.loads(t) for t in df[KEPT] if isinstance(t, str)]
    common = set.intersection(*map(set, listed)) if listed else None
    drop = [c for c in df.columns
            if c == KEPT or (common is not None and metric_path(c) is not None and c not in common)]
    return df.drop(columns=drop)


def load_results(root: str | Path) -> pd.DataFrame:
    """A sweep folder's results: one row per run of its last design that finished (point, key,
    seed, replication, axis values, metrics, wall_s). Rows join the design on ``(key, seed)``:
    stored runs of seeds or points the last design does not have are not its results."""
    root = Path(root)
    rows = SweepStore(root).read()
    design = root / "points.parquet"
    if not design.is_file() or rows.empty:
        return complete_metrics(rows)
    points = pd.read_parquet(design)
    on = ["key", "seed"] if "seed" in points.columns else ["key"]  # a design written before it listed seeds
    metric_cols = [c for c in rows.columns if c not in points.columns or c in on]
    df = (points.merge(rows[metric_cols], on=on, how="inner")
          .sort_values(["point", "replication"], kind="stable").reset_index(drop=True))
    df = complete_metrics(df)
    lead = ["point", "key", "seed", "replication"] + [c for c in points.columns
                                                      if c not in ("point", "key", "seed", "replication")]
    return df[lead + [c for c in df.columns if c not in lead]]
