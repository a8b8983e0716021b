"""A run's folder: which files a run writes, finding and clearing an earlier run's, and the
strict-JSON text of summary.json. File-system work, kept out of servesim/simulate.py (build ->
run -> post-process, no I/O); the CLI, sweeps and the report read it from here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

RUN_FILES = ("requests.parquet", "timeseries.parquet", "summary.json", "sketches.json", "scenario.resolved.yaml",
             "report.html")


def stale_charts(folder: Path) -> list[Path]:
    """Static charts a report wrote into ``folder/charts`` (``NN-name.png|svg``, servesim/report/page.py)."""
    charts = folder / "charts"
    if not charts.is_dir():
        return []
    return [p for p in charts.iterdir() if p.suffix in (".png", ".svg") and p.name[:2].isdigit() and p.name[2:3] == "-"]


REPLICATED_FILES = ("replications.parquet",)  # with summary.json and seeds/seed-<seed>/ (sweep/replicate.py)


def clear_earlier_run(folder: Path, keep_seeds=()) -> None:
    """Remove what an earlier run of either kind wrote into ``folder``, so a run replaces a run
    as a set (``--force``): a single run's files, a replicated run's ``replications.parquet``
    and ``seeds/seed-<seed>/`` folders (but those of ``keep_seeds``, just written), and a
    report's charts. A single run written over a replicated one left the seeds beside it (and
    the other way round its requests.parquet), and ``servesim report`` drew both runs on one
    page. Only run files are removed: a folder left with anything else in it stays."""
    for name in RUN_FILES + REPLICATED_FILES:
        (folder / name).unlink(missing_ok=True)
    for chart in stale_charts(folder):  # a report of the earlier run must not describe this one
        chart.unlink(missing_ok=True)
    seeds = folder / "seeds"
    if not seeds.is_dir() or seeds.is_symlink():
        return
    keep = {f"seed-{s}" for s in keep_seeds}
    for d in seeds.iterdir():
        if d.name in keep or d.is_symlink() or not d.is_dir() or not d.name.startswith("seed-") \
                or not d.name[5:].isdigit():
            continue
        clear_earlier_run(d)
        _rmdir_if_empty(d)
    _rmdir_if_empty(seeds)


def _rmdir_if_empty(d: Path) -> None:
    for sub in ("charts",):
        if (d / sub).is_dir() and not (d / sub).is_symlink() and not any((d / sub).iterdir()):
            (d / sub).rmdir()
    if not any(d.iterdir()):
        d.rmdir()


def holds_run(folder: str | Path) -> str | None:
    """The first run file ``folder`` holds (a folder an earlier run wrote into), or None."""
    f = Path(folder)
    return next((name for name in RUN_FILES if (f / name).exists()), None)


def summary_json(summary: dict) -> str:
    """``summary.json`` text: strict JSON (a non-finite float, which JSON cannot hold, is written
    as null; ``Infinity`` would make the file unreadable to strict parsers)."""
    return json.dumps(_finite(summary), indent=2, sort_keys=False, allow_nan=False) + "\n"


def _finite(x):
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    if isinstance(x, float) and not np.isfinite(x):
        return None
    return x
