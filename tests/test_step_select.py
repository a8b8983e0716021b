"""Calibrated by default (issue 28): the pack where one fits, else the roofline, said everywhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from rich.console import Console

import servesim
from servesim.perf.select import _twin, choose, pack_problem, provenance
from servesim.scenario import AutoStepConfig

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = sorted(p for p in (REPO / "scenarios").rglob("*.yaml"))


def _scenario_files() -> list[Path]:
    """Every shipped scenario, and the base of every shipped sweep spec."""
    out = []
    for p in SCENARIOS:
        data = yaml.safe_load(p.read_text())
        if isinstance(data, dict) and "base" in data and ("metrics" in data or "choices" in data):  # sweep or plan
            base = data["base"]
            if isinstance(base, str):
                out.append((p.parent / base).resolve())
            continue
        out.append(p)
    return sorted(set(out))


def _small(path, *more):
    return servesim.load_scenario(str(path), ["stop={requests: 30, warmup_requests: 0}", *more])


@pytest.mark.parametrize("path", _scenario_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_shipped_scenario_runs_a_pack_where_one_exists(path):
    sc = servesim.load_scenario(str(path))
    for g in sc.replica_groups:
        gs = g.scenario
        c = choose(gs)
        if c.asked == "constant":  # theory scenarios (M/D/1) state a constant on purpose
            continue
        fits = (pack_problem(gs.hardware.gpu, gs.model_shape, gs.tp, gs.pp, cuda_graph=False) is None
                or _twin(gs.hardware.gpu, gs.model_shape, gs.tp, gs.pp, cuda_graph=False) is not None)
        assert fits == (c.model == "pack"), f"{path.name} group {g.name}: {c.label}"
        assert c.calibrated == fits


def test_a_scenario_without_step_time_asks_for_auto():
    sc = servesim.scenario_from_dict({"name": "x"})
    assert isinstance(sc.step_time, AutoStepConfig)


def test_quickstart_header_and_summary_name_the_pack(tmp_path):
    sc = servesim.load_scenario(str(REPO / "scenarios/quickstart.yaml"), ["stop={requests: 40, warmup_requests: 0}"])
    from servesim.report.console import print_header
    from servesim.simulate import build, run_built

    b = build(sc)
    console = Console(record=True, width=400)
    print_header(console, b)
    text = console.export_text()
    assert "step time: pack a100-80g/llama-3-8b (" in text
    s = run_built(b).summary
    assert s["step_model"]["model"] == "pack" and s["step_model"]["calibrated"] is True
    assert s["step_model"]["pack_id"].startswith("a100-80g/llama-3-8b sha256:")
    assert s["step_model"]["label"] == "pack a100-80g/llama-3-8b"


def test_no_pack_falls_back_to_the_roofline_and_says_why():
    # l40s: no pack of its own and none of its class (ada) to transfer from (an H100 gets the H200's)
    sc = _small(REPO / "scenarios/quickstart.yaml", "hardware.gpu=l40s")
    from servesim.report.console import print_header
    from servesim.simulate import build, run_built

    b = build(sc)
    assert b.model.name == "roofline"
    console = Console(record=True, width=400)
    print_header(console, b)
    text = console.export_text()
    assert "step time: roofline (uncalibrated): no calibration pack for l40s/llama-3-8b tp 1" in text
    s = run_built(b).summary["step_model"]
    assert s["model"] == "roofline" and s["calibrated"] is False and s["pack_id"] is None
    assert "no calibration pack for l40s/llama-3-8b" in s["reason"]
    assert s["label"].startswith("roofline (uncalibrated): ")


def test_pack_of_another_tp_is_not_used():
    sc = _small(REPO / "scenarios/quickstart.yaml", "hardware.gpu=h200", "hardware.gpus_per_replica=4")
    c = choose(sc)
    assert c.model == "roofline" and "no calibration pack for h200/llama-3-8b tp 4" in c.reason
    assert "h200/llama-3-8b-tp2" in c.reason  # what exists for the GPU


def test_explicit_roofline_is_uncalibrated_and_names_the_pack_it_ignores():
    sc = _small(REPO / "scenarios/quickstart.yaml", "step_time={model: roofline}")
    c = choose(sc)
    assert c.model == "roofline" and not c.calibrated
    assert "a pack exists: a100-80g/llama-3-8b" in c.reason


def test_a_pack_measured_for_another_shape_is_refused_with_the_reason():
    shape = {"name": "tiny", "num_layers": 2, "hidden_size": 256, "num_heads": 4, "num_kv_heads": 4,
             "head_dim": 64, "intermediate_size": 512, "vocab_size": 1000}
    sc = servesim.scenario_from_dict({"name": "x", "model": shape})
    c = choose(sc)
    assert c.model == "roofline" and "tiny" in c.reason


def test_auto_with_a_pack_predicts_as_the_pack_model():
    """``auto`` where a pack fits is the same model as ``{model: pack}``: identical results."""
    a = servesim.simulate(_small(REPO / "scenarios/quickstart.yaml"))
    b = servesim.simulate(_small(REPO / "scenarios/quickstart.yaml", "step_time={model: pack}"))
    assert a.summary["latency_s"] == b.summary["latency_s"]
    assert a.summary["step_model"]["pack_id"] == b.summary["step_model"]["pack_id"]


def test_fleet_groups_each_record_their_model():
    sc = _small(REPO / "scenarios/quickstart.yaml",
                "cluster.groups=[{name: a, replicas: 1}, {name: b, replicas: 1, gpu: l40s}]")
    p = provenance(sc)
    assert p["model"] == "mixed" and p["calibrated"] is False
    assert p["groups"]["a"]["model"] == "pack" and p["groups"]["b"]["model"] == "roofline"


def test_sweep_rows_and_capacity_json_record_the_step_model():
    from servesim.sweep.capacity import SLO, Search
    from servesim.sweep.runner import make_row

    sc = _small(REPO / "scenarios/quickstart.yaml")
    summary = servesim.simulate(sc).summary

    class P:  # a sweep point and task, as the runner passes them
        index, key, values = 0, "k", {}

    class T:
        key, seed, replication = "k", 1, 0

    row = make_row(P, T, summary, ["ttft_p99"])
    assert row["step_model"] == "pack a100-80g/llama-3-8b" and row["pack_id"].startswith("a100-80g/llama-3-8b ")
    s = Search("max-rate", [SLO("ttft_p99", 0.5)], step_model=provenance(sc))
    d = json.loads(json.dumps(s.to_dict()))
    assert d["step_model"]["pack"] == "a100-80g/llama-3-8b" and d["step_model"]["calibrated"] is True
