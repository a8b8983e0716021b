"""Python-side overrides validate exactly like the CLI's ``--set``; no copy skips validation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import servesim
from servesim.cli import app
from servesim.errors import ScenarioError
from servesim.scenario import EngineConfig, Scenario
from tests.conftest import BASE, REPO, scenario


def test_override_changes_fields_and_keeps_the_rest():
    sc = scenario()
    new = sc.override({"engine.max_num_seqs": 3, "workload.arrival.rate": 7.5})
    assert new.engine.max_num_seqs == 3 and new.workload.arrival.rate == 7.5
    assert new.engine.block_size == sc.engine.block_size and new.stop == sc.stop
    assert sc.engine.max_num_seqs == 8  # the original is untouched (frozen)


def test_override_fills_defaulted_subconfigs():
    sc = Scenario()  # workload.arrival is the default Poisson, never written in a file
    new = sc.override({"workload.arrival.rate": 3})
    assert new.workload.arrival.process == "poisson" and new.workload.arrival.rate == 3.0


def test_override_mapping_replaces_the_subconfig():
    sc = scenario()
    new = sc.override({"workload.arrival": {"process": "gamma", "rate": 4.0, "cv": 2.0}})
    assert new.workload.arrival.process == "gamma" and new.workload.arrival.cv == 2.0


def test_override_accepts_config_objects():
    sc = scenario()
    new = sc.override({"engine": EngineConfig(max_num_seqs=5)})
    assert new.engine.max_num_seqs == 5


def test_empty_override_is_identity():
    sc = servesim.load_scenario(REPO / "scenarios/quickstart.yaml")
    assert sc.override({}) == sc


def _cli_error(tmp_path, path: str, text: str) -> str:
    import yaml

    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(BASE))
    res = CliRunner().invoke(app, ["check", str(f), "--set", f"{path}={text}"])
    assert res.exit_code == 2
    return res.stderr.strip().removeprefix("error: ").split(": ", 1)[1]


@pytest.mark.parametrize("path,value,text", [
    ("engine.max_num_seqs", -5, "-5"),
    ("engine.block_size", 1024, "1024"),
    ("engine.max_num_seqz", 1, "1"),
    ("workload.arrival.rate", "fast", "fast"),
    ("hardware.gpu", "a200", "a200"),
    ("seed.x", 1, "1"),
])
def test_override_errors_match_the_cli(tmp_path, path, value, text):
    with pytest.raises(ScenarioError) as err:
        scenario().override({path: value})
    line = str(err.value)
    assert "\n" not in line
    cli = _cli_error(tmp_path, path, text)
    # same message after the source prefix (the CLI says "--set PATH" where the API says "PATH")
    assert line.split(": ", 1)[1] == cli.replace(f"--set {path}", path)


def test_load_scenario_with_a_mapping():
    sc = servesim.load_scenario(REPO / "scenarios/quickstart.yaml", {"engine.max_num_seqs": 64})
    assert sc.engine.max_num_seqs == 64
    with pytest.raises(ScenarioError, match="engine.max_num_seqs = -1"):
        servesim.load_scenario(REPO / "scenarios/quickstart.yaml", {"engine.max_num_seqs": -1})


def test_model_copy_update_is_validated():
    sc = scenario()
    with pytest.raises(ScenarioError, match="engine.max_num_seqs = -5"):
        sc.model_copy(update={"engine": sc.engine.model_copy(update={"max_num_seqs": -5})})
    with pytest.raises(ScenarioError, match="engine.max_num_seqs = -5"):
        sc.model_copy(update={"engine.max_num_seqs": -5})
    assert sc.model_copy(update={"seed": 9}).seed == 9
    assert sc.model_copy() == sc


def test_constructor_revalidates_nested_objects():
    bad = EngineConfig().model_copy(update={"max_num_seqs": -5})  # pydantic lets this through
    assert bad.max_num_seqs == -5
    with pytest.raises(Exception, match="max_num_seqs"):
        Scenario(engine=bad)


def test_trace_workload_keeps_its_sources_rule():
    # a trace gives arrivals itself: overriding the arrival rate must be refused, not merged
    raw = {**BASE, "workload": {"trace": {"file": "x.csv", "format": "azure"}}}
    sc = servesim.scenario_from_dict(raw, "t")
    with pytest.raises(ScenarioError, match="workload.trace gives arrivals"):
        sc.override({"workload.arrival.rate": 2.0})
    assert sc.override({"workload.trace.rate_scale": 2.0}).workload.trace.rate_scale == 2.0


@settings(max_examples=40, deadline=None)
@given(seqs=st.integers(-10, 70000), bs=st.integers(-3, 300), rate=st.floats(-5, 100, allow_nan=False))
def test_override_valid_iff_fields_valid(seqs, bs, rate):
    """Property: an override succeeds exactly when every value is in its documented range, and
    then holds exactly the values given."""
    sc = scenario()
    ok = 1 <= seqs <= 65536 and 1 <= bs <= 256 and rate > 0
    if sc.engine.scheduler in ("vllm", "priority"):  # and within the token budget, as vLLM requires
        ok = ok and seqs <= sc.engine.max_num_batched_tokens
    try:
        new = sc.override({"engine.max_num_seqs": seqs, "engine.block_size": bs, "workload.arrival.rate": rate})
    except ScenarioError as exc:
        assert not ok, exc
        assert "\n" not in str(exc)
        return
    assert ok
    assert (new.engine.max_num_seqs, new.engine.block_size, new.workload.arrival.rate) == (seqs, bs, rate)
