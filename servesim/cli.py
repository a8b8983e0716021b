"""Command line: parse, call the library, print. Nothing here computes results.

Bad input of any kind (scenario, override, trace, pack) prints one line starting with ``error:``
and exits with status 2, never a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from servesim.errors import ServesimError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="servesim: simulate LLM serving schedulers on calibrated GPU models.")
err_console = Console(stderr=True)
console = Console()


def _fail(message: str, code: int = 2) -> None:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@app.command()
def run(
    scenario: Path = typer.Argument(..., help="scenario YAML file"),
    seed: Optional[int] = typer.Option(None, "--seed", help="override the scenario's seed"),
    out: Optional[Path] = typer.Option(None, "--out", help="output folder (default: out/<name>)"),
    set_: Optional[List[str]] = typer.Option(None, "--set", help="override a field: dotted.path=YAML value"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="print only the output folder"),
) -> None:
    """Run one scenario; write requests.parquet, timeseries.parquet, summary.json and
    scenario.resolved.yaml (the scenario as run: re-running it reproduces summary.json)."""
    from servesim.report.console import print_header, print_summary, ProgressReporter
    from servesim.scenario import load_scenario
    from servesim.simulate import build, run_built

    try:
        sc = load_scenario(scenario, set_ or [])
        reporter = ProgressReporter(console, total=None, enabled=not quiet)
        built = build(sc, seed=seed, progress=reporter.update)
        reporter.total = len(built.workload)
        if not quiet:
            print_header(console, built)
        with reporter:
            res = run_built(built, seed)
    except ServesimError as exc:
        _fail(str(exc))
        return
    out_dir = res.write(out if out is not None else Path("out") / sc.name)
    if quiet:
        console.print(str(out_dir))
        return
    print_summary(console, res)
    console.print(f"wrote {out_dir}/requests.parquet, timeseries.parquet, summary.json, scenario.resolved.yaml")


@app.command()
def check(
    scenario: Path = typer.Argument(..., help="scenario YAML file"),
    set_: Optional[List[str]] = typer.Option(None, "--set", help="override a field: dotted.path=YAML value"),
) -> None:
    """Validate a scenario and print its header without running it."""
    from servesim.report.console import print_header
    from servesim.scenario import load_scenario
    from servesim.simulate import build

    try:
        sc = load_scenario(scenario, set_ or [])
        print_header(console, build(sc))
    except ServesimError as exc:
        _fail(str(exc))
    console.print("[green]ok[/]")


def _mount_optional() -> None:
    """Sub-commands that live with their own concern (calibration verbs)."""
    try:
        from servesim.perf.calibrate_cli import app as calibrate_app
    except ImportError:  # pragma: no cover - during development of that module
        return
    app.add_typer(calibrate_app, name="calibrate", help="Calibration packs: predict, validate, import.")


_mount_optional()


def main() -> None:
    try:
        app()
    except ServesimError as exc:  # raised outside a command's own handling
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    main()
