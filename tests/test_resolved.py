"""scenario.resolved.yaml: written by every run, a fixed point, and it re-runs to the same summary."""

from __future__ import annotations

import hashlib
import json

import pytest
import yaml
from typer.testing import CliRunner

from servesim.cli import app
from servesim.resolved import resolved_yaml
from servesim.scenario import load_scenario
from servesim.simulate import simulate
from tests.conftest import REPO, SCENARIO_FILES, SHARED

SCENARIOS = SCENARIO_FILES


@pytest.mark.parametrize("path", SCENARIOS, ids=[str(p.relative_to(REPO / "scenarios")) for p in SCENARIOS])
def test_resolved_scenario_is_a_fixed_point(path, tmp_path):
    if "shared/" in path.read_text() and not SHARED.is_dir():
        pytest.skip("needs ../shared")
    sc = load_scenario(path, ["seed=7"])
    text = resolved_yaml(sc)
    (tmp_path / "elsewhere").mkdir()
    again = tmp_path / "elsewhere" / "scenario.resolved.yaml"  # another folder: paths must be absolute
    again.write_text(text)
    assert resolved_yaml(load_scenario(again)) == text
    data = yaml.safe_load(text)
    assert "base_dir" not in data and data["seed"] == 7
    assert text.startswith("# scenario.resolved.yaml") and "# servesim " in text


@pytest.mark.parametrize("file,overrides", [
    ("scenarios/examples/three_streams.yaml", ["stop.duration_s=40", "workload.rate_scale=1.5"]),
    ("scenarios/engines/halo.yaml", ["stop.requests=300", "engine.scheduler=vllm"]),
    ("scenarios/traces/chat_sessions.yaml", ["stop.requests=300"]),
])
def test_resolved_scenario_reruns_to_the_same_summary(file, overrides, tmp_path):
    runner = CliRunner()
    first = runner.invoke(app, ["run", str(REPO / file), "--out", str(tmp_path / "a"), "--seed", "3", "-q",
                                *[x for o in overrides for x in ("--set", o)]])
    assert first.exit_code == 0, first.output
    resolved = tmp_path / "a" / "scenario.resolved.yaml"
    second = runner.invoke(app, ["run", str(resolved), "--out", str(tmp_path / "b"), "-q"])
    assert second.exit_code == 0, second.output
    a, b = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("a", "b"))
    assert a.pop("wall_s") >= 0 and b.pop("wall_s") >= 0  # the only wall-clock field
    assert json.dumps(a) == json.dumps(b)
    assert a["resolved_scenario"]["sha256"] == hashlib.sha256(resolved.read_bytes()).hexdigest()
    assert (tmp_path / "b" / "scenario.resolved.yaml").read_bytes() == resolved.read_bytes()
    assert a["seed"] == 3


def test_summary_names_version_and_pack():
    sc = load_scenario(REPO / "scenarios/engines/halo.yaml", ["stop.requests=50", "stop.warmup_requests=0"])
    info = simulate(sc).summary["resolved_scenario"]
    assert info["servesim_version"]
    assert info["calibration_pack"].startswith("a100-80g/llama-3-8b sha256:")
    sc2 = load_scenario(REPO / "scenarios/quickstart.yaml", ["stop.requests=50", "stop.warmup_requests=0",
                                                            "step_time={model: roofline}"])
    assert simulate(sc2).summary["resolved_scenario"]["calibration_pack"] is None
    sc3 = load_scenario(REPO / "scenarios/quickstart.yaml", ["stop.requests=50", "stop.warmup_requests=0"])
    assert simulate(sc3).summary["resolved_scenario"]["calibration_pack"].startswith("a100-80g/llama-3-8b sha256:")


# ---------------------------------------------------------------------------- preset switch
def test_switching_a_preset_policy_drops_its_options_with_a_note():
    sc = load_scenario(REPO / "scenarios/engines/halo.yaml", ["engine.scheduler=vllm", "stop.requests=200"])
    assert sc.engine.options == {}
    assert sc.load_notes == ("engine.options: dropped aging_s, class_max_seqs, preempt_lower (options of "
                             "scheduler 'priority', which --set engine.scheduler=vllm replaced)",)
    assert simulate(sc).summary["requests"]["completed"] == 200
    out = CliRunner().invoke(app, ["check", str(REPO / "scenarios/engines/halo.yaml"),
                                   "--set", "engine.scheduler=vllm"])
    assert out.exit_code == 0 and "dropped aging_s" in out.output
    # options the new policy knows too are kept (priority extends vllm: swap_space_gib stays)
    sc = load_scenario(REPO / "scenarios/engines/vllm-v0.yaml", ["engine.scheduler=priority"])
    assert sc.engine.options == {"swap_space_gib": 4} and sc.load_notes == sc.engine_notes
    sc = load_scenario(REPO / "scenarios/engines/vllm-v0.yaml", ["engine.scheduler=static-fifo"])
    assert sc.engine.options == {} and "dropped swap_space_gib" in sc.load_notes[0]


def test_foreign_options_given_on_purpose_stay_errors():
    out = CliRunner().invoke(app, ["check", str(REPO / "scenarios/engines/vllm.yaml"),
                                   "--set", "engine.options.aging_s=5"])
    assert out.exit_code == 2
    assert "engine.options.aging_s: unknown option for scheduler 'vllm'" in out.output
    assert "--set 'engine.options=" in out.output
    out = CliRunner().invoke(app, ["check", str(REPO / "scenarios/engines/halo.yaml"),
                                   "--set", "engine.scheduler=vllm", "--set", "engine.options.aging_s=5"])
    assert out.exit_code == 2 and "aging_s" in out.output
