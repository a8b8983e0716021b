"""A fleet sharded over Dask worker processes (sim.workers; servesim/engine/shard.py) gives the
results of one process with the same router refresh interval: requests.parquet byte for byte,
and the summary. Refusals name the field, its value and what is allowed.

A LocalCluster costs seconds to start (and each worker imports servesim), so the fast suite
holds one identity run on 2 workers; the slow one shares a 4-worker cluster for the other
routers and worker counts (``scheduler=`` its address: the first k workers of it)."""

from __future__ import annotations

import hashlib
import logging

import pytest

from servesim import scenario_from_dict, simulate
from servesim.errors import ScenarioError


def fleet(router="least-tokens", replicas=6, requests=300, refresh=0.25, **extra) -> dict:
    raw = {"name": "shard", "seed": 3, "stop": {"requests": requests, "warmup_requests": 20},
           "hardware": {"gpu": "a100-80g", "replicas": replicas}, "model": "llama-3-8b",
           "engine": {"scheduler": "vllm"}, "sim": {"engine": "python"},
           "workload": {"arrival": {"process": "poisson", "rate": 8.0 * replicas},
                        "prompt": {"dist": "lognormal", "mean": 800, "sigma": 0.8, "min": 1, "max": 6000},
                        "output": {"dist": "lognormal", "mean": 200, "sigma": 0.8, "min": 1, "max": 2000}},
           "cluster": {"router": router, "router_refresh_s": refresh}}
    for k, v in extra.items():
        raw[k] = {**raw.get(k, {}), **v} if isinstance(v, dict) else v
    w = raw["workload"]
    if "sessions" in w:  # (a session's turns: new input and output per turn, as benchmarks/fleet.py)
        del w["prompt"]
        w["sessions"] = {**w["sessions"], "output": w.pop("output")}
    return raw


def parquet_digest(res, tmp_path, name: str) -> str:
    out = res.write(tmp_path / name)
    return hashlib.sha256((out / "requests.parquet").read_bytes()).hexdigest()


def same_summary(a: dict, b: dict) -> list[str]:
    return [k for k in a if k not in ("wall_s", "resolved_scenario") and a[k] != b.get(k)]


def test_two_workers_equal_one_process(tmp_path):
    import multiprocessing

    from servesim.simulate import build, run_built

    sc = scenario_from_dict(fleet())
    one = simulate(sc)
    b = build(sc, workers=2)
    two = run_built(b)
    if "forkserver" in multiprocessing.get_all_start_methods():  # forked with servesim loaded (shard_preload.py)
        assert len(b.replica.worker_start) == 2, b.replica.worker_start
        assert all(s is not None and s.startswith("imported") for s in b.replica.worker_start), b.replica.worker_start
    assert two.requests.equals(one.requests)
    assert parquet_digest(two, tmp_path, "two") == parquet_digest(one, tmp_path, "one")
    assert same_summary(one.summary, two.summary) == []
    assert "sharded" not in one.summary  # (provenance: said only where the fleet ran over workers)
    sharded = two.summary["sharded"]
    assert sharded["workers"] == 2 and sharded["scheduler"] is None and sharded["window_s"] == 0.25, sharded
    assert sharded["windows"] > 1, sharded
    assert (one.requests["replica"].nunique()) == 6  # (the router spread the work: a real test of routing)


@pytest.fixture(scope="module")
def four():
    from distributed import LocalCluster

    cluster = LocalCluster(n_workers=4, threads_per_worker=1, processes=True, dashboard_address=None,
                           silence_logs=logging.CRITICAL)
    yield cluster.scheduler_address
    cluster.close()


@pytest.mark.slow
@pytest.mark.parametrize("router,extra", [
    ("least-requests", {}),
    ("least-tokens", {"cluster": {"router_sample": 2}}),
    ("priority", {"workload": {"classes": {"weights": [0.3, 0.7]}}}),
    ("random", {}),
    ("least-tokens", {"cluster": {"network_delay_s": 0.01}}),
    ("affinity", {"workload": {"sessions": {"turns": {"dist": "fixed", "value": 3}, "think_s": 1.0,
                                            "new_input": {"dist": "lognormal", "mean": 300, "sigma": 0.8, "min": 1,
                                                          "max": 2000}}}}),
    ("least-tokens", {"stop": {"requests": None, "duration_s": 5.0}}),
    ("least-requests", {"engine": {"pipeline_parallel_size": 2}}),
    ("affinity", {"engine": {"enable_prefix_caching": True},
                  "workload": {"sessions": {"turns": {"dist": "fixed", "value": 4}, "think_s": 0.5,
                                            "new_input": {"dist": "lognormal", "mean": 300, "sigma": 0.8, "min": 1,
                                                          "max": 2000}}}}),
])
def test_workers_equal_one_process(four, tmp_path, router, extra):
    raw = fleet(router, replicas=9, requests=400, **extra)
    try:
        sc = scenario_from_dict(raw)
    except ScenarioError as exc:  # (a field this scenario family lacks: the case is wrong, not the code)
        pytest.fail(str(exc))
    one = simulate(sc)
    ref = parquet_digest(one, tmp_path, "one")
    for k in (2, 4):
        res = simulate(sc, workers=k, scheduler=four)
        assert parquet_digest(res, tmp_path, f"w{k}") == ref, k
        assert same_summary(one.summary, res.summary) == [], k


@pytest.mark.parametrize("change,field", [
    ({"cluster": {"router_refresh_s": 0.0}}, "cluster.router_refresh_s = 0.0"),
    ({"workload": {"arrival": {"process": "closed", "clients": 4, "think_s": 0.5}}},
     "workload.arrival is a closed loop"),
    ({"cluster": {"faults": {"mtbf_s": 100.0, "mttr_s": 5.0}}}, "cluster.faults is set"),
    ({"cluster": {"autoscale": {"min_replicas": 2}}}, "cluster.autoscale is set"),
    ({"hardware": {"replicas": 1}}, "a lone replica has nothing to shard"),
    ({"cluster": {"router": "cache-aware"}}, "cluster.router 'cache-aware' is not shardable (allowed: round-robin"),
    ({"rate_schedule": {"steps": [{"at_s": 0, "factor": 0.5}, {"at_s": 2, "factor": 2.0}]}}, "rate_schedule is set"),
    ({"engine": {"enable_prefix_caching": True},
      "kv_tiers": [{"kind": "remote", "capacity_gib": 8, "name": "L3", "bandwidth_gb_s": 1.0, "shared_link": True}]},
     "kv_tiers with shared_link"),
    ({"stop": {"duration_s": 2.0}, "cluster": {"network_delay_s": 1.5}},  # (arrivals reach replicas 1.5 s late)
     "is not before stop.duration_s = 2.0"),
])
def test_refusals(change, field, monkeypatch):
    import servesim.engine.shard as shard

    def no_workers(*args, **kwargs):  # pragma: no cover - reached only if the refusal comes late
        raise AssertionError("worker processes were started for a run that had to be refused")

    monkeypatch.setattr(shard, "connect", no_workers)
    raw = fleet()
    for k, v in change.items():
        raw[k] = {**raw[k], **v} if k in raw else v
    raw["sim"]["workers"] = 2
    try:
        sc = scenario_from_dict(raw)
    except ScenarioError as exc:  # pragma: no cover - the change itself must be valid
        pytest.fail(f"the scenario of this case is invalid: {exc}")
    with pytest.raises(ScenarioError) as err:
        simulate(sc)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("sim.workers = 2: ") and field in msg, msg


def test_refuses_more_workers_than_replicas_and_extras():
    sc = scenario_from_dict(fleet(replicas=3))
    with pytest.raises(ScenarioError, match=r"sim.workers = 4: more workers than the fleet's 3 replicas"):
        simulate(sc, workers=4)
    with pytest.raises(ScenarioError, match=r"sim.workers = 2: processes cannot be sent"):
        simulate(sc, workers=2, processes=[lambda env, fleet: iter(())])


@pytest.mark.parametrize("policy,needle", [("os:system", "not a policy class"),
                                           ("no_such_module_xyz:Policy", "cannot import it")])
def test_bad_user_policy_is_the_line_of_one_process(policy, needle, monkeypatch):
    """A user policy is imported by the coordinator before any worker starts: the one line of a
    run in one process, not a worker's failure (servesim/sched/custom.py user_policy_loader)."""
    import servesim.engine.shard as shard

    def no_workers(*args, **kwargs):  # pragma: no cover - reached only if the refusal comes late
        raise AssertionError("worker processes were started for a run that had to be refused")

    monkeypatch.setattr(shard, "connect", no_workers)
    raw = fleet(replicas=2, requests=40, engine={"scheduler": policy})
    lines = []
    for workers in (1, 2):
        raw["sim"]["workers"] = workers
        with pytest.raises(ScenarioError) as err:
            simulate(scenario_from_dict(raw))
        lines.append(str(err.value))
    assert lines[0] == lines[1], lines
    assert "\n" not in lines[1] and lines[1].startswith(f"engine.scheduler {policy!r}") and needle in lines[1]


def test_sim_workers_field():
    assert scenario_from_dict(fleet()).sim.workers == 1
    raw = fleet()
    raw["sim"]["workers"] = 0
    with pytest.raises(ScenarioError, match="workers"):
        scenario_from_dict(raw)


def test_unreachable_scheduler_is_one_line():
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ScenarioError, match=rf"--scheduler tcp://127.0.0.1:{port}: cannot reach a dask scheduler"):
        simulate(scenario_from_dict(fleet()), scheduler=f"tcp://127.0.0.1:{port}")


@pytest.mark.slow
def test_cli_scheduler(four, tmp_path):
    """``servesim run --scheduler``: the fleet over a running cluster's workers, the same files."""
    import yaml
    from typer.testing import CliRunner

    from servesim.cli import app

    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(fleet(replicas=5, requests=200)))
    runner = CliRunner()
    one = runner.invoke(app, ["run", str(path), "--out", str(tmp_path / "one"), "--quiet"])
    assert one.exit_code == 0, one.output
    sharded = runner.invoke(app, ["run", str(path), "--out", str(tmp_path / "sharded"), "--quiet",
                                  "--scheduler", four])
    assert sharded.exit_code == 0, sharded.output
    files = [(tmp_path / d / "requests.parquet").read_bytes() for d in ("one", "sharded")]
    assert files[0] == files[1]


def _sharded_run_in_a_task(raw):
    try:
        simulate(scenario_from_dict(raw))
    except ScenarioError as exc:
        return str(exc)
    return "ran"


@pytest.mark.slow
def test_sharded_run_inside_a_dask_task_is_refused(four):
    """A sweep's task runs on a Dask worker, which cannot start worker processes of its own."""
    from distributed import Client

    raw = fleet()
    raw["sim"]["workers"] = 2
    with Client(four) as client:
        msg = client.submit(_sharded_run_in_a_task, raw, pure=False).result()
    assert msg.startswith("sim.workers = 2: this run is itself a task on a Dask worker"), msg


def test_fork_server_warm_up_runs_a_worker():
    """The fork server's warm-up (servesim/shard_preload.py) swallows its errors so that the server
    survives; this is where a warm-up broken by a change of ShardWorker shows (the workers would
    silently load the engine themselves again)."""
    from servesim.jit import compiled_ready
    from servesim.shard_preload import _run_tiny

    if not compiled_ready():
        pytest.skip("the compiled engine is not built on this machine (the warm-up would compile it)")
    _run_tiny()
