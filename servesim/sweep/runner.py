"""Run many tasks and turn their summaries into rows: the loop behind sweeps, ``simulate_many``,
replications and capacity searches.

::

    points ──► tasks (key, seed) ──► executor (this process | Dask) ──► summaries
                 │  minus the tasks the store holds with every metric asked   │
                 │  for (resume)                                              │
                 ▼                                                            ▼
            progress(done, total)                     rows ──► store (parquet parts, dedupe)

A row is ``point, key, seed, replication``, the point's axis values, the kept metrics,
``wall_s`` (the only column that depends on the machine) and ``metrics_kept`` (the names of the
kept metrics: a NaN among them is "could not measure", a metric not among them was not asked
for). Identical configurations (same key) run once and share their rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import pandas as pd

from servesim.errors import ServesimError
from servesim.metrics.flat import METRIC_NAMES, flat_metrics
from servesim.sweep.slo import slo_lines
from servesim.sweep.spec import Point, SweepSpec
from servesim.sweep.store import KEPT, SweepStore, axis_columns, complete_metrics
from servesim.sweep.task import Task, run_task

Progress = Callable[[int, int], None]


class TaskError(ServesimError):
    """Tasks failed on bad input found only when they ran (a missing file on a worker, ...)."""


@dataclass
class RunReport:
    """What a call ran: tasks in the design, already stored (skipped), run now, failed."""

    total: int = 0
    skipped: int = 0
    ran: int = 0
    errors: list[tuple[Task, str]] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)


def tasks_for(points: list[Point], seeds_of: Callable[[Point], list[int]], out_dir: str | None = None) -> list[Task]:
    """One task per distinct (key, seed); points that share a key share their tasks."""
    seen: set[tuple[str, int]] = set()
    tasks = []
    for p in points:
        for r, s in enumerate(seeds_of(p)):
            if (p.key, s) in seen:
                continue
            seen.add((p.key, s))
            where = None if out_dir is None else str(Path(out_dir) / f"seed-{s}")
            tasks.append(Task(p.key, s, r, p.scenario, where))
    return tasks


def make_row(point: Point, task: Task, summary: dict, metrics: Iterable[str] | None) -> dict[str, Any]:
    names = METRIC_NAMES if metrics is None else tuple(metrics)
    row: dict[str, Any] = {"point": point.index, "key": task.key, "seed": task.seed, "replication": task.replication}
    row.update(axis_columns(point.values))
    row.update(flat_metrics(summary, names))
    row["wall_s"] = float(summary.get("wall_s", float("nan")))
    step = summary.get("step_model") or {}  # which step model priced the point (servesim/perf/select.py)
    row["step_model"] = step.get("label", "")
    row["pack_id"] = step.get("pack_id") or ""
    row[KEPT] = json.dumps(sorted(set(names)))  # what this row holds: a NaN among them is "not measured"
    return row


def run_tasks(points: list[Point], tasks: list[Task], executor, *, metrics: Iterable[str] | None = None,
              store: SweepStore | None = None, progress: Progress | None = None,
              on_summary: Callable[[Task, dict], None] | None = None,
              on_result: Callable[[Task, dict], None] | None = None) -> RunReport:
    """Run ``tasks`` (skipping those ``store`` holds), keep rows in ``store`` as they arrive (or in
    the report when there is no store), call ``progress(done, total)``, ``on_summary(task,
    summary)`` and ``on_result(task, what run_task returned)``."""
    first_point = {}
    for p in points:
        first_point.setdefault(p.key, p)
    rep = RunReport(total=len(tasks))
    wanted = METRIC_NAMES if metrics is None else tuple(metrics)
    # a task stored without a metric asked for now runs again (its row would read NaN there)
    todo = [t for t in tasks if store is None or not store.holds(t.key, t.seed, wanted)]
    rep.skipped = len(tasks) - len(todo)
    done = rep.skipped
    if progress:
        progress(done, rep.total)
    try:
        for task, out in executor.map_unordered(run_task, todo, key=lambda t: f"{t.key}-{t.seed}"):
            done += 1
            if "error" in out:
                rep.errors.append((task, out["error"]))
            else:
                rep.ran += 1
                names = wanted
                if store is not None:  # run again for a new metric: keep the ones stored too
                    names = tuple(dict.fromkeys([*wanted, *sorted(store.metrics_of(task.key, task.seed))]))
                row = make_row(first_point[task.key], task, out["summary"], names)
                if store is not None:
                    store.add(row)
                else:
                    rep.rows.append(row)
                if on_summary is not None:
                    on_summary(task, out["summary"])
                if on_result is not None:
                    on_result(task, out)
            if progress:
                progress(done, rep.total)
    finally:
        if store is not None:
            store.flush()
    return rep


def raise_errors(rep: RunReport) -> None:
    if rep.errors:
        task, msg = rep.errors[0]
        more = f" (and {len(rep.errors) - 1} more tasks failed)" if len(rep.errors) > 1 else ""
        raise TaskError(f"{msg}{more}")


def design_frame(points: list[Point], seeds_of: Callable[[Point], list[int]]) -> pd.DataFrame:
    """The design as stored (``points.parquet``): one row per run, ``point, key, seed,
    replication`` and the axis values; results are the stored rows of exactly these runs."""
    return pd.DataFrame([{"point": p.index, "key": p.key, "seed": s, "replication": r, **axis_columns(p.values)}
                         for p in points for r, s in enumerate(seeds_of(p))])


def expand_rows(points: list[Point], rows: pd.DataFrame, seeds_of: Callable[[Point], list[int]]) -> pd.DataFrame:
    """One row per point and seed (a point sharing another's key gets a copy of its rows), in
    design order."""
    if rows.empty:
        return rows
    by_task = {(k, int(s)): i for i, (k, s) in enumerate(zip(rows["key"], rows["seed"]))}
    out = []
    axis_cols = list(dict.fromkeys(k for p in points for k in axis_columns(p.values)))
    for p in points:
        for rep, s in enumerate(seeds_of(p)):
            i = by_task.get((p.key, s))
            if i is None:
                continue
            r = rows.iloc[i].to_dict()
            r["point"] = p.index
            r["replication"] = rep  # this design's index of the seed (a stored row may be an older spec's)
            r.update(axis_columns(p.values))
            out.append(r)
    df = complete_metrics(pd.DataFrame(out))
    lead = ["point", "key", "seed", "replication"] + axis_cols
    return df[lead + [c for c in df.columns if c not in lead]]


def pending_tasks(spec: SweepSpec, out: str | Path) -> int:
    """Runs of ``spec`` that folder ``out`` does not hold yet (no need to start workers for 0)."""
    tasks = tasks_for(spec.points, spec.seeds_of)
    if not (Path(out) / "rows").is_dir():
        return len(tasks)
    store = SweepStore(out)
    return sum(not store.holds(t.key, t.seed, spec.metrics) for t in tasks)


@dataclass
class SweepOutcome:
    frame: pd.DataFrame
    report: RunReport
    spec: SweepSpec
    out: Path


def run_sweep(spec: SweepSpec, out: str | Path, executor, *, progress: Progress | None = None,
              spec_text: str | None = None) -> SweepOutcome:
    """Run a spec into folder ``out``: the design is written first, then rows as they arrive;
    tasks already stored are skipped (resume). Failed tasks are reported, not stored, so a re-run
    tries them again."""
    out = Path(out)
    store = SweepStore(out)
    store.write_design(design_frame(spec.points, spec.seeds_of), spec_text)
    # the SLO lines the report draws (servesim/report/sweepdata.py), from the base scenario
    (out / "slos.json").write_text(json.dumps(slo_lines(spec.base), indent=1) + "\n")
    if spec.invalid_points:
        pd.DataFrame([{"point": i, **axis_columns(v), "error": e}
                      for i, v, e in spec.invalid_points]).to_csv(out / "invalid.csv", index=False)
    else:  # an earlier design's list would say points were set aside that this one does not have
        (out / "invalid.csv").unlink(missing_ok=True)
    tasks = tasks_for(spec.points, spec.seeds_of)
    try:
        rep = run_tasks(spec.points, tasks, executor, metrics=spec.metrics, store=store, progress=progress)
    finally:
        store.flush()
    store.compact()
    rows = store.read()
    frame = expand_rows(spec.points, rows, spec.seeds_of)
    return SweepOutcome(frame, rep, spec, out)
