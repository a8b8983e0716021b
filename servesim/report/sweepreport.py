"""The sweep report: ``servesim report SWEEP_DIR`` writes ``SWEEP_DIR/report.html``.

Sections: the spec and what the folder holds (points, seeds, rows, invalid points); heatmaps of
each metric over two axes; each metric against each axis with confidence intervals; the Pareto
frontier of a latency and a throughput metric, with the table of the points on it.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from servesim.errors import ReportError
from servesim.report import tables
from servesim.report.page import parse_formats, render, write_outputs
from servesim.report.sweepcharts import fmt_value, heatmap_figures, line_figures, metric_exists, pareto_figure, short
from servesim.report.sweepdata import SweepData, check_names, default_metrics, default_pareto, direction, read_sweep

MAX_LINE_AXES = 3


def parse_pair(text: str | None) -> tuple[str, str] | None:
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 2 or not all(parts):
        raise ReportError(f"--pareto {text!r}: give two metrics as X,Y (e.g. ttft_p99,req_per_s)")
    return parts[0], parts[1]


def sweep_sections(sd: SweepData, metrics: list[str] | None = None, x: str | None = None, y: str | None = None,
                   pareto: tuple[str, str] | None = None):
    """(sections, front table rows) of a sweep report; names the user gave are checked first."""
    check_names(sd, metrics, [a for a in (x, y) if a])
    if pareto:
        for m in pareto:
            if not metric_exists(sd, m):
                raise ReportError(f"--pareto: {m!r} is not a metric of this sweep (it holds: {', '.join(sd.metrics)}"
                                  f"{'; gpus' if metric_exists(sd, 'gpus') else ''})")
    metrics = metrics or default_metrics(sd)
    moving = [a for a in sd.axes if sd.rows[a].nunique() > 1]
    sections = []
    hx = x or (moving[0] if moving else None)
    hy = y or next((a for a in moving if a != hx), None)
    if hx and hy and hx != hy:
        sections.append(("Heatmaps", heatmap_figures(sd, metrics, hx, hy)))
    line_axes = [x] if x else moving[:MAX_LINE_AXES]
    lines = line_figures(sd, metrics, line_axes)
    if lines:
        sections.append(("Metrics against each parameter", lines))
    pair = pareto or default_pareto(sd)
    front_rows = []
    if pair:
        fig, st = pareto_figure(sd, *pair)
        sections.append(("Pareto frontier", [fig]))
        for r in st[st["front"]].sort_values("x").to_dict("records"):
            front_rows.append([str(int(r["point"]))] + [escape(fmt_value(r[a])) for a in sd.axes]
                              + [tables.num(r["x"], ",.4g"), tables.num(r["y"], ",.4g"), str(int(r["n"]))])
    return sections, pair, front_rows


def sweep_page(sd: SweepData, sections, pair, front_rows) -> str:
    lo, hi = sd.seeds_per_point
    counts = (f"{sd.rows['point'].nunique():,} points x {lo if lo == hi else f'{lo}-{hi}'} seeds = {len(sd.rows):,} "
              f"runs; axes: {', '.join(sd.axes)}")
    head = ["<h2>Sweep</h2>", f"<p>{escape(counts)}</p>"]
    if sd.invalid_points:
        head.append(f"<p>{sd.invalid_points:,} points were set aside as invalid (invalid.csv).</p>")
    if sd.failed_rows:
        head.append(f"<p>{sd.failed_rows:,} rows record a failed run and are not drawn.</p>")
    head.append(f"<p>Metrics held: {escape(', '.join(sd.metrics))}.</p>")
    if sd.spec_text:
        head.append(f"<details><summary>spec.yaml</summary><pre>{escape(sd.spec_text)}</pre></details>")
    footer = ""
    if pair and front_rows:
        xm, ym = pair
        footer = (f"<h3>Points on the front ({escape(ym)} {direction(ym)}, {escape(xm)} {direction(xm)})</h3>"
                  + tables.table(["point"] + [escape(short(a, sd.axes)) for a in sd.axes]
                                 + [escape(xm), escape(ym), "seeds"], front_rows, "num"))
    return render(f"servesim sweep · {sd.folder.name}", str(sd.folder), "\n".join(head), sections, footer)


def write_sweep_report(folder: str | Path, formats=("html",), metrics: list[str] | None = None,
                       x: str | None = None, y: str | None = None, pareto: str | None = None,
                       out: str | Path | None = None) -> list[Path]:
    """Report of the sweep in ``folder`` (a sweep folder or one parquet file of rows), written
    into ``out`` (default: the sweep folder, or the parquet file's folder)."""
    fmts = parse_formats(formats)
    sd = read_sweep(folder)
    sections, pair, front_rows = sweep_sections(sd, metrics, x, y, parse_pair(pareto))
    if not sections:
        raise ReportError(f"{folder}: nothing to draw (no axis moves, or no metric has a value)")
    target = Path(out) if out is not None else (sd.folder if sd.folder.is_dir() else sd.folder.parent)
    return write_outputs(sections, target, fmts, lambda: sweep_page(sd, sections, pair, front_rows))
