"""Sweeps on Dask: a LocalCluster and a real ``dask scheduler`` + ``dask worker`` pair (subprocesses
on 127.0.0.1) give the rows this process gives; a worker killed mid-sweep loses and duplicates
nothing. Kept to seconds on two cores: tiny scenarios, two workers, ports chosen by the OS
(``--port 0``, address read from the scheduler file), everything torn down, a watchdog against
hangs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

import servesim
from servesim.cli import app
from servesim.sweep.executor import DaskExecutor, SerialExecutor
from servesim.sweep.runner import run_sweep
from servesim.sweep.spec import load_spec, spec_from_dict
from servesim.sweep.store import SweepStore
from tests.conftest import BASE, REPO, scenario

# the Python engine throughout: these tests are about Dask, and worker processes then never wait
# for a first compile of the engine (a fresh machine, or kernels changed since the last build)
PY = {"sim": {"engine": "python"}}
SPEC = {"base": {**BASE, **PY}, "axes": {"workload.arrival.rate": [5.0, 20.0, 40.0], "engine.max_num_seqs": [1, 4]},
        "seeds": 2}


def same_rows(a: pd.DataFrame, b: pd.DataFrame) -> None:
    cols = [c for c in a.columns if c != "wall_s"]
    assert list(a.columns) == list(b.columns)
    pd.testing.assert_frame_equal(a[cols].reset_index(drop=True), b[cols].reset_index(drop=True))


@pytest.fixture(scope="module")
def serial_rows(tmp_path_factory):
    sp = spec_from_dict(SPEC, "s.yaml", REPO)
    return run_sweep(sp, tmp_path_factory.mktemp("serial"), SerialExecutor()).frame


def test_local_cluster_gives_the_same_rows(tmp_path, serial_rows):
    sp = spec_from_dict(SPEC, "s.yaml", REPO)
    with DaskExecutor(workers=2) as ex:
        assert ex.workers == 2
        got = run_sweep(sp, tmp_path, ex).frame
        # simulate_many on the same cluster, through its address (the --scheduler path)
        many = servesim.simulate_many(scenario(**PY), {"engine.max_num_seqs": [1, 4]}, seeds=2,
                                      scheduler=ex.client.scheduler.address)
    same_rows(serial_rows, got)
    here = servesim.simulate_many(scenario(**PY), {"engine.max_num_seqs": [1, 4]}, seeds=2)
    same_rows(here, many)


# ------------------------------------------------------------------ subprocess scheduler + workers
class SubprocessCluster:
    def __init__(self, tmp, n_workers: int = 2, timeout_s: float = 90.0):
        self.procs: list[subprocess.Popen] = []
        self.workers: dict[str, subprocess.Popen] = {}
        sched_file = tmp / "scheduler.json"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        self.procs.append(subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
             "--no-dashboard", "--scheduler-file", str(sched_file)], **quiet))
        self._watchdog = threading.Timer(timeout_s * 3, self.close)  # a hang fails the test, never CI
        self._watchdog.daemon = True
        self._watchdog.start()
        deadline = time.monotonic() + timeout_s
        while not sched_file.is_file():
            self._wait(deadline, "the scheduler file")
        time.sleep(0.2)
        self.address = json.loads(sched_file.read_text())["address"]
        for i in range(n_workers):
            name = f"w{i}"
            p = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", self.address, "--nthreads", "1",
                                  "--no-nanny", "--no-dashboard", "--host", "127.0.0.1", "--name", name,
                                  "--death-timeout", "60"], **quiet)
            self.procs.append(p)
            self.workers[name] = p
        from distributed import Client

        with Client(self.address, timeout="30s") as c:
            while len(c.scheduler_info()["workers"]) < n_workers:
                self._wait(deadline, f"{n_workers} workers")

    def _wait(self, deadline: float, what: str) -> None:
        if time.monotonic() > deadline:
            self.close()
            pytest.fail(f"dask subprocess cluster: no {what} in time")
        if any(p.poll() is not None for p in self.procs):
            self.close()
            pytest.fail("dask subprocess cluster: a process exited at start")
        time.sleep(0.1)

    def close(self) -> None:
        self._watchdog.cancel()
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=3)  # no need for a graceful goodbye in a test
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture(scope="module")
def subprocess_cluster(tmp_path_factory):
    c = SubprocessCluster(tmp_path_factory.mktemp("dask"))
    yield c
    c.close()


def test_scheduler_and_workers_as_subprocesses_give_the_same_rows(tmp_path, subprocess_cluster, serial_rows):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(SPEC, sort_keys=False))
    res = CliRunner().invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "o"),
                                   "--scheduler", subprocess_cluster.address, "-q"])
    assert res.exit_code == 0, res.stdout + res.stderr
    got = servesim.sweep.load_results(tmp_path / "o")
    same_rows(serial_rows, got)
    # resume: the same command again runs nothing
    sp = load_spec(spec)
    store = SweepStore(tmp_path / "o")
    assert all(store.holds(p.key, s) for p in sp.points for s in sp.seeds_of(p))


def test_bad_scheduler_address_is_one_line(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(SPEC, sort_keys=False))
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = CliRunner().invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "o"),
                                   "--scheduler", f"tcp://127.0.0.1:{port}"])
    assert res.exit_code == 2 and res.stderr.startswith("error:") and "cannot reach a dask scheduler" in res.stderr
    assert "Traceback" not in res.stderr


def test_killed_worker_mid_sweep_loses_and_duplicates_nothing(tmp_path, subprocess_cluster):
    """Runs last in this module: it kills one of the module cluster's workers. Twelve runs of
    ~0.2 s; once three are stored, a worker busy with a task is killed (SIGKILL, no goodbye)."""
    # 1,000 requests on the Python engine: ~0.2 s a run, long enough for workers to be busy when
    # one is killed
    raw = {"base": {**BASE, **PY, "stop": {"requests": 1000}},
           "axes": {"workload.arrival.rate": [4.0, 6.0, 8.0, 10.0, 12.0, 14.0]}, "seeds": 2}
    sp = spec_from_dict(raw, "kill.yaml", REPO)
    killed: dict = {}

    with DaskExecutor(scheduler=subprocess_cluster.address) as ex:
        info = ex.client.scheduler_info()["workers"]
        by_addr = {addr: w["name"] for addr, w in info.items()}

        def progress(done: int, total: int) -> None:
            if done >= 3 and not killed:
                busy = [a for a, ts in ex.client.processing().items() if ts]
                if not busy:
                    return  # try again at the next result
                name = by_addr[busy[0]]
                killed.update(name=name, had=len(ex.client.processing()[busy[0]]), at=done)
                os.kill(subprocess_cluster.workers[name].pid, signal.SIGKILL)

        out = run_sweep(sp, tmp_path, ex, progress=progress)
        survivors = ex.workers
    assert killed and killed["had"] >= 1, killed  # a task was running on the worker that died
    assert survivors == 1
    assert out.report.errors == [] and out.report.ran == 12
    # every task exactly once, in the raw parts as well as in the deduplicated view
    raw_rows = pd.concat([pd.read_parquet(p) for p in SweepStore(tmp_path).parts()])
    tasks = {(p.key, s) for p in sp.points for s in sp.seeds_of(p)}
    assert len(raw_rows) == 12 and set(zip(raw_rows["key"], raw_rows["seed"])) == tasks
    ref = run_sweep(sp, tmp_path / "ref", SerialExecutor()).frame
    same_rows(ref, out.frame)
