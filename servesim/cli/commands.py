"""The ``servesim`` verbs: parse, call the library, print. Nothing here computes results.

Bad input of any kind (scenario, override, trace, pack) prints one line starting with ``error:``
and exits with status 2, never a traceback. Ctrl-C during ``run`` stops the simulation at the
next iteration boundary and writes what ran, marked ``"partial": true`` in summary.json, with a
line saying so (status 130); before the run or at a second Ctrl-C nothing is written.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from servesim.cli.output import console, error_line, fail, print_folder, run_writer, written_line
from servesim.errors import ServesimError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="servesim: simulate LLM serving schedulers on calibrated GPU models.")
INTERRUPTED = 130  # the shell's status for a run ended by SIGINT (128 + 2)


def _place(check, *args, **kw):
    """An output-place check of servesim/sweep/places.py; its refusal is the error line."""
    from servesim.sweep import places

    try:
        return getattr(places, check)(*args, **kw)
    except ServesimError as exc:
        fail(str(exc))


def _check_seed(seed: Optional[int]) -> None:
    from servesim.fields import MAX_SEED

    if seed is not None and not 0 <= seed <= MAX_SEED:
        fail(f"--seed {seed}: a seed is an integer in 0..{MAX_SEED}")


@app.command()
def run(
    scenario: Path = typer.Argument(..., help="scenario YAML file"),
    seed: Optional[int] = typer.Option(None, "--seed", help="override the scenario's seed"),
    out: Optional[str] = typer.Option(None, "--out", help="output folder (default: out/<name>)"),
    force: bool = typer.Option(False, "--force", help="replace the run an existing --out folder holds"),
    set_: Optional[List[str]] = typer.Option(None, "--set", help="override a field: dotted.path=YAML value"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="print only the output folder"),
    report: bool = typer.Option(False, "--report", help="also write report.html (charts) into the output folder"),
    format_: Optional[List[str]] = typer.Option(None, "--format", help="with --report: html (default), png, svg; "
                                                "several as html,png (png/svg go to charts/)"),
    seeds: Optional[int] = typer.Option(None, "--seeds", help="independent replications (seeds seed..seed+N-1): "
                                        "every figure with a confidence interval (default: stop.replications)"),
    workers: Optional[int] = typer.Option(None, "--workers", help="with --seeds: local processes for the "
                                          "replications (default: one per core; 1: this process)"),
    scheduler: Optional[str] = typer.Option(None, "--scheduler", help="a dask scheduler, tcp://HOST:PORT: the "
                                            "fleet runs sharded over its workers (sim.workers of them, or all)"),
) -> None:
    """Run one scenario; write requests.parquet, timeseries.parquet, summary.json and
    scenario.resolved.yaml (the scenario as run: re-running it reproduces summary.json)."""
    from servesim.report.progress import ProgressReporter
    from servesim.scenario import load_scenario
    from servesim.simulate import build, run_built

    _check_seed(seed)
    out = _place("out_path", out)
    if format_ and not report:
        fail("--format applies to the report; add --report (or run servesim report DIR --format ...)")
    if report:
        _check_formats(format_)
    try:
        sc = load_scenario(scenario, set_ or [])
        out_dir = out if out is not None else Path("out") / sc.name
        _place("check_out", out_dir, force)  # before the run: a bad folder must not cost a whole run
        n = sc.stop.replications if seeds is None else seeds
        from servesim.scenario import MAX_REPLICATIONS

        if not 1 <= n <= MAX_REPLICATIONS:  # (stop.replications' own bound)
            fail(f"--seeds {n}: allowed 1 to {MAX_REPLICATIONS:,} replications")
        if n > 1 and scheduler is not None:
            fail("--scheduler shards one run's fleet; with --seeds the replications run on local processes "
                 "(--workers)")
        if n > 1:
            _run_replicated(sc, seed, n, out_dir, quiet, workers, (format_ or ["html"]) if report else None)
            return
        reporter = ProgressReporter(None if quiet else console(), total=None)
        built = build(sc, seed=seed, progress=reporter.update, cold="auto", scheduler=scheduler)
        built.replica.stop_on_interrupt = True  # Ctrl-C: stop at the next boundary, keep what ran
        reporter.total = len(built.workload)
        if not quiet:
            from servesim.report.console import print_header

            print_header(console(), built)
            _say_if_compiling(built)
        with reporter:
            res = run_built(built, seed)
    except ServesimError as exc:
        fail(str(exc))
        return
    except MemoryError:
        fail(f"{scenario}: out of memory building or running the simulation; ask for fewer requests "
              f"(stop.requests) or a shorter run")
        return
    except KeyboardInterrupt:
        fail("interrupted (Ctrl-C) before the run had results to keep; nothing written", INTERRUPTED)
        return
    except Exception as exc:
        from servesim.errors import kernel_typing_line

        why = kernel_typing_line(exc)
        if why is None:
            raise
        fail(why)
        return
    partial = built.replica.interrupted
    if partial:
        res.summary["partial"] = True
    from servesim.engine.driver import HeldInterrupt

    try:
        with HeldInterrupt() as held:  # a Ctrl-C now waits: the folder gets every file, or none new
            out_dir = res.write(out_dir)
    except OSError as exc:
        fail(f"--out {out_dir}: writing the results failed ({exc.strerror or exc})")
        return
    written = []
    if report:
        from servesim.report.build import write_run_report

        written = run_writer(lambda: write_run_report(out_dir, format_ or ["html"]))
    if quiet:
        print_folder(out_dir)
    else:
        from servesim.report.console import print_summary

        print_summary(console(), res)
        console().print(f"wrote {out_dir}/requests.parquet, timeseries.parquet, summary.json, scenario.resolved.yaml",
                         markup=False)
        if written:
            console().print(written_line(written), markup=False)
    if partial:
        r = res.summary["requests"]
        from rich.text import Text

        console(stderr=True).print(
            Text(f"interrupted (Ctrl-C) at simulated time {res.summary['sim_time_s']:,.3f} s: partial results, "
                 f"{r['completed'] + r['rejected']:,} of {len(built.workload):,} requests ended, "
                 f"{r['in_flight']:,} in flight; summary.json says \"partial\": true"), highlight=False, soft_wrap=True)
        raise typer.Exit(INTERRUPTED)
    if held.hit:
        from rich.text import Text

        console(stderr=True).print(Text("interrupted (Ctrl-C) while writing; the results were written whole"), highlight=False)
        raise typer.Exit(INTERRUPTED)


def _check_formats(formats: Optional[List[str]]) -> None:
    from servesim.report.page import parse_formats

    try:
        parse_formats(formats)
    except ServesimError as exc:
        fail(str(exc))


@app.command("report")
def report_cmd(
    path: Path = typer.Argument(..., help="a run folder, a sweep folder, or a sweep's parquet file of rows"),
    format_: Optional[List[str]] = typer.Option(None, "--format", help="html (default), png, svg; several as html,png"),
    out: Optional[str] = typer.Option(None, "--out", help="folder to write into (default: the run or sweep folder)"),
    metric: Optional[List[str]] = typer.Option(None, "--metric", help="sweeps: a metric to draw (repeat for more)"),
    x: Optional[str] = typer.Option(None, "--x", help="sweeps: the axis across (a dotted scenario path)"),
    y: Optional[str] = typer.Option(None, "--y", help="sweeps: the axis up the heatmaps"),
    pareto: Optional[str] = typer.Option(None, "--pareto", help="sweeps: X,Y metrics of the Pareto frontier, "
                                         "e.g. ttft_p99,req_per_s"),
) -> None:
    """Write report.html (charts; self-contained, opens offline) for a finished run or a sweep."""
    from servesim.report.build import write_report

    out = _place("out_path", out)
    written = run_writer(lambda: write_report(path, format_ or ["html"], metrics=metric, x=x, y=y,
                                                 pareto=pareto, out=out))
    console().print(written_line(written), markup=False)


@app.command()
def compare(
    runs: List[Path] = typer.Argument(..., help="two or more run folders; the first is the baseline"),
    out: str = typer.Option("out/compare", "--out", help="folder for report.html (and charts/)"),
    format_: Optional[List[str]] = typer.Option(None, "--format", help="html (default), png, svg; several as html,png"),
    label: Optional[List[str]] = typer.Option(None, "--label", help="a name per run, in order (default: folder names)"),
) -> None:
    """Overlay runs in the same charts, with a table of each run's change against the first."""
    from servesim.report.build import write_compare_report

    out = _place("out_path", out)
    written = run_writer(lambda: write_compare_report(runs, out, format_ or ["html"], label))
    console().print(written_line(written), markup=False)


REPORT_SEEDS = 12  # --report with --seeds overlays this many seeds' runs at most (a chart stays legible)


def _run_replicated(sc, seed: Optional[int], n: int, out_dir: Path, quiet: bool, workers: Optional[int],
                    report: Optional[List[str]] = None) -> None:
    """``report``: the formats of ``--report`` (None: no report); the report of a replicated run
    overlays its seeds' runs (``servesim compare``), the first REPORT_SEEDS of them."""
    from servesim.report.console import print_header, print_replicated_summary
    from servesim.report.progress import PointsProgress
    from servesim.simulate import build
    from servesim.sweep.executor import make_executor
    from servesim.sweep.replicate import replicate, replication_seeds

    seeds = replication_seeds(sc.seed if seed is None else seed, n)
    if not quiet:
        print_header(console(), build(sc, seed=seeds[0], cold="python"))  # a header: nothing to compile for
    with make_executor(workers) as ex, \
            PointsProgress(None if quiet else console(), "replications", "runs") as bar:
        rep = replicate(sc, seeds, executor=ex, out_dir=out_dir / "seeds", progress=bar)
    rep.write(out_dir)
    written, note = [], ""
    if report is not None:
        from servesim.report.build import write_compare_report

        shown = seeds[:REPORT_SEEDS]
        written = run_writer(lambda: write_compare_report(
            [out_dir / "seeds" / f"seed-{s}" for s in shown], out_dir, report or ["html"], [f"seed {s}" for s in shown]))
        note = (f" (the seeds' runs overlaid{'' if n <= REPORT_SEEDS else f', the first {REPORT_SEEDS} of {n}'}; "
                f"one seed alone: servesim report {out_dir}/seeds/seed-{seeds[0]})")
    if quiet:
        print_folder(out_dir)
        return
    print_replicated_summary(console(), rep.summary)
    console().print(f"wrote {out_dir}/summary.json (intervals), replications.parquet, "
                     f"seeds/seed-<seed>/ (each run's files)", markup=False)
    if written:
        console().print(written_line(written) + note, markup=False, soft_wrap=True)


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
        print_header(console(), build(sc, cold="auto"))  # (it says which engine a run would take)
    except ServesimError as exc:
        fail(str(exc))
    except MemoryError:
        fail(f"{scenario}: out of memory building the simulation; ask for fewer requests")
    console().print("[green]ok[/]")


def _say_if_compiling(built) -> None:
    """The progress line of a first compiled run on this machine (numba compiles before the
    first simulated iteration, for a minute or two, with nothing else to show)."""
    from servesim.jit import compiled_ready

    if built.replica.path == "compiled" and not compiled_ready():
        console().print("compiling the engine with numba: once per kernel version on this machine, 1-2 min on "
                         "two cores (later runs load it in about a second)...", markup=False)


# a tiny run that reaches the replica loop (one compiled specialization serves every built-in
# policy, allocator and step-time model: they are data, not types)
WARM_SCENARIO = {"name": "warm", "stop": {"requests": 20}, "sim": {"engine": "compiled"},
                 "engine": {"num_gpu_blocks_override": 64, "max_model_len": 512, "max_num_batched_tokens": 512},
                 "workload": {"arrival": {"process": "poisson", "rate": 50.0},
                              "prompt": {"dist": "uniform", "min": 1, "max": 100},
                              "output": {"dist": "uniform", "min": 1, "max": 20}}}


@app.command()
def warm() -> None:
    """Compile the engine for this machine now (1-2 min, once per version), in the foreground."""
    import time

    from servesim.jit import compiled_ready

    if compiled_ready():
        console().print("the compiled engine is already built on this machine", markup=False)
        return
    from servesim.scenario import scenario_from_dict
    from servesim.simulate import simulate

    console().print("compiling the engine with numba (1-2 min on two cores, once)...", markup=False)
    t0 = time.perf_counter()
    simulate(scenario_from_dict(WARM_SCENARIO, "warm"))
    console().print(f"done in {time.perf_counter() - t0:.0f} s", markup=False)


@app.command()
def sweep(
    spec: Path = typer.Argument(..., help="sweep spec YAML (docs/sweeps.md)"),
    out: str = typer.Option(..., "--out", help="folder for the results (re-running resumes there)"),
    workers: Optional[int] = typer.Option(None, "--workers", help="local worker processes (default: one per "
                                          "core; 1: this process)"),
    scheduler: Optional[str] = typer.Option(None, "--scheduler", help="a dask scheduler, tcp://HOST:PORT"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar; print only the folder"),
) -> None:
    """Run many configurations (a grid or a sampled design) x seeds on Dask; rows go to parquet in
    OUT as they finish; re-running skips what is there."""
    from servesim.report.progress import PointsProgress
    from servesim.sweep.executor import make_executor
    from servesim.sweep.runner import pending_tasks, raise_errors, run_sweep
    from servesim.sweep.spec import load_spec

    out = _place("out_path", out)
    _place("check_out", out, False, kind="sweep")  # before the spec's points are validated and run
    try:
        sp = load_spec(spec)
        if not sp.points:  # every point set aside by invalid: skip -- not "every run is stored already"
            fail(f"{spec}: all {len(sp.invalid_points):,} points of the design are invalid, nothing to run; "
                  f"the first: {sp.invalid_points[0][2]}")
        tasks = sum(len(sp.seeds_of(p)) for p in sp.points)
        if not quiet:
            extra = "".join([f", {sp.duplicates} repeated configurations run once" if sp.duplicates else "",
                             f", {len(sp.invalid_points)} invalid points skipped (see invalid.csv)"
                             if sp.invalid_points else ""])
            console().print(f"sweep {sp.name}: {len(sp.points):,} points ({sp.design}) x seeds = {tasks:,} runs{extra}")
        todo = pending_tasks(sp, out)
        with make_executor(workers if todo else 1, scheduler if todo else None) as ex:
            if not quiet:
                console().print(f"{todo:,} to run on {ex.description}" if todo else "every run is stored already")
            with PointsProgress(None if quiet else console(), "sweep", "runs") as bar:
                try:
                    res = run_sweep(sp, out, ex, progress=bar, spec_text=spec.read_text())
                except KeyboardInterrupt:
                    console(stderr=True).print(f"interrupted: finished runs are stored in {out}; "
                                                f"run the same command again to resume")
                    raise typer.Exit(130)
        raise_errors(res.report)
    except ServesimError as exc:
        fail(str(exc))
        return
    r = res.report
    if quiet:
        print_folder(out)
        return
    console().print(f"{r.ran:,} runs now, {r.skipped:,} already stored; {len(res.frame):,} rows "
                     f"in {out}/rows (servesim.sweep.load_results('{out}'))")


@app.command()
def capacity(
    scenario: Path = typer.Argument(..., help="scenario YAML file"),
    slo: Optional[List[str]] = typer.Option(None, "--slo", help="METRIC=VALUE (at most) or METRIC>=VALUE, per class "
                                            "METRIC@CLASS=VALUE; repeat for several"),
    scenario_slos_: bool = typer.Option(True, "--scenario-slos/--no-scenario-slos",
                                        help="also meet the SLOs the scenario's streams state, per class"),
    find: str = typer.Option("max-rate", "--find", help="max-rate | min-replicas"),
    set_: Optional[List[str]] = typer.Option(None, "--set", help="override a field: dotted.path=YAML value"),
    seeds: int = typer.Option(5, "--seeds", help="replications per probe to start with (and to add while open)"),
    max_seeds: int = typer.Option(30, "--max-seeds", help="replications per probe at most"),
    confidence: float = typer.Option(0.95, "--confidence", help="confidence of the intervals"),
    tol: float = typer.Option(0.05, "--tol", help="max-rate: stop when pass and fail rates are this close (relative)"),
    workers: Optional[int] = typer.Option(None, "--workers", help="local processes for each probe's replications "
                                          "(default: one per core; 1: this process)"),
    scheduler: Optional[str] = typer.Option(None, "--scheduler", help="a dask scheduler, tcp://HOST:PORT"),
    out: Optional[str] = typer.Option(None, "--out", help="write the search as JSON to this file"),
    start: Optional[float] = typer.Option(None, "--start", help="first probe: a rate in req/s (a rate scale when "
                                          "the scenario's rate is not a request rate), or a replica count"),
    budget_: Optional[str] = typer.Option(None, "--budget", help="stop after N probes (20probes) or a wall time "
                                          "(90s, 15m, 1.5h), or both (20probes,15m)"),
    store: Optional[Path] = typer.Option(None, "--store", help="keep every run in this folder and reuse them when "
                                         "the search is asked again (another --tol, --budget or SLO)"),
) -> None:
    """The largest rate (or the fewest replicas) meeting every SLO, decided with replications and
    confidence intervals; the answer is where the binding SLO crosses its bound, with an interval.
    Refuses at once an SLO missed at zero load, and when the SLO is within the noise at its budget."""
    import json

    from servesim.report.console import print_capacity
    from servesim.scenario import load_scenario
    from servesim.sweep.capacity import (Budget, CapacityError, ProbeStore, check_slos, find_max_rate,
                                         find_min_replicas, merge_slos, parse_budget, parse_slo, preflight,
                                         scenario_slos)
    from servesim.sweep.executor import make_executor
    from servesim.sweep.ratescale import scaled_rates as scaled_of

    out = _place("out_path", out)
    if out is not None:  # before the search: a bad place must not cost every probe's runs
        _place("check_file_out", out)
    try:
        if find not in ("max-rate", "min-replicas"):
            raise CapacityError(f"--find {find!r}: allowed: max-rate, min-replicas")
        sc = load_scenario(scenario, set_ or [])
        slos = merge_slos([parse_slo(t) for t in slo or []], scenario_slos(sc) if scenario_slos_ else [])
        if not slos:
            raise CapacityError("no SLO to meet: give --slo METRIC=VALUE (e.g. --slo ttft_p99=0.8), or "
                                "slo targets on the scenario's streams")
        max_probes, max_time = parse_budget(budget_) if budget_ is not None else (None, None)
        budget = Budget(seeds, max_seeds, confidence, max_probes, max_time)
        budget.check()
        if start is not None and find == "min-replicas" and (start != int(start) or start < 1):
            raise CapacityError(f"--start {start:g}: with --find min-replicas, a whole number of replicas >= 1")
        check_slos(sc, slos)
        preflight(sc, find, tol)  # refusals that need no run come before any worker starts
        probes = ProbeStore(store) if store is not None else None
        say = _probe_printer()
        with make_executor(workers, scheduler) as ex:
            if find == "max-rate":
                res = find_max_rate(sc, slos, budget, tol=tol, executor=ex, progress=say, start=start, store=probes)
            else:
                res = find_min_replicas(sc, slos, budget, executor=ex, progress=say, store=probes,
                                        start=int(start) if start is not None else 1)
    except ServesimError as exc:
        fail(str(exc))
        return
    print_capacity(console(), res)
    if find == "max-rate" and res.scaled is not None:  # the scale moves no request rate stated exactly
        at = f"; the answer, x{res.best.x:.4g}, is {scaled_of(sc, res.best.x)}" if res.answered else ""
        console().print(f"req/s are measured (requests arriving per second after the warm-up, mean over a "
                         f"probe's runs); the scale x1 is {res.scaled}{at}", soft_wrap=True, markup=False)
    if out is not None:
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(res.to_dict(), indent=2) + "\n")
        except OSError as exc:
            fail(f"--out {out}: writing the search failed ({exc.strerror or exc})")
    if not res.answered:
        raise typer.Exit(3)


@app.command()
def plan(
    plan_file: Path = typer.Argument(..., help="plan YAML: base scenario, choices, prices, SLOs (docs/sweeps.md)"),
    out: Optional[Path] = typer.Option(None, "--out", help="folder: plan.json, options and probe stores (resume), "
                                       "report.html"),
    trials: Optional[int] = typer.Option(None, "--trials", help="options to try at most (overrides search.trials)"),
    method: Optional[str] = typer.Option(None, "--method", help="auto | grid | optuna (overrides search.method)"),
    workers: Optional[int] = typer.Option(None, "--workers", help="local processes (default: one per core)"),
    scheduler: Optional[str] = typer.Option(None, "--scheduler", help="a dask scheduler, tcp://HOST:PORT"),
    formats: Optional[str] = typer.Option(None, "--format", help="report formats with --out: html (default), png, svg"),
) -> None:
    """The cheapest fleet meeting every SLO over a space of choices (GPU, precision, TP/PP,
    knobs, router): each option's fewest replicas (verified: one fewer fails) times its price."""
    import dataclasses
    import json

    from servesim.report.console import print_plan
    from servesim.report.page import parse_formats
    from servesim.report.planreport import write_plan_report
    from servesim.sweep.executor import make_executor
    from servesim.sweep.plan import METHODS, PlanError, load_plan, run_plan

    try:
        spec = load_plan(plan_file)
        if trials is not None:
            if trials < 1:
                raise PlanError(f"--trials {trials}: must be at least 1")
            spec = dataclasses.replace(spec, trials=trials)
        if method is not None:
            if method not in METHODS:
                raise PlanError(f"--method {method!r} (allowed: {', '.join(METHODS)})")
            spec = dataclasses.replace(spec, method=method)
        fmts = parse_formats(formats) if formats else ("html",)
        if out is not None and out.exists() and not out.is_dir():
            raise PlanError(f"--out {out}: is a file; give a folder")
        print(f"plan {spec.name}: {spec.resolved_method} over {spec.size} options, SLOs "
              f"{', '.join(str(s) for s in spec.slos)}", flush=True)
        with make_executor(workers, scheduler) as ex:
            res = run_plan(spec, executor=ex, out=out, progress=_probe_printer())
    except ServesimError as exc:
        fail(str(exc))
        return
    print_plan(console(), res)
    if out is not None:
        d = res.to_dict()
        (out / "plan.json").write_text(json.dumps(d, indent=2, default=str) + "\n")
        for p in write_plan_report(d, out, fmts):
            console().print(f"wrote {p}", markup=False)
    if res.best is None:
        raise typer.Exit(3)


def _probe_printer():
    """A line per finished probe, printed as it finishes (flushed: a log file or a pipe sees the
    search go on, not 12 silent minutes)."""
    def say(line: str) -> None:
        print(line, flush=True)

    return say


class _Commands(typer.core.TyperGroup):
    """The command group, with verbs that live in servesim.tools loaded when named: the offline
    tools (pandas, typer sub-apps) are the top floor, and a ``servesim run`` should not import
    them (tests/test_layering.py checks that importing this module leaves them out)."""

    LAZY = {"calibrate": ("servesim.tools.calibrate_cli", "Calibration packs: predict, validate, import.")}

    def list_commands(self, ctx):
        return sorted({*super().list_commands(ctx), *self.LAZY})

    def get_command(self, ctx, name):
        if name in self.LAZY and name not in self.commands:
            import importlib

            where, help_text = self.LAZY[name]
            command = typer.main.get_command(importlib.import_module(where).app)
            command.name, command.help = name, help_text
            self.add_command(command, name)
        return super().get_command(ctx, name)


app.info.cls = _Commands


def _is_usage_error(exc: BaseException) -> bool:
    """Click's UsageError (typer may vendor click: matched by name, not by import)."""
    return any(c.__name__ == "UsageError" for c in type(exc).__mro__) and hasattr(exc, "format_message")


def main(argv: Optional[List[str]] = None) -> None:
    """The ``servesim`` command. A usage mistake (an unknown option, ``--seed abc``, a missing
    argument) is bad input like any other: one ``error:`` line naming it, status 2 -- not a
    usage box."""
    try:
        code = app(args=argv, standalone_mode=False)
    except ServesimError as exc:  # raised outside a command's own handling
        error_line(str(exc))
        sys.exit(2)
    except Exception as exc:
        if not _is_usage_error(exc):
            raise
        message = exc.format_message()
        if message:  # (empty: servesim alone, which printed its help)
            names, ctx = [], getattr(exc, "ctx", None)
            while ctx is not None and ctx.parent is not None:  # the sub-command path, not the program
                names.insert(0, ctx.info_name)
                ctx = ctx.parent
            error_line(f"{message} (see {' '.join(['servesim', *names, '--help'])})")
        sys.exit(2)
    except KeyboardInterrupt:
        error_line("interrupted (Ctrl-C)")
        sys.exit(INTERRUPTED)
    sys.exit(code if isinstance(code, int) else 0)
