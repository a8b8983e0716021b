"""Bad input: every malformed scenario gets one line naming the field, the value and what is
allowed, exit status 2, and no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from servesim.cli import app
from tests.conftest import BASE, merge

runner = CliRunner()


def run_cli(tmp_path, content, extra=()):
    path = tmp_path / "bad.yaml"
    if isinstance(content, dict):
        content = yaml.safe_dump(content)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return runner.invoke(app, ["run", str(path), "--out", str(tmp_path / "out"), *extra])


INF = float("inf")
FLEET = merge(BASE, {"hardware": {"replicas": 2}})  # (round-robin: shardable without a refresh interval)


def _alias_bomb(levels: int = 9) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


CASES = [
    # (id, scenario patch or raw text, extra args, substrings the error line must contain)
    ("roofline-fit-other-gpu", merge(BASE, {"hardware": {"gpu": "h200"},
                                            "step_time": {"model": "roofline", "fit": "a100-80g/llama-3-8b"}}),
     (), ["step_time.fit", "a100-80g", "h200"]),
    ("roofline-fit-bad-ref", merge(BASE, {"step_time": {"model": "roofline", "fit": "a100-80g"}}), (),
     ["fit", "<gpu>/<model>"]),
    ("roofline-fit-unknown-model", merge(BASE, {"step_time": {"model": "roofline", "fit": "a100-80g/llama-9"}}),
     (), ["llama-9", "allowed"]),
    ("roofline-fit-and-mfu", merge(BASE, {"step_time": {"model": "roofline", "fit": "a100-80g/llama-3-8b",
                                                        "mfu": 0.5}}), (), ["step_time.mfu", "fit"]),
    ("roofline-fit-missing-pack", merge(BASE, {"hardware": {"gpu": "h100-pcie"},
                                               "step_time": {"model": "roofline", "fit": "h100-pcie/llama-3-8b"}}),
     (), ["no calibration pack", "h100-pcie", "fallback"]),
    ("unknown-top-field", merge(BASE, {"enigne": {}}), (), ["enigne", "unknown field"]),
    ("unknown-nested-field", merge(BASE, {"engine": {"blok_size": 16}}), (), ["engine.blok_size", "unknown field"]),
    ("wrong-type", merge(BASE, {"engine": {"max_num_seqs": "many"}}), (), ["engine.max_num_seqs", "'many'", "integer"]),
    ("negative-rate", merge(BASE, {"workload": {"arrival": {"process": "poisson", "rate": -1}}}), (),
     ["workload.arrival.poisson.rate", "-1", "greater than 0"]),
    ("unknown-gpu", merge(BASE, {"hardware": {"gpu": "a200"}}), (), ["hardware.gpu", "'a200'", "a100-80g"]),
    ("block-size-zero", merge(BASE, {"engine": {"block_size": 0}}), (), ["engine.block_size", "0", "greater than or equal to 1"]),
    ("block-size-huge", merge(BASE, {"engine": {"block_size": 1024}}), (), ["engine.block_size", "1024", "256"]),
    ("model-does-not-fit", merge(BASE, {"engine": {"gpu_memory_utilization": 0.15}}), (),
     ["does not fit", "llama-3-8b", "weights"]),
    ("unknown-model", merge(BASE, {"model": "llama-9"}), (), ["model", "'llama-9'", "llama-3-8b"]),
    ("utilization-above-one", merge(BASE, {"engine": {"gpu_memory_utilization": 1.5}}), (),
     ["engine.gpu_memory_utilization", "1.5", "less than or equal to 1"]),
    ("unknown-arrival-process", merge(BASE, {"workload": {"arrival": {"process": "poison", "rate": 1}}}), (),
     ["workload.arrival", "poison", "poisson"]),
    ("unknown-scheduler", merge(BASE, {"engine": {"scheduler": "fifo2"}}), (), ["engine.scheduler", "'fifo2'", "vllm"]),
    ("no-stop-limit", {**BASE, "stop": {"warmup_requests": 3}}, (), ["stop", "requests", "duration_s"]),
    ("lognormal-min-above-max", merge(BASE, {"workload": {"prompt": {"dist": "lognormal", "mean": 100, "sigma": 1,
                                                                     "min": 50, "max": 10}}}), (),
     ["workload.prompt", "min 50", "max 10"]),
    ("tp-pp-mismatch", merge(BASE, {"hardware": {"gpus_per_replica": 4, "tp": 2, "pp": 1}}), (),
     ["hardware", "tp 2", "gpus_per_replica 4"]),
    ("budget-below-max-model-len", merge(BASE, {"engine": {"max_num_batched_tokens": 2048}}), (),
     ["max_num_batched_tokens 2048", "max_model_len 8192", "chunked"]),
    ("warmup-not-below-requests", merge(BASE, {"stop": {"requests": 10, "warmup_requests": 10}}), (),
     ["warmup_requests 10", "requests 10"]),
    ("negative-seed", merge(BASE, {"seed": -3}), (), ["seed", "-3"]),
    ("not-a-mapping", "- a\n- b\n", (), ["must be a YAML mapping"]),
    ("empty-file", "", (), ["empty"]),
    ("yaml-syntax", "name: [unclosed\n", (), ["not valid YAML"]),
    ("set-without-equals", BASE, ("--set", "engine.max_num_seqs"), ["KEY=VALUE"]),
    ("set-through-scalar", BASE, ("--set", "seed.x=1"), ["seed", "not a mapping"]),
    ("set-bad-yaml-value", BASE, ("--set", "engine={"), ["engine", "not valid YAML"]),
    ("set-invalid-value", BASE, ("--set", "workload.arrival.rate=0"), ["workload.arrival.poisson.rate", "0"]),
    ("unknown-policy-option", merge(BASE, {"engine": {"options": {"mixx": 1}}}), (),
     ["engine.options.mixx", "unknown option", "swap_space_gib"]),
    ("bad-policy-option-value", merge(BASE, {"engine": {"scheduler": "chunked", "options": {"mix": "weird"}}}), (),
     ["engine.options.mix", "'weird'", "stall_free"]),
    ("missing-pack", merge(BASE, {"hardware": {"gpu": "h100-pcie"}, "step_time": {"model": "pack"}}), (),
     ["no calibration pack", "h100-pcie", "available"]),
    ("inline-model-missing-field", merge(BASE, {"model": {"num_layers": 2, "hidden_size": 64}}), (),
     ["model", "required"]),
    # issue 17: non-finite numbers and absurd magnitudes (tracebacks or nonsense runs before)
    ("cpu-overhead-inf", merge(BASE, {"engine": {"cpu_overhead_s": INF}}), (), ["engine.cpu_overhead_s", "inf", "finite"]),
    ("constant-step-inf", merge(BASE, {"step_time": {"model": "constant", "seconds": INF}}), (),
     ["step_time.constant.seconds", "inf", "finite"]),
    ("constant-step-1e300", merge(BASE, {"step_time": {"model": "constant", "seconds": 1e300}}), (),
     ["step_time.constant.seconds", "1e+300", "less than or equal to 3600"]),
    ("roofline-overhead-inf", merge(BASE, {"step_time": {"model": "roofline", "overhead_s": INF}}), (),
     ["step_time.roofline.overhead_s", "inf", "finite"]),
    ("gamma-cv-inf", merge(BASE, {"workload": {"arrival": {"process": "gamma", "rate": 10, "cv": INF}}}), (),
     ["workload.arrival.gamma.cv", "inf", "finite"]),
    ("gamma-cv-tiny", merge(BASE, {"workload": {"arrival": {"process": "gamma", "rate": 10, "cv": 1e-300}}}), (),
     ["workload.arrival.gamma.cv", "1e-300", "greater than or equal to 0.001"]),
    ("gamma-cv-huge", merge(BASE, {"workload": {"arrival": {"process": "gamma", "rate": 10, "cv": 1e300}}}), (),
     ["workload.arrival.gamma.cv", "1e+300", "less than or equal to 1000"]),
    ("class-weight-inf", merge(BASE, {"workload": {"classes": {"weights": [INF, 1]}}}), (),
     ["workload.classes.weights[0]", "inf", "finite"]),
    ("geometric-mean-inf", merge(BASE, {"workload": {"prompt": {"dist": "geometric", "mean": INF}}}), (),
     ["workload.prompt.geometric.mean", "inf", "finite"]),
    ("swap-space-inf", merge(BASE, {"engine": {"preemption": "swap", "options": {"swap_space_gib": INF}}}), (),
     ["engine.options.swap_space_gib", "inf", "GiB"]),
    ("rate-inf", merge(BASE, {"workload": {"arrival": {"process": "poisson", "rate": INF}}}), (),
     ["workload.arrival.poisson.rate", "inf", "finite"]),
    ("constant-rate-1e300", merge(BASE, {"workload": {"arrival": {"process": "constant", "rate": 1e300}}}), (),
     ["workload.arrival.constant.rate", "1e+300", "less than or equal to 1000000"]),
    ("closed-infinite-think", merge(BASE, {"workload": {"arrival": {"process": "closed", "clients": 2, "think_s": INF}}}),
     (), ["workload.arrival.closed.think_s", "inf", "finite"]),
    ("slo-inf", merge(BASE, {"slo": {"ttft_s": INF}}), (), ["slo.ttft_s", "inf", "finite"]),
    ("slo-inf-set", BASE, ("--set", "slo.ttft_s=.inf"), ["slo.ttft_s", "inf", "finite"]),
    ("stop-requests-2e9", merge(BASE, {"stop": {"requests": 2_000_000_000}}), (),
     ["stop.requests", "2000000000", "less than or equal to 100000000"]),
    ("duration-times-rate-too-many", merge(BASE, {"stop": {"requests": None, "duration_s": 1e7},
                                                  "workload": {"arrival": {"process": "poisson", "rate": 1e5}}}), (),
     ["stop.duration_s", "workload.arrival.rate", "at most 100,000,000"]),
    # strict types: no bool as int, no string or float read as a count
    ("bool-as-int", merge(BASE, {"engine": {"max_num_seqs": True}}), (), ["engine.max_num_seqs", "True", "integer"]),
    ("bool-as-float", merge(BASE, {"workload": {"arrival": {"process": "poisson", "rate": True}}}), (),
     ["workload.arrival.poisson.rate", "True", "number"]),
    ("string-as-int", merge(BASE, {"engine": {"max_num_seqs": "64"}}), (), ["engine.max_num_seqs", "'64'", "integer"]),
    ("float-as-int", merge(BASE, {"engine": {"max_num_seqs": 64.5}}), (), ["engine.max_num_seqs", "64.5", "integer"]),
    ("string-as-bool", merge(BASE, {"engine": {"enable_chunked_prefill": "yes"}}), (),
     ["engine.enable_chunked_prefill", "'yes'", "boolean"]),
    ("seed-bool", merge(BASE, {"seed": True}), (), ["seed", "True", "integer"]),
    # YAML that safe_load accepts but that is not plain, unambiguous data
    ("duplicate-key", "name: a\nname: b\nstop: {requests: 5}\n", (), ["line 2", "duplicate key 'name'", "line 1"]),
    ("duplicate-nested-key", "engine: {max_num_seqs: 4, max_num_seqs: 8}\n", (), ["duplicate key 'max_num_seqs'"]),
    ("not-utf8", b"name: \xff\xfe\n", (), ["not UTF-8"]),
    ("recursive-alias", "a: &a [*a]\n", (), ["line 1", "recursive alias"]),
    ("alias-bomb", _alias_bomb(), (), ["alias bomb", "1,000,000"]),
    ("results-file", {"scenario": "t", "seed": 1, "requests": {"arrived": 5}, "throughput": {},
                      "latency_s": {}, "engine": {"iterations": 9}}, (), ["results file", "not a scenario"]),
    ("union-bad-value", merge(BASE, {"workload": {"classes": {"default": 9}}}), (),
     ["workload.classes.default", "9", "not a class"]),
    ("markup-survives", merge(BASE, {"engine": {"scheduler": "[foo]"}}), (), ["'[foo]'", "not a known policy"]),
    ("name-escapes-out", merge(BASE, {"name": "../../etc"}), (), ["name", "'../../etc'", "plain name"]),
    ("scheduler-calls-function", merge(BASE, {"engine": {"scheduler": "os:system"}}), (),
     ["engine.scheduler 'os:system'", "not a policy class", "base", "parts"]),
    ("scheduler-not-a-policy-class", merge(BASE, {"engine": {"scheduler": "collections:OrderedDict"}}), (),
     ["collections:OrderedDict", "'base' = None", "built-in policy"]),
    ("seed-negative-cli", BASE, ("--seed", "-1"), ["--seed -1", "0.."]),
    # options of another scheduler or allocator
    ("chunk-size-under-vllm", merge(BASE, {"engine": {"chunked_prefill_size": 512}}), (),
     ["engine.chunked_prefill_size", "512", "scheduler chunked", "'vllm'"]),
    ("max-running-under-priority", merge(BASE, {"engine": {"scheduler": "priority", "max_running_requests": 8}}), (),
     ["engine.max_running_requests", "scheduler chunked", "'priority'"]),
    ("batch-size-under-vllm", merge(BASE, {"engine": {"max_batch_size": 4}}), (),
     ["engine.max_batch_size", "static-fifo", "'vllm'"]),
    ("swap-under-static-fifo", merge(BASE, {"engine": {"scheduler": "static-fifo", "preemption": "swap"}}), (),
     ["engine.preemption", "'swap'", "'static-fifo'"]),
    ("preload-without-prefix-caching", merge(BASE, {"engine": {"kv": {"preload": {"min_hits": 2}}}}), (),
     ["engine.kv.preload", "enable_prefix_caching"]),
    ("eviction-without-prefix-caching", merge(BASE, {"engine": {"prefix_cache_eviction": "priority"}}), (),
     ["engine.prefix_cache_eviction", "'priority'", "enable_prefix_caching"]),
    ("eviction-unknown", merge(BASE, {"engine": {"enable_prefix_caching": True, "prefix_cache_eviction": "lfu"}}),
     (), ["engine.prefix_cache_eviction", "'lfu'", "'lru'", "'priority'", "'sglang'"]),
    ("preload-under-sglang-eviction", merge(BASE, {"engine": {"enable_prefix_caching": True,
                                                               "prefix_cache_eviction": "sglang",
                                                               "kv": {"preload": {"min_hits": 2}}}}), (),
     ["engine.kv.preload", "lru or priority", "'sglang'"]),
    ("protect-share-under-lru", merge(BASE, {"engine": {"enable_prefix_caching": True,
                                                         "kv": {"protect_share": [0.5]}}}), (),
     ["engine.kv.protect_share", "prefix_cache_eviction: priority"]),
    ("static-options-under-paged", merge(BASE, {"engine": {"kv": {"static": {"fit": "best"}}}}), (),
     ["engine.kv.static", "kv_allocator: static"]),
    ("gpus-not-dividing-kv-heads", merge(BASE, {"hardware": {"gpus_per_replica": 3}}), (),
     ["hardware", "tp 3", "8 KV heads", "1, 2, 4, 8"]),
    ("max-model-len-above-the-model", merge(BASE, {"engine": {"max_model_len": 32768, "max_num_batched_tokens": 32768}}),
     (), ["engine.max_model_len = 32768", "context limit 8192", "llama-3-8b"]),
    ("inline-model-heads", merge(BASE, {"model": {"num_layers": 2, "hidden_size": 64, "num_heads": 6, "num_kv_heads": 4,
                                                  "head_dim": 16, "intermediate_size": 128, "vocab_size": 100}}), (),
     ["num_heads 6", "multiple of num_kv_heads 4"]),
    ("step-time-without-its-model", {**BASE, "step_time": {"cuda_graph_max_batch": 128}}, (),
     ["step_time.model is missing", "docs/scenario-reference.md"]),
    ("graph-cap-below-one", merge(BASE, {"step_time": {"model": "auto", "cuda_graph_max_batch": 0}}), (),
     ["cuda_graph_max_batch = 0", "greater than or equal to 1"]),
    # a fleet sharded over worker processes (sim.workers, --scheduler; servesim/engine/shard.py):
    # refused before any worker starts
    ("workers-zero", merge(FLEET, {"sim": {"workers": 0}}), (), ["sim.workers = 0", "greater than or equal to 1"]),
    ("workers-negative", merge(FLEET, {"sim": {"workers": -2}}), (), ["sim.workers = -2", "greater than or equal to 1"]),
    ("workers-not-a-number", merge(FLEET, {"sim": {"workers": "two"}}), (), ["sim.workers = 'two'", "integer"]),
    ("workers-fraction", merge(FLEET, {"sim": {"workers": 1.5}}), (), ["sim.workers = 1.5", "integer"]),
    ("workers-above-replicas", merge(FLEET, {"sim": {"workers": 3}}), (),
     ["sim.workers = 3", "more workers than the fleet's 2 replicas", "allowed: 1..2"]),
    ("workers-lone-replica", merge(BASE, {"sim": {"workers": 2}}), (),
     ["sim.workers = 2", "lone replica", "hardware.replicas > 1"]),
    ("workers-bad-user-policy", merge(FLEET, {"sim": {"workers": 2}, "engine": {"scheduler": "os:system"}}), (),
     ["engine.scheduler 'os:system'", "not a policy class"]),
    ("scheduler-empty", FLEET, ("--scheduler", ""), ["--scheduler ''", "not a scheduler address", "host:port"]),
    ("scheduler-bad-port", FLEET, ("--scheduler", "tcp://127.0.0.1:99999"),
     ["--scheduler 'tcp://127.0.0.1:99999'", "not a scheduler address", "host:port"]),
    ("scheduler-port-not-a-number", FLEET, ("--scheduler", "localhost:xx"),
     ["--scheduler 'localhost:xx'", "not a scheduler address"]),
    ("scheduler-lone-replica", BASE, ("--scheduler", "tcp://127.0.0.1:8786"),
     ["--scheduler", "lone replica", "hardware.replicas > 1"]),
]


@pytest.mark.parametrize("case_id,content,extra,needles", CASES, ids=[c[0] for c in CASES])
def test_bad_scenario_one_line_exit_2(tmp_path, case_id, content, extra, needles):
    res = run_cli(tmp_path, content, extra)
    assert res.exit_code == 2, (res.stdout, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    text = " ".join(lines)
    assert res.stderr.startswith("error:"), res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    for needle in needles:
        assert needle in text, f"{needle!r} not in {text!r}"
    # one logical line (the console may soft-wrap nothing: we print with soft_wrap)
    assert len(lines) == 1, lines


def test_unreachable_scheduler_exit_2(tmp_path):
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    line = _one_error_line(run_cli(tmp_path, FLEET, ("--scheduler", f"127.0.0.1:{port}")))
    assert f"--scheduler 127.0.0.1:{port}: cannot reach a dask scheduler there" in line, line


def test_missing_file(tmp_path):
    res = runner.invoke(app, ["run", str(tmp_path / "nope.yaml")])
    assert res.exit_code == 2 and "no such scenario file" in res.stderr


def test_library_raises_scenario_error():
    from servesim import ServesimError, scenario_from_dict

    with pytest.raises(ServesimError, match=r"engine.block_size = 0"):
        scenario_from_dict(merge(BASE, {"engine": {"block_size": 0}}))


def test_good_scenario_runs(tmp_path):
    res = run_cli(tmp_path, BASE)
    assert res.exit_code == 0, res.stderr
    assert (tmp_path / "out" / "summary.json").is_file()
    assert (tmp_path / "out" / "requests.parquet").is_file()


# ------------------------------------------------------------------ --out, --force (issue 17)
def _scenario_file(tmp_path, patch=None):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(merge(BASE, patch or {})))
    return path


def _one_error_line(res):
    assert res.exit_code == 2, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr + res.stdout
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), lines
    return lines[0]


def test_out_at_a_file_is_refused_before_the_run(tmp_path):
    target = tmp_path / "afile"
    target.write_text("x")
    line = _one_error_line(runner.invoke(app, ["run", str(_scenario_file(tmp_path)), "--out", str(target)]))
    assert f"--out {target}: is a file" in line
    assert target.read_text() == "x"


def test_out_below_a_file_is_refused_before_the_run(tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    line = _one_error_line(runner.invoke(app, ["run", str(_scenario_file(tmp_path)), "--out", str(blocker / "sub")]))
    assert "cannot create it" in line and "is a file" in line


def test_out_holding_a_run_needs_force(tmp_path):
    path, out = _scenario_file(tmp_path), tmp_path / "out"
    assert runner.invoke(app, ["run", str(path), "--out", str(out), "--seed", "1"]).exit_code == 0
    first = (out / "summary.json").read_text()
    line = _one_error_line(runner.invoke(app, ["run", str(path), "--out", str(out), "--seed", "2"]))
    assert "already holds a run" in line and "--force" in line
    assert (out / "summary.json").read_text() == first  # untouched
    res = runner.invoke(app, ["run", str(path), "--out", str(out), "--seed", "2", "--force"])
    assert res.exit_code == 0, res.stderr
    assert json.loads((out / "summary.json").read_text())["seed"] == 2
    assert not list(out.glob(".*partial"))


def test_out_folder_without_a_run_is_used(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert runner.invoke(app, ["run", str(_scenario_file(tmp_path)), "--out", str(out)]).exit_code == 0
    assert (out / "notes.txt").read_text() == "mine" and (out / "summary.json").is_file()


# --------------------------------------------------------------------- honest outputs (issue 17)
def test_summary_json_is_strict_json():
    from servesim.simulate import summary_json

    text = summary_json({"a": float("inf"), "b": [1.0, float("nan")], "c": {"d": 2.5}})
    assert "Infinity" not in text and "NaN" not in text
    assert json.loads(text) == {"a": None, "b": [1.0, None], "c": {"d": 2.5}}


def test_warmup_reported_as_what_arrived():
    from servesim import scenario_from_dict, simulate

    res = simulate(scenario_from_dict(merge(BASE, {"stop": {"requests": 50, "warmup_requests": 40, "duration_s": 1.0}})))
    r = res.summary["requests"]
    assert r["arrived"] < 40 and r["warmup"] == r["arrived"] and r["measured"] == 0
    assert res.summary["latency_s"]["itl"]["count"] == 0  # nothing measured: no ITL either


# ------------------------------------------------------------------------ Python API (issue 17)
def test_python_api_refuses_the_same_values():
    from servesim import ServesimError, scenario_from_dict, simulate

    for patch, needle in [({"engine": {"max_num_seqs": True}}, "engine.max_num_seqs = True"),
                          ({"workload": {"arrival": {"process": "poisson", "rate": float("inf")}}}, "finite")]:
        with pytest.raises(ServesimError, match=needle):
            scenario_from_dict(merge(BASE, patch))
    # a user policy is imported when the run is built (validation imports no policy code)
    with pytest.raises(ServesimError, match="not a policy class"):
        simulate(scenario_from_dict(merge(BASE, {"engine": {"scheduler": "os:system"}})))
    with pytest.raises(ServesimError, match=r"seed -1: a seed is an integer"):
        simulate(scenario_from_dict(BASE), seed=-1)


def test_numbers_mean_numbers():
    """YAML 1.2 exponents are floats (PyYAML alone reads 1e3 as a string); numpy scalars from a
    Python caller's grid are the numbers they hold."""
    import numpy as np

    from servesim import scenario_from_dict
    from servesim.scenario import load_scenario

    path_text = yaml.safe_dump(BASE).replace("rate: 10.0", "rate: 1e1")
    assert "rate: 1e1" in path_text
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "s.yaml"
        p.write_text(path_text)
        assert load_scenario(p).workload.arrival.rate == 10.0
        assert load_scenario(p, ["workload.arrival.rate=2.5e1"]).workload.arrival.rate == 25.0
    sc = scenario_from_dict(merge(BASE, {"engine": {"max_num_seqs": np.int64(12)},
                                         "workload": {"arrival": {"process": "poisson", "rate": np.float32(4.0)}}}))
    assert sc.engine.max_num_seqs == 12 and type(sc.engine.max_num_seqs) is int
