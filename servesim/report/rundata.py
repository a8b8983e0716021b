"""One finished run, as the report reads it: from a run folder, or from a Result in memory.

A report is drawn from the files a run writes (``summary.json``, ``requests.parquet``,
``timeseries.parquet``, ``sketches.json``, ``scenario.resolved.yaml``), so ``servesim report DIR``
on a folder written last week draws the same charts as ``servesim run --report`` today. Only the
columns the charts need are read from ``requests.parquet``. A folder that is not a run, or lacks
a file, is one line naming the folder and the file (:class:`~servesim.errors.ReportError`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from servesim.errors import ReportError
from servesim.metrics.sketch import LogSketch
from servesim.request import CAUSE_NAMES

if TYPE_CHECKING:
    import pandas as pd

    from servesim.simulate import Result

LATENCY_COLUMNS = ("ttft_s", "tpot_s", "e2e_s", "queue_s")
BLOCKED_COLUMNS = tuple(f"blocked_{c}_s" for c in CAUSE_NAMES)
REQUEST_COLUMNS = ("id", "status", "class_label") + LATENCY_COLUMNS + BLOCKED_COLUMNS
NEEDED = ("summary.json", "requests.parquet", "timeseries.parquet")


@dataclass
class RunData:
    """What the charts of one run need. ``requests`` holds the measured requests only (completed,
    after the warm-up), with ``class_label`` as text; ``itl`` is the inter-token-latency sketch
    (``sketches.json``: ITL is a weighted sample kept per run, not per request)."""

    label: str
    summary: dict
    requests: "pd.DataFrame" = field(repr=False)
    timeseries: "pd.DataFrame" = field(repr=False)
    itl: LogSketch | None = field(default=None, repr=False)
    resolved_yaml: str = field(default="", repr=False)
    folder: Path | None = None

    @property
    def classes(self) -> list[str]:
        """Class labels in the order of ``summary.by_class`` (the run's own order)."""
        return list(self.summary.get("by_class", {}))

    def class_title(self, label: str) -> str:
        """``P0 (chat)``: a class with the streams it gathers, when they are named otherwise."""
        streams = (self.summary.get("by_class", {}).get(label) or {}).get("streams") or []
        if not streams or streams in ([label], ["default"]):
            return label
        return f"{label} ({', '.join(streams)})"


def is_run_folder(folder: str | Path) -> bool:
    return (Path(folder) / "summary.json").is_file()


def load_run(folder: str | Path, label: str | None = None) -> RunData:
    """Read a run folder (what ``servesim run`` wrote)."""
    import pandas as pd
    import pyarrow.parquet as pq

    d = Path(folder)
    if not d.is_dir():
        raise ReportError(f"{d}: no such run folder" + (" (it is a file; give the folder)" if d.exists() else ""))
    missing = [n for n in NEEDED if not (d / n).is_file()]
    if missing and (d / "seeds").is_dir():
        raise ReportError(f"{d}: a run replicated over seeds keeps each seed's files in {d / 'seeds'}; report "
                          f"one of them (servesim report {d / 'seeds'}/seed-N) or overlay them "
                          f"(servesim compare {d / 'seeds'}/*)")
    if missing:
        raise ReportError(f"{d}: not a complete run folder, {', '.join(missing)} missing (a run writes "
                          f"{', '.join(NEEDED)}; run it again with servesim run ... --out {d} --force)")
    try:
        summary = json.loads((d / "summary.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportError(f"{d / 'summary.json'}: not readable as JSON ({exc})") from None
    if not isinstance(summary, dict) or "latency_s" not in summary or "requests" not in summary:
        raise ReportError(f"{d / 'summary.json'}: not a run summary (no latency_s / requests entries)")
    check_summary(summary, d / "summary.json")
    try:
        schema = pq.read_schema(d / "requests.parquet")
        lacking = [c for c in ("id", "status") if c not in schema.names]
        if lacking:
            raise ReportError(f"{d / 'requests.parquet'}: no column {lacking[0]!r}; not a run's request table "
                              f"(re-run the run: servesim run {d / 'scenario.resolved.yaml'} --out {d} --force)")
        cols = [c for c in REQUEST_COLUMNS if c in schema.names]
        req = pq.read_table(d / "requests.parquet", columns=cols).to_pandas()
        ts = pd.read_parquet(d / "timeseries.parquet")
    except (OSError, ValueError) as exc:  # pyarrow raises ArrowInvalid (a ValueError) on a bad file
        raise ReportError(f"{d}: a parquet file of the run cannot be read ({exc})") from None
    itl = None
    sk = d / "sketches.json"
    if sk.is_file():
        try:
            itl = LogSketch.from_dict(json.loads(sk.read_text())["itl"])
        except (KeyError, ValueError, TypeError):
            itl = None  # an unreadable sketch costs the ITL curve only (said on the chart)
    resolved = (d / "scenario.resolved.yaml").read_text() if (d / "scenario.resolved.yaml").is_file() else ""
    return RunData(label or d.name or str(d), summary, measured(req, summary), ts, itl, resolved, d)


SUMMARY_SECTIONS = ("requests", "throughput", "latency_s", "kv", "engine")  # the mappings a report reads


def check_summary(summary: dict, where: Path) -> None:
    """The entries the report reads are there and of their kind (a damaged or hand-edited
    summary.json is one line naming the entry, not a KeyError from deep in a chart)."""
    for key in SUMMARY_SECTIONS:
        if not isinstance(summary.get(key), dict):
            got = "missing" if key not in summary else f"{type(summary[key]).__name__}, not a mapping"
            raise ReportError(f"{where}: entry {key!r} is {got}; the file is damaged or not a run summary "
                              f"(re-run the run from its scenario.resolved.yaml)")
    for name, entry in summary["latency_s"].items():
        if not isinstance(entry, dict):
            raise ReportError(f"{where}: entry 'latency_s.{name}' is {type(entry).__name__}, not a mapping; "
                              f"the file is damaged (re-run the run from its scenario.resolved.yaml)")
    by_class = summary.get("by_class", {})
    if not isinstance(by_class, dict) or not all(isinstance(v, dict) for v in by_class.values()):
        raise ReportError(f"{where}: entry 'by_class' is not a mapping of classes; the file is damaged "
                          f"(re-run the run from its scenario.resolved.yaml)")


def from_result(res: "Result", label: str | None = None) -> RunData:
    """A Result in memory (notebooks, tests), without writing files."""
    from servesim.metrics.runfiles import summary_json

    summary = json.loads(summary_json(res.summary))  # as summary.json holds it (non-finite -> null)
    return RunData(label or res.scenario.name, summary, measured(res.requests, summary), res.timeseries,
                   res.sketches.get("itl"), res.resolved_yaml, None)


def measured(req: "pd.DataFrame", summary: dict) -> "pd.DataFrame":
    """The measured requests (completed, not among the first ``warmup`` in arrival order: the
    request id is the arrival rank), as the summary's latency figures count them."""
    warmup = int(summary["requests"].get("warmup", 0))
    keep = (req["status"].astype(str) == "finished").to_numpy() & (req["id"].to_numpy() >= warmup)
    out = req.loc[keep].reset_index(drop=True)
    if "class_label" in out:
        out["class_label"] = out["class_label"].astype(str)
    else:  # a run written before class labels: the SLA class is the only label
        out["class_label"] = "all"
    return out


def unique_labels(labels: list[str]) -> list[str]:
    """Labels made distinct (``a``, ``a (2)``) so overlaid runs never share a colour."""
    seen: dict[str, int] = {}
    out = []
    for lab in labels:
        n = seen.get(lab, 0) + 1
        seen[lab] = n
        out.append(lab if n == 1 else f"{lab} ({n})")
    return out


def finite(x) -> float | None:
    """A summary number as a float, or None (missing, null, NaN)."""
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
        return None
    x = float(x)
    return x if np.isfinite(x) else None
