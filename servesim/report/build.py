"""Reports of runs: one run (``servesim report DIR``, ``servesim run --report``) or several
overlaid (``servesim compare A B ...``).

    runs ──► charts.run_figures (same figures, coloured by class or by run)
         ──► tables (header: scenario, pack provenance, summary; or the table of deltas)
         ──► page.render ──► DIR/report.html  (and/or DIR/charts/NN-slug.png|svg)
"""

from __future__ import annotations

from contextlib import contextmanager
from html import escape
from pathlib import Path

from servesim.version import __version__
from servesim.errors import ReportError
from servesim.report import tables
from servesim.report.charts import run_figures
from servesim.report.page import parse_formats, render, write_outputs
from servesim.report.rundata import RunData, load_run, unique_labels


def run_page(run: RunData, sections) -> str:
    s = run.summary
    rs = s.get("resolved_scenario") or {}
    sub = (f"seed {s.get('seed')} · folder {tables.folder_text(run.folder)} · servesim "
           f"{rs.get('servesim_version', '?')} (report by {__version__})")
    head = ['<h2>Summary</h2>', tables.summary_block(run), tables.latency_table(s), tables.class_table(s),
            tables.replica_table(s), '<h2>Scenario</h2>', tables.pack_provenance(s)]
    if rs.get("sha256"):
        head.append(f"<p><b>resolved scenario</b> sha256 <code>{escape(rs['sha256'])}</code> "
                    f"(re-run it: <code>servesim run scenario.resolved.yaml</code>)</p>")
    if run.resolved_yaml:
        head.append(tables.scenario_glance(run.resolved_yaml))
        head.append(f"<details><summary>scenario.resolved.yaml (the whole file)</summary>"
                    f"<pre>{escape(run.resolved_yaml)}</pre></details>")
    else:
        head.append('<p class="note">No scenario.resolved.yaml in this folder.</p>')
    return render(f"servesim · {s.get('scenario', run.label)}", sub, "\n".join(head), sections)


def write_run_report(folder: str | Path, formats=("html",), run: RunData | None = None,
                     out: str | Path | None = None) -> list[Path]:
    """Report of the run in ``folder``: ``report.html`` and/or ``charts/`` in ``out`` (default:
    the run's folder)."""
    fmts = parse_formats(formats)
    run = run if run is not None else load_run(folder)
    with _damaged([run]):
        sections = run_figures([run])
        return write_outputs(sections, Path(out if out is not None else folder), fmts,
                             lambda: run_page(run, sections))


@contextmanager
def _damaged(runs: list[RunData]):
    """A run folder whose files passed :func:`load_run`'s checks but still lack an entry a chart
    or table reads (hand-edited, damaged, or from another servesim version): one line naming the
    folders and the entry, never a KeyError traceback. Runs built in memory are left alone (an
    error there is servesim's own)."""
    try:
        yield
    except (KeyError, TypeError, IndexError, AttributeError) as exc:
        folders = [str(r.folder) for r in runs if r.folder is not None]
        if not folders:
            raise
        what = f"entry {exc.args[0]!r} missing" if isinstance(exc, KeyError) and exc.args else str(exc)
        raise ReportError(f"{', '.join(folders)}: a run file lacks what the report reads ({what}); damaged or "
                          f"written by another servesim version (re-run it from its scenario.resolved.yaml)") from None


def compare_page(runs: list[RunData], sections) -> str:
    names = ", ".join(escape(r.label) for r in runs)
    rows = [[escape(r.label), tables.folder_text(r.folder), escape(str(r.summary.get("scenario", ""))),
             escape(str(r.summary.get("seed", ""))),
             escape(str((r.summary.get("resolved_scenario") or {}).get("calibration_pack") or "none")),
             f"<code>{escape(str((r.summary.get('resolved_scenario') or {}).get('sha256', ''))[:12])}</code>"]
            for r in runs]
    head = ["<h2>Runs</h2>",
            tables.table(["run", "folder", "scenario", "seed", "calibration pack", "resolved sha256"], rows),
            tables.same_scenario_note(runs),
            "<h2>Differences</h2>",
            "<p>Each run against the first (the baseline): relative change, green where it is better, red where "
            "it is worse (no colour where better depends on what you want, e.g. KV usage).</p>",
            tables.delta_table(runs)]
    for r in runs:
        if r.resolved_yaml:
            head.append(f"<details><summary>{escape(r.label)}: scenario.resolved.yaml</summary>"
                        f"<pre>{escape(r.resolved_yaml)}</pre></details>")
    return render(f"servesim · comparing {len(runs)} runs", names, "\n".join(head), sections)


def load_runs(folders: list[str | Path], labels: list[str] | None = None) -> list[RunData]:
    if len(folders) < 2:
        raise ReportError(f"compare: give at least two run folders (got {len(folders)})")
    if labels and len(labels) != len(folders):
        raise ReportError(f"--label: {len(labels)} labels for {len(folders)} runs; give one per run, in order")
    names = labels or [Path(f).name or str(f) for f in folders]
    return [load_run(f, lab) for f, lab in zip(folders, unique_labels(list(names)))]


def write_compare_report(folders: list[str | Path], out: str | Path, formats=("html",),
                         labels: list[str] | None = None) -> list[Path]:
    """Runs overlaid in the same charts, with a table of deltas, written into ``out``."""
    fmts = parse_formats(formats)
    runs = load_runs(folders, labels)
    with _damaged(runs):
        sections = run_figures(runs)
        return write_outputs(sections, Path(out), fmts, lambda: compare_page(runs, sections))


REPORT_SEEDS = 12  # a replicated run's report overlays this many seeds' runs at most (a chart stays legible)


def write_report(path: str | Path, formats=("html",), *, metrics: list[str] | None = None, x: str | None = None,
                 y: str | None = None, pareto: str | None = None, out: str | Path | None = None) -> list[Path]:
    """``servesim report PATH``: a run folder, a sweep folder or a sweep's parquet file of rows.
    Sweep options given for a run are refused (they would be silently ignored)."""
    from servesim.report.rundata import is_run_folder
    from servesim.report.sweepdata import is_sweep_folder

    from servesim.report.capreport import is_capacity_json

    p = Path(path)
    if is_capacity_json(p):
        from servesim.report.capreport import write_capacity_report

        given = [name for name, v in (("--metric", metrics), ("--x", x), ("--y", y), ("--pareto", pareto)) if v]
        if given:
            raise ReportError(f"{', '.join(given)}: options of a sweep report; {p} is a capacity search")
        return write_capacity_report(p, formats, out)
    if is_sweep_folder(p) or (p.is_file() and p.suffix == ".parquet"):
        from servesim.report.sweepreport import write_sweep_report

        return write_sweep_report(p, formats, metrics, x, y, pareto, out)
    if p.is_dir() and (p / "seeds").is_dir() and (p / "replications.parquet").is_file() \
            and not (p / "requests.parquet").is_file():
        # a run replicated over seeds (servesim run --seeds N): its seeds' runs overlaid, as
        # `servesim run --seeds N --report` draws them
        seeds = sorted((d for d in (p / "seeds").iterdir() if d.is_dir() and d.name.startswith("seed-")),
                       key=lambda d: int(d.name.split("-", 1)[1]) if d.name.split("-", 1)[1].isdigit() else 0)
        if not seeds:
            raise ReportError(f"{p}: a replicated run without seed folders in {p / 'seeds'}")
        shown = seeds[:REPORT_SEEDS]
        return write_compare_report(shown, out if out is not None else p, formats,
                                    [d.name.replace("-", " ") for d in shown])
    given = [name for name, v in (("--metric", metrics), ("--x", x), ("--y", y), ("--pareto", pareto)) if v]
    if given and is_run_folder(p):
        raise ReportError(f"{', '.join(given)}: options of a sweep report; {p} is one run")
    return write_run_report(p, formats, out=out)
