"""A sweep's results on disk: parquet parts appended as rows arrive, deduplicated by task.

Layout of a sweep folder::

    DIR/spec.yaml           the spec as last run
    DIR/points.parquet      the design: point, key, axis values (rewritten on each run)
    DIR/rows/part-*.parquet result rows, one per (key, seed): appended while the sweep runs
    DIR/invalid.csv         points the scenario rejected (with ``invalid: skip``)

Appends are atomic (a part is written under a temporary name and renamed), so a crash or Ctrl-C
loses at most the rows not yet flushed (a second's worth), never a half-written file; those
tasks simply run again on resume. A task is one ``(key, seed)``: the writer refuses a task it
already holds and the reader keeps the first copy, so a task that finished twice (a worker
presumed dead that was not) is stored once. One sweep process writes a folder at a time.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq

ID_COLUMNS = ["key", "seed"]
META_COLUMNS = ("point", "key", "seed", "replication", "wall_s", "error")


def axis_columns(values: dict[str, Any]) -> dict[str, Any]:
    """A point's values as row cells. A path that is also a row column (the scenario's ``seed``)
    becomes ``scenario.<path>``: the ``seed`` column is the run's seed."""
    return {(f"scenario.{k}" if k in META_COLUMNS else k): storable(v) for k, v in values.items()}


def storable(v: Any) -> Any:
    """Axis values as parquet cells: mappings and lists as JSON text, scalars as they are."""
    return json.dumps(v, sort_keys=True) if isinstance(v, (dict, list, tuple)) else v


class SweepStore:
    def __init__(self, root: str | Path, flush_every_s: float = 1.0, flush_rows: int = 512):
        self.root = Path(root)
        self.rows_dir = self.root / "rows"
        self.rows_dir.mkdir(parents=True, exist_ok=True)
        self.flush_every_s = flush_every_s
        self.flush_rows = flush_rows
        self._buffer: list[dict] = []
        self._last_flush = time.monotonic()
        self._held: set[tuple[str, int]] = self.done_keys()
        self.duplicates = 0

    # ------------------------------------------------------------------------------ reading
    def parts(self) -> list[Path]:
        return sorted(p for p in self.rows_dir.glob("*.parquet"))

    def done_keys(self) -> set[tuple[str, int]]:
        done: set[tuple[str, int]] = set()
        for p in self.parts():
            t = pq.read_table(p, columns=ID_COLUMNS)
            done.update(zip(t.column("key").to_pylist(), t.column("seed").to_pylist()))
        return done

    def read(self) -> pd.DataFrame:
        """Every stored row once (first copy of a task wins)."""
        frames = [pd.read_parquet(p) for p in self.parts()]
        frames = [f for f in frames if len(f)]
        if not frames:
            return pd.DataFrame(columns=ID_COLUMNS)
        df = pd.concat(frames, ignore_index=True)
        return df.drop_duplicates(ID_COLUMNS, keep="first").reset_index(drop=True)

    # ------------------------------------------------------------------------------ writing
    def holds(self, key: str, seed: int) -> bool:
        return (key, seed) in self._held

    def add(self, row: dict) -> bool:
        """Buffer a row; False (and not kept) when its task is already stored."""
        tid = (row["key"], int(row["seed"]))
        if tid in self._held:
            self.duplicates += 1
            return False
        self._held.add(tid)
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


def load_results(root: str | Path) -> pd.DataFrame:
    """A sweep folder's results: one row per point of its last design and seed that finished
    (point, key, seed, replication, axis values, metrics, wall_s)."""
    root = Path(root)
    rows = SweepStore(root).read()
    design = root / "points.parquet"
    if not design.is_file() or rows.empty:
        return rows
    points = pd.read_parquet(design)
    metric_cols = [c for c in rows.columns if c not in points.columns or c == "key"]
    df = (points.merge(rows[metric_cols], on="key", how="inner")
          .sort_values(["point", "replication"], kind="stable").reset_index(drop=True))
    lead = ["point", "key", "seed", "replication"] + [c for c in points.columns if c not in ("point", "key")]
    return df[lead + [c for c in df.columns if c not in lead]]
