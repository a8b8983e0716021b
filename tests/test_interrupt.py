"""Ctrl-C: the run stops at an iteration boundary in a consistent state; the CLI writes what ran,
marked partial; a second Ctrl-C stops at once; nothing half-written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from servesim import scenario_from_dict
from servesim.cli import app
from servesim.request import FINISHED, REJECTED, RUNNING, WAITING
from servesim.simulate import build, run_built
from servesim.testing import Checker
from tests.conftest import BASE, merge

REPO = Path(__file__).resolve().parents[1]
RAW = merge(BASE, {"stop": {"requests": 400},
                   "engine": {"num_gpu_blocks_override": 60, "block_size": 4, "max_num_seqs": 8},
                   "workload": {"arrival": {"process": "poisson", "rate": 80.0},
                                "prompt": {"dist": "uniform", "min": 8, "max": 64},
                                "output": {"dist": "uniform", "min": 1, "max": 60}}})


@pytest.fixture(autouse=True)
def sigint_not_ignored():
    """Ctrl-C as a terminal delivers it. A test run started in the background by a shell without
    job control (`cmd &`, nohup) inherits SIGINT ignored, and servesim rightly leaves an ignored
    SIGINT alone: restore Python's handler here, and the default for the CLI's subprocesses."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def _sigint_default():  # preexec_fn of CLI subprocesses (see sigint_not_ignored)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def ctrl_c_at(*iterations):
    """An iteration hook that sends this process SIGINT at the given iteration numbers."""
    seen = [0]

    def hook(t0, t1, ids, new):
        seen[0] += 1
        if seen[0] in iterations:
            signal.raise_signal(signal.SIGINT)

    return hook


def assert_consistent(b):
    """The replica's state after an interrupt: counts, places, KV blocks agree."""
    st = b.replica.engines[0].st
    s = st.s
    status = st.status
    assert int(s.arrived) == int(np.isin(status, [WAITING, RUNNING, FINISHED, REJECTED]).sum())
    assert int(s.ended) == int(np.isin(status, [FINISHED, REJECTED]).sum())
    assert int(s.run_len) == int((status == RUNNING).sum())
    assert sorted(st.run[: s.run_len].tolist()) == np.flatnonzero(status == RUNNING).tolist()
    assert int(st.q_len.sum()) == int((status == WAITING).sum())
    kv = b.kv
    assert int(kv.held.sum()) + int(kv.s[0].free) == kv.num_blocks
    assert (kv.held[status != RUNNING] == 0).all()


def test_stop_on_interrupt_keeps_a_consistent_prefix_of_the_run():
    full = run_built(build(scenario_from_dict(RAW), on_iteration=lambda *a: None))
    checker = Checker()
    b = checker.build(scenario_from_dict(RAW), on_iteration=ctrl_c_at(300))
    b.replica.stop_on_interrupt = True
    part = run_built(b)
    assert b.replica.interrupted
    assert_consistent(b)
    checker.finish(part)  # causality, counts, KV, percentiles on the partial run
    r = part.summary["requests"]
    assert r["in_flight"] > 0 and r["completed"] > 0
    assert r["arrived"] == r["completed"] + r["rejected"] + r["in_flight"]
    assert part.summary["sim_time_s"] < full.summary["sim_time_s"]
    # everything that ended before the interrupt ended exactly as in the uninterrupted run
    t, f = part.table, full.table
    done = t.status == FINISHED
    assert done.sum() == r["completed"]
    for col in ("t_first_sched", "t_first_token", "t_finish"):
        np.testing.assert_array_equal(getattr(t, col)[done], getattr(f, col)[done])


def test_interrupt_raises_from_a_consistent_state_by_default():
    b = build(scenario_from_dict(RAW), on_iteration=ctrl_c_at(300))
    with pytest.raises(KeyboardInterrupt):
        run_built(b)
    assert not b.replica.interrupted
    assert_consistent(b)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_ctrl_c_stops_at_once():
    b = build(scenario_from_dict(RAW), on_iteration=ctrl_c_at(300, 301))
    b.replica.stop_on_interrupt = True
    with pytest.raises(KeyboardInterrupt):
        run_built(b)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_in_the_last_iteration_leaves_the_run_whole():
    count = [0]
    run_built(build(scenario_from_dict(RAW), on_iteration=lambda *a: count.__setitem__(0, count[0] + 1)))
    b = build(scenario_from_dict(RAW), on_iteration=ctrl_c_at(count[0]))
    b.replica.stop_on_interrupt = True
    res = run_built(b)
    assert not b.replica.interrupted and "partial" not in res.summary
    assert res.summary["requests"]["completed"] == 400


runner = CliRunner()


def test_cli_ctrl_c_before_the_run_writes_nothing(tmp_path, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(sys.modules["servesim.simulate"], "build", interrupted)
    (tmp_path / "s.yaml").write_text(json.dumps(RAW))
    res = runner.invoke(app, ["run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "out")])
    assert res.exit_code == 130 and isinstance(res.exception, SystemExit)
    assert "interrupted (Ctrl-C)" in res.output and "nothing written" in res.output
    assert not (tmp_path / "out").exists()


def test_cli_ctrl_c_while_writing_finishes_the_files(tmp_path, monkeypatch):
    from servesim.simulate import Result

    write = Result.write

    def write_interrupted(self, out_dir):
        signal.raise_signal(signal.SIGINT)
        return write(self, out_dir)

    monkeypatch.setattr(Result, "write", write_interrupted)
    (tmp_path / "s.yaml").write_text(json.dumps(merge(RAW, {"stop": {"requests": 30}})))
    res = runner.invoke(app, ["run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "out")])
    assert res.exit_code == 130, res.output
    assert "written whole" in res.output
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["requests.parquet", "scenario.resolved.yaml", "sketches.json", "summary.json",
                     "timeseries.parquet"]
    assert "partial" not in json.loads((tmp_path / "out" / "summary.json").read_text())


BIG = merge(BASE, {"name": "big", "stop": {"requests": 2_000_000}, "engine": {"max_num_seqs": 64},
                   "workload": {"arrival": {"process": "poisson", "rate": 50.0},
                                "prompt": {"dist": "uniform", "min": 16, "max": 512},
                                "output": {"dist": "uniform", "min": 1, "max": 256}}})


@pytest.mark.parametrize("engine", ["python", "compiled"])
def test_cli_ctrl_c_writes_partial_results(tmp_path, engine):
    """A real SIGINT to `servesim run` once the run is under way (after its header): exit 130,
    every file written, summary.json partial with consistent counts, one line saying so."""
    from servesim.jit import compiled_ready

    if engine == "compiled" and not compiled_ready():
        pytest.skip("the compiled engine is not built on this machine (servesim warm)")
    path = tmp_path / "big.yaml"
    path.write_text(json.dumps(BIG))
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "servesim.cli", "run", str(path), "--out", str(out),
                             "--set", f"sim.engine={engine}"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"},
                            preexec_fn=_sigint_default)
    try:
        for line in proc.stdout:  # the header's last line is printed just before the run starts
            if line.startswith("step time"):
                break
        time.sleep(1.0)
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
        stopped_s = time.perf_counter() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    lines = [x for x in stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("interrupted (Ctrl-C) at simulated time"), stderr
    assert '"partial": true' in lines[0]
    summary = json.loads((out / "summary.json").read_text())
    r = summary["requests"]
    assert summary["partial"] is True
    assert 0 < r["arrived"] < 2_000_000 and r["in_flight"] > 0
    assert r["arrived"] == r["completed"] + r["rejected"] + r["in_flight"]
    import pyarrow.parquet as pq

    table = pq.read_table(out / "requests.parquet", columns=["status"])
    assert table.num_rows == r["arrived"]  # the requests that arrived by the stop (not those yet to come)
    assert stopped_s < 60  # generous (a shared machine); typically 1-3 s, mostly writing 2M rows


# ------------------------------------------------------------------------------- fleets
def fleet(router: str) -> dict:
    return merge(RAW, {"cluster": {"router": router, "groups": [{"replicas": 2}]}})


@pytest.mark.parametrize("router", ["round-robin", "least-requests"])  # routed first / the event loop
def test_a_fleet_stops_at_a_consistent_boundary(router):
    raw = fleet(router)
    full = run_built(build(scenario_from_dict(raw), on_iteration=lambda *a: None))
    b = build(scenario_from_dict(raw), on_iteration=ctrl_c_at(150))
    b.replica.stop_on_interrupt = True
    part = run_built(b)
    assert b.replica.interrupted and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    r = part.summary["requests"]
    assert r["in_flight"] > 0 and r["completed"] > 0
    assert r["arrived"] == r["completed"] + r["rejected"] + r["in_flight"]
    engines = [(i, b.replica.engines[e]) for i, info in enumerate(b.fleet.replicas) for e in info.engines]
    for i, eng in engines:  # every engine's KV blocks balance, held by running requests only
        kv, status = eng.kstate, eng.st.status
        mine = b.replica.replica_of == i
        assert int(kv.held.sum()) + int(kv.s[0].free) == kv.num_blocks
        assert (kv.held[mine & (status != RUNNING)] == 0).all()
    t, f = part.table, full.table
    done = t.status == FINISHED
    assert done.sum() == r["completed"]
    for col in ("t_first_sched", "t_first_token", "t_finish"):
        np.testing.assert_array_equal(getattr(t, col)[done], getattr(f, col)[done])


def test_a_fleet_raises_from_a_consistent_state_by_default():
    b = build(scenario_from_dict(fleet("least-requests")), on_iteration=ctrl_c_at(150))
    with pytest.raises(KeyboardInterrupt):
        run_built(b)
    assert not b.replica.interrupted
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_cli_runs_a_fleet(tmp_path):
    """(servesim run on a fleet read the lone replica's interrupt flag: an AttributeError after
    every fleet run, once Ctrl-C handling met main's fleets.)"""
    (tmp_path / "s.yaml").write_text(json.dumps(merge(fleet("least-requests"), {"stop": {"requests": 40}})))
    res = runner.invoke(app, ["run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "out"), "-q"])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["requests"]["completed"] == 40 and "partial" not in summary


def test_the_python_engines_frequent_returns_change_no_fleet_result():
    """The Python engine returns every 256 segments (Ctrl-C latency), the compiled one every
    65,536: a fleet drains its recorders only at buffer flushes, never at those returns, so the
    float sums group alike and compiled = Python over many returns (it drained at each: busy and
    KV means differed in the last bits)."""
    from tests.test_cluster_identity import assert_identical, run

    raw = merge(fleet("round-robin"), {"stop": {"requests": 1500}})
    py = run(raw, "python")
    assert py.summary["engine"]["iterations"] > 2 * 2 * 256  # many returns on each engine
    assert_identical(py, run(raw, "compiled"), fleet_keys=())
