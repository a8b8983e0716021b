"""Wrong results with exit 0 found by a hostile run (issue 26, first list): each test here failed
before its fix. docs/reliability.md lists them with their before/after numbers; all but 9 are
also in the fuzzing corpus (tests/fuzz_inputs.py, ``known_inputs()``), each with a check of its results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------- 9: BLAS thread count
_MEANS = """
import numpy as np
from servesim.metrics.stats import describe_weighted
from servesim.metrics.sample import WeightedSample
rng = np.random.default_rng(0)
v = rng.random(200_000) * 0.05
w = rng.integers(1, 300, 200_000)
s = WeightedSample(mem_pairs=50_000)  # spills: the streaming path
s.add(v[:100_000], w[:100_000]); s.add(v[100_000:], w[100_000:])
print(repr(float(np.dot(v, w.astype(float)))), repr(describe_weighted(v, w)["mean"]), repr(s.describe()["mean"]))
"""


def _means_with_threads(threads: str) -> list[str]:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    out = subprocess.run([sys.executable, "-c", _MEANS], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True, timeout=120)
    return out.stdout.split()


def test_weighted_means_do_not_depend_on_blas_threads():
    """itl_mean was np.dot(gaps, counts) / n: BLAS splits the dot product over its threads, so
    a Dask worker (1 thread) and this process (2) differed in the last bit and
    check_worker_independent failed on the quickstart."""
    one, two = _means_with_threads("1"), _means_with_threads("2")
    if one[0] == two[0]:
        pytest.skip("this machine's BLAS sums alike with 1 and 2 threads: nothing to tell apart")
    assert one[1:] == two[1:], f"weighted means with 1 BLAS thread {one[1:]} and with 2 {two[1:]}"


@pytest.mark.slow
def test_quickstart_rows_do_not_depend_on_the_worker():
    """The issue's own check: on the quickstart, rows from two Dask worker processes (1 BLAS
    thread each) and from this process were not bit-identical (itl_mean 0.018936714405803624
    against 0.01893671440580363); check_worker_independent raises on any difference."""
    from servesim import load_scenario
    from servesim.testing import check_worker_independent

    one, many = check_worker_independent(load_scenario(ROOT / "scenarios" / "quickstart.yaml"), seeds=1, workers=2)
    assert one["itl_mean"].tolist() == many["itl_mean"].tolist()


# ----------------------------------------------------------------------- 3: --seeds, rare class
MIX = {
    "name": "mix", "seed": 1, "stop": {"requests": 300}, "model": "llama-3-8b", "hardware": {"gpu": "a100-80g"},
    "engine": {"scheduler": "vllm"}, "step_time": {"model": "constant", "seconds": 0.01},
    "workload": {"arrival": {"process": "poisson", "rate": 5.0}, "prompt": {"dist": "fixed", "value": 100},
                 "output": {"dist": "fixed", "value": 10}, "classes": {"weights": [0.996, 0.004]}},
}


def test_replicated_class_counts_average_over_every_seed():
    """A class absent from a seed counts 0 requests there: P1 arrivals averaged 1.33 over the
    3 seeds of 5 that drew one (true mean 0.8), and the classes summed past the run's 300."""
    from servesim import scenario_from_dict
    from servesim.sweep.replicate import replicate

    rep = replicate(scenario_from_dict(MIX), [1, 2, 3, 4, 5])
    per_seed = [s["by_class"].get("P1", {}).get("requests", {}).get("arrived", 0) for s in rep.summaries]
    assert 0 in per_seed and max(per_seed) > 0, per_seed  # the case: some seeds without a P1
    s = rep.summary
    assert s["by_class"]["P1"]["requests"]["arrived"] == pytest.approx(np.mean(per_seed))
    assert sum(c["requests"]["arrived"] for c in s["by_class"].values()) == pytest.approx(300.0)
    assert s["by_class"]["P1"]["latency_s"]["ttft"]["count"] == pytest.approx(np.mean(per_seed))
    iv = s["intervals"]["arrived@P1"]
    assert iv["n"] == 5 and iv["estimate"] == pytest.approx(np.mean(per_seed))
    assert s["intervals"]["ttft_p99@P1"]["n"] == sum(1 for x in per_seed if x)  # latencies: seeds that have them
    frame = rep.frame()
    assert frame["arrived@P1"].tolist() == [float(x) for x in per_seed]


# ------------------------------------------------------- 5: per-seed scenario.resolved.yaml
def test_each_replications_resolved_scenario_reruns_that_seed_alone(tmp_path):
    """``stop.replications: 3`` wrote replications: 3 into every seed's
    scenario.resolved.yaml, so re-running seed 2's file ran seeds 2, 3, 4."""
    import yaml

    from servesim import load_scenario, simulate

    raw = {**MIX, "stop": {"requests": 20, "replications": 3}}
    src = tmp_path / "s.yaml"
    src.write_text(yaml.safe_dump(raw))
    code, crash, out, err = _cli(["run", str(src), "--out", str(tmp_path / "out"), "-q", "--workers", "1"])
    assert code == 0 and crash is None, err
    seed2 = tmp_path / "out" / "seeds" / "seed-2"
    sc = load_scenario(seed2 / "scenario.resolved.yaml")
    assert sc.stop.replications == 1 and sc.seed == 2
    again = simulate(sc)
    stored = json.loads((seed2 / "summary.json").read_text())
    assert again.summary["resolved_scenario"]["sha256"] == stored["resolved_scenario"]["sha256"]
    assert again.summary["latency_s"] == stored["latency_s"]


def _cli(argv):
    from tests.fuzz_inputs import run_cli

    return run_cli(argv)


# ------------------------------------------------------------- 4: --force replaces as a set
def test_force_replaces_a_run_of_the_other_kind_as_a_set(tmp_path):
    """--force removed only the files of the new run's kind: a replicated run written over a
    single one kept its requests.parquet (and ``servesim report`` drew both runs on one page),
    a single run over a replicated one kept the seeds."""
    import yaml

    src = tmp_path / "s.yaml"
    src.write_text(yaml.safe_dump({**MIX, "stop": {"requests": 20}}))
    out = tmp_path / "out"
    single = {"requests.parquet", "timeseries.parquet", "summary.json", "sketches.json", "scenario.resolved.yaml"}

    def run(*extra):
        code, crash, _, err = _cli(["run", str(src), "--out", str(out), "-q", "--force", "--workers", "1", *extra])
        assert code == 0 and crash is None, err
        return {p.name for p in out.iterdir()}

    assert run() == single
    assert run("--seeds", "3") == {"summary.json", "replications.parquet", "seeds"}
    assert {p.name for p in (out / "seeds").iterdir()} == {"seed-1", "seed-2", "seed-3"}
    assert run("--seeds", "2") == {"summary.json", "replications.parquet", "seeds"}
    assert {p.name for p in (out / "seeds").iterdir()} == {"seed-1", "seed-2"}  # seed-3 was the earlier run's
    (out / "seeds" / "notes.txt").write_text("mine")  # not a run's: stays
    assert run() == single | {"seeds"}
    assert {p.name for p in (out / "seeds").iterdir()} == {"notes.txt"}


# ----------------------------------------------------------------- 1: zero-token prompts
def test_zero_token_prompts_are_refused_in_one_line(tmp_path):
    """``min_prompt: 0`` kept rows with empty prompts, which the engine never scheduled: 30
    arrived, 17 completed, 13 in flight forever, exit 0 (even with sim.check_invariants)."""
    import yaml

    from servesim.errors import ServesimError
    from servesim.request import Workload

    (tmp_path / "len.csv").write_text("num_prefill_tokens,num_decode_tokens\n" +
                                      "".join(f"{p},{o}\n" for p, o in [(0, 5), (30, 4), (0, 7), (100, 3)] * 5))
    raw = {**MIX, "stop": {"requests": 30}, "sim": {"check_invariants": True},
           "workload": {"arrival": {"process": "poisson", "rate": 5.0},
                        "lengths": {"file": "len.csv", "min_prompt": 0}}}
    src = tmp_path / "s.yaml"
    src.write_text(yaml.safe_dump(raw))
    code, crash, out, err = _cli(["run", str(src), "--out", str(tmp_path / "out"), "-q"])
    assert crash is None and code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "min_prompt = 0" in lines[0] and "0 tokens cannot be served" in lines[0], err
    # the default (min_prompt: 1) drops the empty prompts and says so; every request is served
    del raw["workload"]["lengths"]["min_prompt"]
    src.write_text(yaml.safe_dump(raw))
    code, crash, out, err = _cli(["run", str(src), "--out", str(tmp_path / "out"), "-q"])
    assert code == 0 and crash is None, err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["requests"]["completed"] == 30 and summary["requests"]["in_flight"] == 0
    # a workload handed in through the API is held to the same rule
    with pytest.raises(ServesimError, match="prompt_tokens = 0"):
        Workload(np.array([0.0, 1.0]), np.array([3, 0]), np.array([1, 1]), np.zeros(2, dtype=np.int8))


# --------------------------------------------------------------- 7: times past 1e8 s
def _run_raw(tmp_path, raw, *extra):
    import yaml

    src = tmp_path / "s.yaml"
    src.write_text(yaml.safe_dump(raw))
    return _cli(["run", str(src), "--out", str(tmp_path / "out"), "-q", "--force", *extra])


def _one_error_line(code, crash, out, err, *words):
    assert crash is None and code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    for w in words:
        assert w in lines[0], lines[0]


def test_times_past_the_bound_are_refused_and_times_within_it_stay_exact(tmp_path):
    """Arrivals near 1e12 s (rate 1e-12) gave a constant 10 ms TTFT as 7.8-11.7 ms, a trace
    row at 1e300 ms gave 0 s latencies, all with exit 0. Times are bounded at 1e8 s, as the
    docs say: what lies past it is refused in one line; within it latencies stay exact."""
    base = {**MIX, "stop": {"requests": 5},
            "workload": {**{k: v for k, v in MIX["workload"].items() if k != "classes"},
                         "arrival": {"process": "poisson", "rate": 1e-12}}}
    _one_error_line(*_run_raw(tmp_path, base), "arrives at", "bounded at 1e8 s")
    (tmp_path / "t.jsonl").write_text("".join(
        json.dumps({"timestamp": t, "input_length": 100, "output_length": 10, "hash_ids": [i]}) + "\n" for i, t in enumerate((0, 50, 1e300))))
    trace = {**base, "workload": {"trace": {"file": "t.jsonl", "format": "mooncake"}}}
    _one_error_line(*_run_raw(tmp_path, trace), "request 2 arrives at 1e+297 s")
    closed = {**base, "stop": {"requests": 5},
              "workload": {**base["workload"], "arrival": {"process": "closed", "clients": 1, "think_s": 1e8}}}
    _one_error_line(*_run_raw(tmp_path, closed), "simulated time", "bounded at 1e8 s")
    import pandas as pd

    ok = {**base, "workload": {**base["workload"], "arrival": {"process": "poisson", "rate": 1e-6}}}
    code, crash, out, err = _run_raw(tmp_path, ok)
    assert code == 0 and crash is None, err
    req = pd.read_parquet(tmp_path / "out" / "requests.parquet")
    assert req["arrival_s"].max() > 1e6  # far from 0, within the bound
    assert np.abs(req["ttft_s"] - 0.01).max() < 1e-8, req["ttft_s"].tolist()


# ------------------------------------------------- 6: closed loop stopped by duration
def test_a_closed_loops_unsent_requests_are_not_rows(tmp_path):
    """Closed loop + stop.duration_s: the requests drawn ahead that no client sent by the end
    were written as rows with status pending, two of them with an arrival after the end (a
    client still thinking: 5.4 s in a 5 s run), 43 rows beside 18 requests that arrived."""
    import pandas as pd

    raw = {**MIX, "stop": {"duration_s": 5.0},
           "workload": {**{k: v for k, v in MIX["workload"].items() if k != "classes"},
                        "arrival": {"process": "closed", "clients": 2, "think_s": 0.5}}}
    code, crash, out, err = _run_raw(tmp_path, raw)
    assert code == 0 and crash is None, err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    req = pd.read_parquet(tmp_path / "out" / "requests.parquet")
    assert len(req) == summary["requests"]["arrived"] > 0
    assert (req["arrival_s"] <= summary["sim_time_s"]).all()
    assert (req["status"] != "pending").all()
    # the same from Python: Result.requests
    from servesim import scenario_from_dict, simulate

    frame = simulate(scenario_from_dict(raw)).requests
    assert len(frame) == len(req) and frame["arrival_s"].notna().all()


# ------------------------------------------- 8: blocked seconds of requests still waiting
BLOCKED = [f"blocked_{c}_s" for c in ("kv_blocks", "token_budget", "batch_slots", "higher_class", "static_batch",
                                      "tier_transfer", "preempted", "iteration")]


@pytest.mark.parametrize("fleet", [False, True])
def test_requests_waiting_at_a_duration_stop_report_their_blocked_seconds(tmp_path, fleet):
    """Requests still waiting at a duration stop had no blocked seconds in requests.parquet
    after seconds of waiting (their rows were left open: the clocks settle at admission). Now
    a never-admitted request's causes sum to end - arrival, and one preempted back to waiting
    shows its preempted seconds; the summary's blockage (finished requests) is unchanged."""
    import pandas as pd

    raw = {**MIX, "stop": {"duration_s": 4.0},
           "engine": {"scheduler": "vllm", "max_num_seqs": 3, "num_gpu_blocks_override": 24, "block_size": 16},
           "step_time": {"model": "constant", "seconds": 0.02},
           "workload": {"arrival": {"process": "poisson", "rate": 12.0},
                        "prompt": {"dist": "uniform", "min": 20, "max": 120},
                        "output": {"dist": "uniform", "min": 40, "max": 150}}}
    if fleet:
        raw["cluster"] = {"router": "round-robin", "groups": [{"replicas": 2}]}
    code, crash, out, err = _run_raw(tmp_path, raw)
    assert code == 0 and crash is None, err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    end = summary["sim_time_s"]
    req = pd.read_parquet(tmp_path / "out" / "requests.parquet")
    waiting = req[req["status"] == "waiting"]
    fresh = waiting[waiting["preemptions"] == 0]
    again = waiting[waiting["preemptions"] > 0]
    assert len(fresh) > 5 and len(again) > 0, req["status"].value_counts()  # the cases are there
    assert waiting[BLOCKED].notna().all().all()
    waited = end - fresh["arrival_s"]
    assert np.allclose(fresh[BLOCKED].sum(axis=1), waited, rtol=1e-9, atol=1e-9), (fresh[BLOCKED].sum(axis=1) - waited)
    assert (fresh[BLOCKED] >= -1e-12).all().all()
    assert (again["blocked_preempted_s"] > 0).all()
    assert (again[BLOCKED].sum(axis=1) <= end - again["arrival_s"] + 1e-9).all()


# ------------------------------------ 2: the waiting time series counts arrivals mid-step
def _waiting_integral(res) -> float:
    ts, end = res.timeseries, res.summary["sim_time_s"]
    t = ts["t_s"].to_numpy()
    width = np.minimum(res.recorder.series.bin_s, np.maximum(end - t, 0.0))
    return float(np.nansum(ts["waiting_mean"].to_numpy() * width))


def test_requests_arriving_during_an_iteration_are_waiting():
    """One 5 s iteration with two requests arriving 1 and 2 ms after its start read 0 waiting
    in every bin: the recorder kept the queue as the step began."""
    from servesim import scenario_from_dict, simulate
    from servesim.request import Workload

    raw = {**MIX, "stop": {"requests": 3}, "step_time": {"model": "constant", "seconds": 5.0},
           "metrics": {"timeseries_bin_s": 1.0}}
    wl = Workload(np.array([0.0, 0.001, 0.002]), np.array([10, 10, 10]), np.array([1, 1, 1]),
                  np.zeros(3, dtype=np.int8))
    res = simulate(scenario_from_dict(raw), workload=wl)
    ts = res.timeseries
    first = ts[ts["t_s"] < 5.0]
    assert len(first) == 5
    assert first["waiting_mean"].tolist() == pytest.approx([2 - 0.003, 2, 2, 2, 2], abs=1e-9)
    assert first["waiting_peak"].tolist() == [2, 2, 2, 2, 2]
    assert _waiting_integral(res) == pytest.approx(res.requests["queue_s"].sum(), rel=1e-9)


@pytest.mark.parametrize("fleet", [False, True])
def test_waiting_integral_is_the_queueing_time_littles_law(fleet):
    """Little's law on the run's own files: the time integral of waiting requests equals the sum
    of their queueing times (no preemption here, so every wait is a queue_s). The quickstart read
    3.4 request-seconds against 181.0."""
    from servesim import scenario_from_dict, simulate

    raw = {**MIX, "stop": {"requests": 400}, "step_time": {"model": "constant", "seconds": 0.02},
           "engine": {"scheduler": "vllm", "max_num_seqs": 4},
           "metrics": {"timeseries_bin_s": 0.5},
           "workload": {"arrival": {"process": "poisson", "rate": 18.0},
                        "prompt": {"dist": "uniform", "min": 20, "max": 300},
                        "output": {"dist": "uniform", "min": 2, "max": 12}}}
    if fleet:
        raw["cluster"] = {"router": "least-requests", "groups": [{"replicas": 2}]}
        raw["workload"]["arrival"]["rate"] = 36.0
    res = simulate(scenario_from_dict(raw))
    req = res.requests
    assert (req["preemptions"] == 0).all() and (req["status"] == "finished").all()
    queued = float(req["queue_s"].sum())
    assert queued > 5.0  # a queue worth the name
    assert _waiting_integral(res) == pytest.approx(queued, rel=1e-9)
