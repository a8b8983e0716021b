"""Sweeps in this process: simulate_many, the store (append, dedupe, resume), replicated runs."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

import servesim
from servesim.cli import app
from servesim.metrics.flat import METRIC_NAMES, flat_metrics
from servesim.sweep.executor import SerialExecutor
from servesim.sweep.runner import run_sweep
from servesim.sweep.spec import spec_from_dict
from servesim.sweep.store import SweepStore, load_results
from tests.conftest import BASE, REPO, scenario


def test_simulate_many_rows_equal_single_runs():
    sc = scenario()
    df = servesim.simulate_many(sc, {"workload.arrival.rate": [5.0, 20.0], "engine.max_num_seqs": [1, 8]}, seeds=2)
    assert len(df) == 8
    assert list(df.columns[:6]) == ["point", "key", "seed", "replication", "workload.arrival.rate",
                                    "engine.max_num_seqs"]
    assert set(METRIC_NAMES) <= set(df.columns)
    for _, row in df.iterrows():
        one = servesim.simulate(sc.override({"workload.arrival.rate": row["workload.arrival.rate"],
                                             "engine.max_num_seqs": int(row["engine.max_num_seqs"])}),
                                seed=int(row["seed"]))
        flat = flat_metrics(one.summary)
        for k in ("ttft_p99", "queue_mean", "req_per_s", "iterations"):
            assert row[k] == flat[k] or (math.isnan(row[k]) and math.isnan(flat[k]))
    assert sorted(df["seed"].unique()) == [1, 2]  # seed + 0, seed + 1 at every point


def test_simulate_many_points_list_and_metrics():
    sc = scenario()
    df = servesim.simulate_many(sc, [{"engine.max_num_seqs": 2}, {"engine.max_num_seqs": 2, "seed": 7}],
                                seeds=[3], metrics=["ttft_p99", "completed"])
    assert list(df["point"]) == [0, 1] and list(df["seed"]) == [3, 3]
    assert df.loc[0, "ttft_p99"] == df.loc[1, "ttft_p99"]  # the scenario seed is unused when seeds are given
    assert "e2e_p99" not in df.columns and df["completed"].tolist() == [50.0, 50.0]


def test_simulate_many_bad_input_one_line():
    sc = scenario()
    with pytest.raises(servesim.ServesimError, match=r"point 1 \(engine.max_num_seqs=0\)"):
        servesim.simulate_many(sc, {"engine.max_num_seqs": [1, 0]})
    with pytest.raises(servesim.ServesimError, match="is not a metric"):
        servesim.simulate_many(sc, {"engine.max_num_seqs": [1]}, metrics=["p99"])
    with pytest.raises(servesim.ServesimError, match="give a count"):
        servesim.simulate_many(sc, {"engine.max_num_seqs": [1]}, seeds=0)


def test_summary_frame_is_one_flat_row():
    res = servesim.simulate(scenario(), seed=4)
    f = res.summary_frame()
    assert len(f) == 1 and f.loc[0, "seed"] == 4
    assert f.loc[0, "ttft_p99"] == res.summary["latency_s"]["ttft"]["p99"]
    assert f.loc[0, "completed"] == res.summary["requests"]["completed"]


# ------------------------------------------------------------------------------------- store
def small_spec(values, seeds=2):
    return spec_from_dict({"base": BASE, "axes": {"engine.max_num_seqs": values}, "seeds": seeds,
                           "metrics": ["ttft_p99", "completed"]}, "s.yaml", REPO)


class Counting(SerialExecutor):
    """This process, counting what it runs, optionally interrupted after ``stop_after`` tasks."""

    def __init__(self, stop_after: int | None = None):
        self.ran, self.stop_after = [], stop_after

    def map_unordered(self, fn, items, key=None):
        for it in items:
            if self.stop_after is not None and len(self.ran) == self.stop_after:
                raise KeyboardInterrupt
            self.ran.append(it.id)
            yield it, fn(it)


def test_resume_skips_finished_points(tmp_path):
    ex = Counting()
    first = run_sweep(small_spec([1, 2]), tmp_path, ex)
    assert len(ex.ran) == 4 and first.report.skipped == 0
    ex2 = Counting()
    more = run_sweep(small_spec([1, 2, 4, 8]), tmp_path, ex2)
    assert len(ex2.ran) == 4 and more.report.skipped == 4  # only the two new points ran
    assert {k for k, _ in ex2.ran} == {p.key for p in more.spec.points[2:]}
    df = load_results(tmp_path)
    assert len(df) == 8 and not df.duplicated(["key", "seed"]).any()
    cols = ["point", "key", "seed", "replication", "engine.max_num_seqs", "ttft_p99", "completed"]
    pd.testing.assert_frame_equal(df[cols], more.frame[cols])


def test_interrupted_sweep_keeps_finished_rows_and_resumes(tmp_path):
    sp = small_spec([1, 2, 3], seeds=2)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(sp, tmp_path, Counting(stop_after=4))
    assert len(SweepStore(tmp_path).read()) == 4  # flushed on the way out
    ex = Counting()
    done = run_sweep(sp, tmp_path, ex)
    assert len(ex.ran) == 2 and done.report.skipped == 4 and len(done.frame) == 6
    whole = run_sweep(sp, tmp_path / "fresh", Counting())
    cols = [c for c in whole.frame.columns if c != "wall_s"]
    pd.testing.assert_frame_equal(done.frame[cols], whole.frame[cols])


def test_store_dedupes_tasks_on_write_and_read(tmp_path):
    st = SweepStore(tmp_path)
    row = {"key": "k", "seed": 1, "x": 1.0}
    assert st.add(row) and not st.add(dict(row, x=2.0)) and st.duplicates == 1
    st.flush()
    # a second writer (a task presumed lost that finished anyway) writes the same task again
    other = SweepStore(tmp_path)
    other._held.clear()
    other.add(dict(row, x=3.0))
    other.flush()
    assert len(st.parts()) == 2
    df = SweepStore(tmp_path).read()
    assert len(df) == 1 and df.loc[0, "x"] == 1.0
    st.compact()
    assert len(st.parts()) == 1 and len(SweepStore(tmp_path).read()) == 1


def test_duplicate_configurations_run_once_and_keep_their_points(tmp_path):
    ex = Counting()
    out = run_sweep(small_spec([2, 4, 2], seeds=1), tmp_path, ex)
    assert len(ex.ran) == 2 and list(out.frame["point"]) == [0, 1, 2]
    assert out.frame.loc[0, "ttft_p99"] == out.frame.loc[2, "ttft_p99"]


def test_dict_axis_values_are_stored_as_json(tmp_path):
    sp = spec_from_dict({"base": BASE, "axes": {"workload.prompt": [{"dist": "fixed", "value": 8},
                                                                    {"dist": "fixed", "value": 32}]}},
                        "s.yaml", REPO)
    out = run_sweep(sp, tmp_path, SerialExecutor())
    assert [json.loads(v)["value"] for v in out.frame["workload.prompt"]] == [8, 32]


# -------------------------------------------------------------------------- run --seeds N
def test_run_with_seeds_prints_intervals_and_writes_them(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({**BASE, "stop": {"requests": 60, "warmup_requests": 5}}))
    res = CliRunner().invoke(app, ["run", str(f), "--seeds", "4", "--out", str(tmp_path / "o"), "--workers", "1"])
    assert res.exit_code == 0, res.stdout + res.stderr
    assert "4 replications" in res.stdout and "±" in res.stdout and "p99.9" in res.stdout
    s = json.loads((tmp_path / "o/summary.json").read_text())
    assert s["seed"] == [1, 2, 3, 4] and s["replications"]["n"] == 4
    iv = s["intervals"]["ttft_p999"]
    per_seed = [json.loads((tmp_path / f"o/seeds/seed-{k}/summary.json").read_text()) for k in (1, 2, 3, 4)]
    vals = [p["latency_s"]["ttft"]["p999"] for p in per_seed]
    assert iv["estimate"] == pytest.approx(sum(vals) / 4) and iv["lo"] < iv["estimate"] < iv["hi"]
    assert s["latency_s"]["ttft"]["p999"] == pytest.approx(iv["estimate"])
    rows = pd.read_parquet(tmp_path / "o/replications.parquet")
    assert list(rows["seed"]) == [1, 2, 3, 4] and rows["ttft_p999"].tolist() == pytest.approx(vals)
    # the console line for P99 TTFT shows the estimate and the half-width, rounded alike
    from servesim.report.console import pm_seconds

    p99 = s["intervals"]["ttft_p99"]
    assert pm_seconds(p99["estimate"], p99["half_width"]) in res.stdout


def test_stop_replications_in_the_scenario(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({**BASE, "stop": {"requests": 30, "replications": 3}}))
    res = CliRunner().invoke(app, ["run", str(f), "--out", str(tmp_path / "o"), "-q", "--workers", "1"])
    assert res.exit_code == 0, res.stderr
    assert json.loads((tmp_path / "o/summary.json").read_text())["replications"]["seeds"] == [1, 2, 3]


def test_pm_formats():
    from servesim.report.console import pm, pm_seconds

    assert pm_seconds(1.2345, 0.05) == "1.23 s ± 0.05"
    assert pm_seconds(0.0412, 0.0009) == "41.2 ms ± 0.9"
    assert pm_seconds(0.777, 0.163) == "777 ms ± 163"
    assert pm_seconds(1.234, 0.013) == "1.23 s ± 0.01"
    assert pm(1000.0, 0.0) == "1,000 ± 0" and pm(2.0, float("nan")) == "2"
    assert pm_seconds(None, None) == "-"


def test_points_progress_shows_done_rate_and_eta_without_counting_resumed_runs():
    """The sweep's bar: done/total, runs per minute, ETA. 100 runs found stored on resume are done
    from the start: 2 runs 0.2 s apart give at most 300 runs/min, not thousands."""
    import re
    import time

    from rich.console import Console

    from servesim.report.progress import PointsProgress

    con = Console(record=True, width=120, force_terminal=False)
    with PointsProgress(con, "sweep", "runs") as bar:
        bar(100, 110)
        time.sleep(0.2)
        bar(101, 110)
        time.sleep(0.2)
        bar(102, 110)
    text = con.export_text()
    assert "102/110 runs" in text, text
    m = re.search(r"([\d,.]+) runs/min", text)
    assert m and 20 < float(m.group(1).replace(",", "")) <= 300.0, text
    assert re.search(r"ETA \d+:\d\d:\d\d", text), text


def test_sweep_cli_runs_then_resumes_with_nothing_to_do(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"base": BASE, "axes": {"engine.max_num_seqs": [1, 2, 4]}, "seeds": 2,
                                    "metrics": ["ttft_p99"]}, sort_keys=False))
    args = ["sweep", str(spec), "--out", str(tmp_path / "o"), "--workers", "1"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.stdout + first.stderr
    assert "3 points (grid) x seeds = 6 runs" in first.stdout and "6 runs now, 0 already stored" in first.stdout
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and "every run is stored already" in again.stdout
    assert "0 runs now, 6 already stored" in again.stdout
    df = load_results(tmp_path / "o")
    assert len(df) == 6 and list(df.columns[:5]) == ["point", "key", "seed", "replication", "engine.max_num_seqs"]


def test_per_class_metrics_in_rows_and_intervals():
    from servesim.metrics.flat import check_metric_name
    from servesim.sweep.replicate import replicate
    from tests.test_capacity import two_stream_md1

    sc = two_stream_md1(300)
    rep = replicate(sc, [1, 2, 3])
    vals = [s["by_class"]["A"]["latency_s"]["ttft"]["p99"] for s in rep.summaries]
    iv = rep.summary["intervals"]["ttft_p99@A"]
    assert iv["estimate"] == pytest.approx(sum(vals) / 3) and iv["n"] == 3
    assert "completed@B" in rep.summary["intervals"]
    df = servesim.simulate_many(sc, [{}], seeds=[1], metrics=["ttft_p99@A", "completed@B", "ttft_p99@Z"])
    assert df.loc[0, "ttft_p99@A"] == vals[0] and math.isnan(df.loc[0, "ttft_p99@Z"])  # no class Z: NaN
    assert check_metric_name("preemptions@A") and check_metric_name("ttft_p99@bad label")
