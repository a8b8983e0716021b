"""Run every reference experiment of issue 15 and write docs/reference-experiments.md's tables and
charts:

    python -m benchmarks.reference                      # everything (~30 min on 2 quiet cores)
    python -m benchmarks.reference --only B1,B2         # some experiments (others' blocks untouched)
    python -m benchmarks.reference --capacity rate      # skip the fleet-size searches (the slow part)
    python -m benchmarks.reference --quick --out /tmp/q --doc /tmp/q/doc.md   # a smoke run
    python -m benchmarks.reference --list               # the runs, and the file each comes from

Runs already stored under --out (same configuration) are not run again; --force runs them anyway.
Each run's files (requests.parquet, summary.json, ...) are under OUT/runs/<experiment>/<label>/.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.reference import capacity as cap
from benchmarks.reference import charts, claims, ranges, tables
from benchmarks.reference.doc import DocError, fill
from benchmarks.reference.execute import cached, execute, record_path
from benchmarks.reference.plan import REPO, Run, experiments


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.reference", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="",
                    help="comma-separated experiments: A-fleet, A-sessions, A-tiers, B1, B2, B3, B4, "
                         "ranges (the headlines' ranges, tornado charts and the claims table: short runs)")
    ap.add_argument("--out", default=str(REPO / "out" / "reference"), help="where runs and records go")
    ap.add_argument("--doc", default=str(REPO / "docs" / "reference-experiments.md"), help="the document to fill")
    ap.add_argument("--charts", default=None, help="folder of the PNG charts (default: beside --doc, <doc stem>/)")
    ap.add_argument("--workers", type=int, default=1, help="processes running simulations at once")
    ap.add_argument("--capacity", choices=("all", "rate", "none"), default="all",
                    help="experiment A's capacity searches: rate scale and fleet size, rate scale only, none")
    ap.add_argument("--force", action="store_true", help="run again what is stored")
    ap.add_argument("--quick", action="store_true", help="tiny runs (a smoke test: numbers not meant to be read)")
    ap.add_argument("--list", action="store_true", help="list the runs and exit")
    a = ap.parse_args(argv)
    if a.workers < 1:
        ap.error(f"--workers {a.workers}: must be at least 1")
    return a


class Progress:
    """One line per run: count, label, its wall time (or "stored"), elapsed, and an estimate of
    the time left from the runs simulated so far."""

    def __init__(self, total: int):
        self.total, self.done, self.t0 = total, 0, time.perf_counter()
        self.ran, self.to_run = 0, total

    def tick(self, run: Run, wall: float | None) -> None:
        self.done += 1
        if wall is None:
            self.to_run -= 1
        else:
            self.ran += 1
        el = time.perf_counter() - self.t0
        left = el / self.ran * (self.to_run - self.ran) if self.ran else 0.0
        took = "stored" if wall is None else f"{wall:6.1f} s"
        say(f"[{self.done:>3}/{self.total}] {run.exp:<10} {run.label:<28} {took}  "
            f"(elapsed {_hms(el)}, ~{_hms(left)} left)")


def _hms(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s // 60 % 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def say(msg: str) -> None:
    print(msg, flush=True)


def run_all(runs: list[Run], out: Path, workers: int, force: bool) -> dict[tuple[str, str], dict]:
    recs: dict[tuple[str, str], dict] = {}
    todo = []
    prog = Progress(len(runs))
    for r in runs:
        hit = None if force else cached(out, r)
        if hit is not None:
            recs[(r.exp, r.label)] = hit
            prog.tick(r, None)
        else:
            todo.append(r)
    if workers == 1:
        for r in todo:
            rec = execute(r, out)
            recs[(r.exp, r.label)] = rec
            prog.tick(r, rec["wall_s"])
        return recs
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=workers) as pool:
        futs = {pool.submit(execute, r, out): r for r in todo}
        for f in as_completed(futs):
            r = futs[f]
            rec = f.result()
            recs[(r.exp, r.label)] = rec
            prog.tick(r, rec["wall_s"])
    return recs


# ------------------------------------------------------------------------- offered load (A)
def offered_load(run: Run) -> list[dict]:
    """Each stream's prompt and output tokens per second as configured (means before clipping)."""
    from servesim.workload.dists import mean_length

    out = []
    for s in run.scenario.workload.streams or []:
        rate = s.arrival.rate * run.scenario.workload.rate_scale
        p, o = mean_length(s.prompt), mean_length(s.output)
        out.append({"stream": s.name, "rate": rate, "prompt_mean": p, "prompt_tok_s": rate * p,
                    "output_tok_s": rate * o})
    return out


def prefill_speeds(summaries_tok_s: float) -> list[dict]:
    """How fast one A100 (or a TP2 pair) prefills an 8,192-token prompt, from the packs."""
    import numpy as np

    from servesim import scenario_from_dict
    from servesim.perf.build import build_step_model

    rows = []
    for model in ("qwen3-8b", "qwen3-14b"):
        for tp in (1, 2):
            sc = scenario_from_dict({"model": model, "hardware": {"gpu": "a100-80g"},
                                     "engine": {"tensor_parallel_size": tp, "max_num_batched_tokens": 32768},
                                     "step_time": {"model": "pack", "cuda_graph": True}})
            t = build_step_model(sc).predict(np.array([8192]), np.array([0]))
            per_gpu = 8192 / t / tp
            rows.append({"model": model, "tp": tp, "prefill_8k_s": t, "tok_s_per_gpu": per_gpu,
                         "gpus_for_summaries": summaries_tok_s / per_gpu})
    return rows


# ------------------------------------------------------------------------------------- blocks
def _by_exp(recs: dict, exp: str, out: Path) -> dict[str, dict]:
    got = {lab: r for (e, lab), r in recs.items() if e == exp}
    return got


def _stored(out: Path, exp: str) -> dict[str, dict]:
    folder = out / "records" / exp
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))} if folder.is_dir() else {}


def build_blocks(exps, recs: dict, out: Path, caps: dict, chart_dir: Path, doc_dir: Path,
                 quick: bool, want_ranges: bool = False) -> dict[str, str]:
    blocks: dict[str, str] = {}
    ids = {e.id for e in exps}

    def chart(name: str, ch) -> None:
        if ch is None:
            return
        p = charts.save_png(ch, chart_dir / f"{name}.png")
        blocks[f"chart-{name}"] = f"![{name}]({p.relative_to(doc_dir).as_posix()})"

    if "A-fleet" in ids:
        r = _by_exp(recs, "A-fleet", out)
        spark = next(run for e in exps if e.id == "A-fleet" for run in e.runs)
        load = offered_load(spark)
        blocks["A-load"] = tables.fleet_load(load)
        summ = next((d["prompt_tok_s"] for d in load if d["stream"] == "summaries"), 0.0)
        blocks["A-prefill"] = tables.prefill_speed(prefill_speeds(summ))
        blocks["A-fleet"] = tables.fleet_results(r)
        blocks["A-fleet-kv"] = tables.fleet_kv(r)
        if caps.get("rate") or caps.get("fleet"):
            blocks["A-capacity"] = tables.capacity(caps.get("rate", []), caps.get("fleet", []))
        chart("a_fleet", charts.fleet(r))
    if "A-sessions" in ids:
        r = _by_exp(recs, "A-sessions", out)
        blocks["A-sessions"] = tables.sessions(r)
        blocks["A-rounds"] = tables.rounds(r)
        chart("a_sessions", charts.sessions(r))
    if "A-tiers" in ids:
        r = _by_exp(recs, "A-tiers", out)
        blocks["A-tiers"] = tables.tiers(r)
        chart("a_tiers", charts.tiers(r))
    if "B1" in ids:
        r = _by_exp(recs, "B1", out)
        blocks["B1-latency"] = tables.closed_latency(r)
        blocks["B1-throughput"] = tables.closed_throughput(r)
        chart("b1_closed", charts.closed(r))
    b2 = _by_exp(recs, "B2", out) if "B2" in ids else _stored(out, "B2")
    if "B2" in ids:
        blocks["B2-ttft"] = tables.mix_latency(b2, "ttft")
        blocks["B2-e2e"] = tables.mix_latency(b2, "e2e")
        blocks["B2-run"] = tables.mix_run(b2)
        blocks["B2-waits"] = tables.waits(b2)
        if caps.get("mix"):
            blocks["B2-capacity"] = tables.mix_capacity(caps["mix"])
    if "B3" in ids:
        r = _by_exp(recs, "B3", out)
        blocks["B3"] = tables.abnormal(r, b2)
        blocks["B3-waits"] = tables.waits(r)
        blocks["B3-run"] = tables.mix_run(r)
    if "B2" in ids or "B3" in ids:
        b3 = _by_exp(recs, "B3", out) if "B3" in ids else _stored(out, "B3")
        chart("b2_b3_mix", charts.mix(b2, b3))
    if "B4" in ids:
        r = _by_exp(recs, "B4", out)
        blocks["B4"] = tables.knobs(r)
        chart("b4_knobs", charts.knobs(r))
    if want_ranges:
        blocks.update(ranges.blocks(recs, chart))
        ctx = {"phys": claims.physics(), "recs": recs, "ranges": ranges.summary_rows(recs),
               "spans": ranges.spans(recs), "settings": ranges.setting_values(recs)}
        blocks["claims"] = claims.table(ctx)
    stamp = "quick smoke run: numbers not meant to be read" if quick else "generated"
    for k in list(blocks):
        if not k.startswith("chart-"):
            blocks[k] = blocks[k] + f"\n\n<sub>{stamp} by `python -m benchmarks.reference`</sub>"
    return blocks


def run_capacity(exps, out: Path, mode: str, quick: bool, force: bool) -> dict:
    """Experiment A: each 8B fleet's largest rate scale and, with --capacity all, the fleet size
    for the full rate. Experiment B2: each engine and model's largest rate of the mix."""
    caps: dict = {"rate": [], "fleet": [], "mix": []}
    if mode == "none":
        return caps
    budget = cap.Budget(seeds=2, max_seeds=2, tol=0.5, fleet_duration_s=4.0, fleet_limit=48) if quick else cap.Budget()
    mix_exp = next((e for e in exps if e.id == "B2"), None)
    for r in (mix_exp.runs[:1] if quick else mix_exp.runs) if mix_exp else []:
        say(f"capacity: B2 {r.label}: largest rate of the mix meeting every stream's SLO")
        # probes of a fixed size (2,700 requests: 30 minutes at 1.5 req/s), so a low rate is not
        # judged on a handful of requests
        sized = replace(r, scenario=r.scenario.override(
            {"stop": {"requests": 120 if quick else 2700, "warmup_requests": 10 if quick else 100}}, source="capacity"))
        caps["mix"].append(cap.max_rate(sized, out, cap.Budget(seeds=4, max_seeds=16, tol=0.1) if not quick else budget,
                                        say, force))
    fleet_exp = next((e for e in exps if e.id == "A-fleet"), None)
    if fleet_exp is None:
        return caps
    arms = [r for r in fleet_exp.runs if r.tags["model"] == "qwen3-8b"]
    if quick:
        arms = arms[:1]
    for r in arms:
        say(f"capacity: {r.label}: largest rate scale meeting every stream's SLO")
        caps["rate"].append(cap.max_rate(r, out, budget, say, force))
        if mode == "all":
            say(f"capacity: {r.label}: fewest replicas carrying the full rate")
            caps["fleet"].append(cap.fleet_size(r, out, budget, say, force))
    return caps


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    only = [s for s in a.only.split(",") if s]
    want_ranges = not only or "ranges" in only
    only = [s for s in only if s != "ranges"]
    try:
        exps = experiments(only or None, quick=a.quick) if (only or not a.only) else []
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # the ranges are short runs already (issue 33): --quick does not shrink them further
    runs = [r for e in exps for r in e.runs] + (ranges.all_runs() if want_ranges else [])
    if a.list:
        for r in runs:
            print(f"{r.exp:<10} {r.label:<28} {r.source}")
        return 0
    out = Path(a.out)
    doc = Path(a.doc)
    if not doc.is_file():
        print(f"error: --doc {doc}: no such file (the document whose generated blocks are filled)", file=sys.stderr)
        return 2
    chart_dir = Path(a.charts) if a.charts else doc.with_suffix("")
    t0 = time.perf_counter()
    names = [e.id for e in exps] + (["ranges"] if want_ranges else [])
    say(f"{len(runs)} runs in {len(names)} experiments ({', '.join(names)}); results under {out}")
    recs = run_all(runs, out, a.workers, a.force)
    caps = run_capacity(exps, out, a.capacity, a.quick, a.force)
    blocks = build_blocks(exps, recs, out, caps, chart_dir, doc.parent, a.quick, want_ranges)
    try:
        doc.write_text(fill(doc.read_text(), blocks))
    except DocError as exc:
        print(f"error: {doc}: {exc}", file=sys.stderr)
        return 2
    say(f"wrote {len(blocks)} blocks of {doc} and its charts in {chart_dir} ({_hms(time.perf_counter() - t0)} in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
