"""Bad input: every malformed scenario gets one line naming the field, the value and what is
allowed, exit status 2, and no traceback."""

from __future__ import annotations


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
    path.write_text(content)
    return runner.invoke(app, ["run", str(path), "--out", str(tmp_path / "out"), *extra])


CASES = [
    # (id, scenario patch or raw text, extra args, substrings the error line must contain)
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
    ("missing-pack", merge(BASE, {"hardware": {"gpu": "h100-80g"}, "step_time": {"model": "pack"}}), (),
     ["no calibration pack", "h100-80g", "available"]),
    ("inline-model-missing-field", merge(BASE, {"model": {"num_layers": 2, "hidden_size": 64}}), (),
     ["model", "required"]),
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
