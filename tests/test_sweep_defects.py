"""Defects found in sweeps and capacity answers (wrong results with exit status 0), each pinned by
the test that failed before its fix (docs/reliability.md, "Invariants"; docs/sweeps.md)."""

from __future__ import annotations

import collections
import json
import math

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

import servesim
from servesim.cli import app
from servesim.report.sweepdata import point_stats, read_sweep
from servesim.sweep import spec as spec_module
from servesim.sweep.capacity import SLO, Budget, find_max_rate
from servesim.sweep.design import Dimension, expand, parse_axis
from servesim.sweep.executor import SerialExecutor
from servesim.sweep.ratescale import base_rate, request_rate, scale_rate, scaled_rates
from servesim.sweep.runner import run_sweep
from servesim.sweep.spec import input_files, scenario_key, spec_from_dict
from servesim.sweep.store import load_results
from tests.conftest import BASE, REPO

SESSIONS = {**BASE, "stop": {"requests": 600, "warmup_requests": 60}, "engine": {**BASE["engine"], "max_num_seqs": 1},
            "workload": {"arrival": {"process": "poisson", "rate": 10.0},
                         "sessions": {"turns": {"dist": "fixed", "value": 4}, "think_s": 0.5,
                                      "think_dist": "exponential", "new_input": {"dist": "fixed", "value": 1},
                                      "output": {"dist": "fixed", "value": 1}}}}


# ------------------------------------------------------------ D5: capacity rates in requests
def test_capacity_on_sessions_answers_in_requests_not_session_starts(tmp_path):
    """4 turns a session at 10 session starts/s is ~40 req/s. Before: the answer and its JSON
    called 10 x scale "req/s" (13.54 "req/s" where runs measured 54.8)."""
    f = tmp_path / "sess.yaml"
    f.write_text(yaml.safe_dump(SESSIONS))
    res = CliRunner().invoke(app, ["capacity", str(f), "--slo", "queue_mean=0.01", "--seeds", "3", "--max-seeds", "6",
                                   "--tol", "0.3", "--workers", "1", "--out", str(tmp_path / "c.json")])
    assert res.exit_code == 0, res.stdout + res.stderr
    d = json.loads((tmp_path / "c.json").read_text())
    a = d["answer"]
    sc = servesim.scenario_from_dict(SESSIONS, "t").override({"workload.rate_scale": a["x"]})
    ran = np.mean([servesim.simulate(sc, seed=1 + i).summary["throughput"]["req_per_s"]
                   for i in range(a["replications"])])
    assert a["rate_req_per_s"] == pytest.approx(ran, rel=0.05), (a, ran)  # the request rate that ran
    assert a["rate_req_per_s"] == pytest.approx(40.0 * a["x"], rel=0.1)
    assert d["rate_source"] == "measured" and d["base_rate_req_per_s"] is None
    assert d["scaled_at_x1"] == "10 session starts/s"
    text = " ".join(res.stdout.split())
    assert "req/s are measured" in text and f"{10 * a['x']:.4g} session starts/s" in text


def test_open_plus_closed_loops_rate_counts_every_request():
    """Open loop 10 req/s plus a closed loop of 4 clients: before, base_rate counted the closed
    loop as 0 req/s and printed the open part alone as the workload's rate."""
    one = {"prompt": {"dist": "fixed", "value": 1}, "output": {"dist": "fixed", "value": 1}}  # 10 ms a request
    sc = servesim.scenario_from_dict({**BASE, "stop": {"requests": 600},
                                      "engine": {**BASE["engine"], "max_num_seqs": 1}, "workload": {"streams": [
        {"name": "open", "arrival": {"process": "poisson", "rate": 10.0}, **one},
        {"name": "loop", "arrival": {"process": "closed", "clients": 4, "think_s": 0.1}, **one}]}}, "t")
    assert base_rate(sc) == 10.0 and request_rate(sc) is None  # the scale moves 10 req/s, not all of them
    assert scaled_rates(sc) == "10 req/s open loop + closed loops (their clients unchanged)"
    s = find_max_rate(sc, [SLO("queue_mean", 0.02)], Budget(seeds=2, max_seeds=4), tol=0.5)
    assert s.answered, s.refused
    at = scale_rate(sc, s.best.x)
    total = np.mean([servesim.simulate(at, seed=1 + i).summary["throughput"]["req_per_s"] for i in range(s.best.n)])
    assert s.rate(s.best) == pytest.approx(total, rel=0.1) and s.rate(s.best) > 10.0 * s.best.x * 1.2
    assert s.to_dict()["scaled_at_x1"] == scaled_rates(sc)


# ------------------------------------------------------------------ D1: seeds of the design
def _spec(values, seeds=2, metrics=("ttft_p99", "completed"), **kw):
    return spec_from_dict({"base": BASE, "axes": {"engine.max_num_seqs": values}, "seeds": seeds,
                           "metrics": list(metrics), **kw}, "s.yaml", REPO)


def test_cutting_seeds_on_resume_reports_only_the_current_seeds(tmp_path):
    """seeds: 3, then seeds: 2 into the same folder. Before: load_results gave 6 rows (seeds 1-3)
    and the report's intervals used n=3, while the CLI said 4 rows."""
    run_sweep(_spec([1, 2], seeds=3), tmp_path, SerialExecutor())
    out = run_sweep(_spec([1, 2], seeds=2), tmp_path, SerialExecutor())
    assert out.report.ran == 0 and len(out.frame) == 4
    df = load_results(tmp_path)
    assert len(df) == 4 and sorted(df["seed"].unique()) == [1, 2]
    assert point_stats(read_sweep(tmp_path), "ttft_p99")["n"].tolist() == [2, 2]
    explicit = run_sweep(_spec([1, 2], seeds=[3, 1]), tmp_path, SerialExecutor())  # stored runs, new order
    df = load_results(tmp_path)
    assert explicit.report.ran == 0 and sorted(df["seed"].unique()) == [1, 3]
    assert df.loc[df["seed"] == 3, "replication"].eq(0).all() and df.loc[df["seed"] == 1, "replication"].eq(1).all()


# ---------------------------------------------------------------- D2: metrics added later
def test_adding_a_metric_on_resume_computes_it(tmp_path):
    """Before: stored rows were skipped and read NaN in the new metric (NaN: 'could not measure')."""
    run_sweep(_spec([1, 2], metrics=["ttft_p99"]), tmp_path, SerialExecutor())
    more = run_sweep(_spec([1, 2], metrics=["ttft_p99", "tpot_p99"]), tmp_path, SerialExecutor())
    assert more.report.ran == 4  # every stored run lacked tpot_p99
    df = load_results(tmp_path)
    fresh = run_sweep(_spec([1, 2], metrics=["ttft_p99", "tpot_p99"]), tmp_path / "fresh", SerialExecutor()).frame
    assert df["tpot_p99"].notna().all() and df["tpot_p99"].tolist() == fresh["tpot_p99"].tolist()
    again = run_sweep(_spec([1, 2], metrics=["tpot_p99"]), tmp_path, SerialExecutor())  # held: nothing runs
    assert again.report.ran == 0 and set(load_results(tmp_path).columns) >= {"ttft_p99", "tpot_p99"}
    assert point_stats(read_sweep(tmp_path), "tpot_p99")["n"].tolist() == [2, 2]


def test_a_metric_only_some_rows_hold_is_not_reported_as_nan(tmp_path):
    run_sweep(_spec([1, 2], metrics=["ttft_p99", "tpot_p99"]), tmp_path, SerialExecutor())
    out = run_sweep(_spec([1, 2, 4], metrics=["ttft_p99"]), tmp_path, SerialExecutor())
    assert out.report.ran == 2
    for frame in (load_results(tmp_path), out.frame, read_sweep(tmp_path).rows):
        assert "tpot_p99" not in frame.columns and frame["ttft_p99"].notna().all() and len(frame) == 6
        assert "metrics_kept" not in frame.columns


# ---------------------------------------------------------------------- D3: stale invalid.csv
def test_invalid_csv_of_an_earlier_design_is_removed(tmp_path):
    run_sweep(_spec([1, -1], invalid="skip"), tmp_path, SerialExecutor())
    assert (tmp_path / "invalid.csv").is_file() and read_sweep(tmp_path).invalid_points == 1
    run_sweep(_spec([1, 2], invalid="skip"), tmp_path, SerialExecutor())
    assert not (tmp_path / "invalid.csv").exists() and read_sweep(tmp_path).invalid_points == 0


# ------------------------------------------------------------------ D4: files a scenario reads
def _lengths_spec(folder):
    base = {**BASE, "workload": {"arrival": {"process": "poisson", "rate": 10.0},
                                 "lengths": {"file": "len.csv", "prompt_column": "p", "output_column": "o"}}}
    return spec_from_dict({"base": base, "axes": {"workload.arrival.rate": [5.0, 20.0]},
                           "metrics": ["e2e_mean"]}, "s.yaml", folder)


def test_editing_a_lengths_file_reruns_its_points(tmp_path):
    """Before: the key hashed the scenario's text only, so rows of the old file's lengths were
    reused (e2e_mean 0.04 s where a run of the edited file gives 0.4 s)."""
    (tmp_path / "len.csv").write_text("p,o\n16,4\n16,4\n")
    run_sweep(_lengths_spec(tmp_path), tmp_path / "out", SerialExecutor())
    (tmp_path / "len.csv").write_text("p,o\n16,40\n16,40\n")
    sp = _lengths_spec(tmp_path)
    out = run_sweep(sp, tmp_path / "out", SerialExecutor())
    assert out.report.ran == 2
    want = [servesim.simulate(p.scenario, seed=1).summary["latency_s"]["e2e"]["mean"] for p in sp.points]
    assert load_results(tmp_path / "out")["e2e_mean"].tolist() == pytest.approx(want)


def test_key_names_files_and_version_and_hashes_each_file_once(tmp_path, monkeypatch):
    (tmp_path / "len.csv").write_text("p,o\n16,4\n")
    calls = []
    digest = spec_module._digest
    monkeypatch.setattr(spec_module, "_digest", lambda p: calls.append(p) or digest(p))
    sp = _lengths_spec(tmp_path)
    assert calls == [tmp_path / "len.csv"]  # two points, one file: read once for the sweep
    key = sp.points[0].key
    monkeypatch.setattr(spec_module, "__version__", "999")
    assert scenario_key(sp.points[0].scenario) != key  # another servesim: other results
    pack = servesim.scenario_from_dict({**BASE, "step_time": {"model": "pack"}}, "t")
    assert any(p.suffix == ".csv" and p.parent.name == "a100-80g" for p in input_files(pack))


# ----------------------------------------------------------------------- D6: {low, high} ranges
def test_low_high_ranges_are_continuous_unless_type_int_and_ints_stay_within():
    a = parse_axis("workload.arrival.rate", {"low": 1, "high": 8}, "w")
    vals = [p["workload.arrival.rate"] for p in expand([Dimension((a,))], "lhs", 64, 0)]
    assert not a.integer and all(isinstance(v, float) and 1 <= v < 8 for v in vals)
    assert len(set(vals)) == 64  # a continuous range (before: the integers 1..8)
    c = parse_axis("x", {"low": 0.5, "high": 3.5, "type": "int"}, "w")
    counts = collections.Counter(p["x"] for p in expand([Dimension((c,))], "lhs", 60, 0))
    assert counts == {1: 20, 2: 20, 3: 20}  # before: 0 (below low) drawn, 3 drawn twice as often
    lg = parse_axis("x", {"low": 1.5, "high": 9.9, "type": "int", "scale": "log"}, "w")
    assert {p["x"] for p in expand([Dimension((lg,))], "lhs", 200, 0)} == set(range(2, 10))
    with pytest.raises(Exception, match=r"w: no integer lies between low 0.2 and high 0.8 \(type: int\)"):
        parse_axis("x", {"low": 0.2, "high": 0.8, "type": "int"}, "w")
    assert math.isfinite(a.at(0.999))
