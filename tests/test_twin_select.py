"""Same-shape packs (issue 28): a model with no pack of its own name runs a pack of this GPU
measured for the same layer shapes and precision (servesim/perf/select.py ``_twin``)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

import servesim
from servesim.models import MODELS, with_precision
from servesim.perf import pack as packmod
from servesim.perf.pack import same_shape_packs
from servesim.perf.select import choose, provenance

REPO = Path(__file__).resolve().parents[1]
QUICK = str(REPO / "scenarios/quickstart.yaml")
LLAMA31 = json.loads((REPO / "servesim/models/library/llama-3.1-8b.json").read_text())["config"]


def _sc(*sets):
    return servesim.load_scenario(QUICK, ["stop={requests: 60, warmup_requests: 0}", "engine.max_model_len=8192",
                                          *sets])


def _finetune(tmp_path, **changes) -> Path:
    """A config.json of a Llama-3.1-8B fine-tune (its base's numbers, ``changes`` applied)."""
    d = tmp_path / "my-llama-finetune"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({**LLAMA31, "architectures": ["LlamaForCausalLM"],
                                               "torch_dtype": "bfloat16", **changes}))
    return d / "config.json"


def test_llama_3_1_on_the_a100_runs_the_llama_3_pack_and_says_so():
    c = choose(_sc("model={name: llama-3.1-8b}"))
    assert (c.model, c.calibrated, c.twin_of) == ("pack", True, "llama-3.1-8b")
    assert c.label == "pack a100-80g/llama-3-8b (imported; same layer shapes as llama-3.1-8b)"
    assert c.pack_id.startswith("a100-80g/llama-3-8b sha256:")
    assert c.pack_id == choose(_sc()).pack_id  # the file actually read
    d = c.to_dict()
    assert d["same_layer_shapes_as"] == "llama-3.1-8b" and d["label"] == c.label
    # the model's own pack wins where it exists (the H100 measured llama-3.1-8b)
    own = choose(_sc("model={name: llama-3.1-8b}", "hardware.gpu=h100-80g"))
    assert own.label == "pack h100-80g/llama-3.1-8b" and own.twin_of is None


def test_a_twin_holds_the_ops_of_the_parallelism():
    c = choose(_sc("model={name: llama-3.1-8b}", "hardware.tp=2", "hardware.gpus_per_replica=2"))
    assert c.pack == "a100-80g/llama-3-8b-tp2" and c.calibrated and c.twin_of == "llama-3.1-8b"


def test_a_config_json_finetune_finds_its_base_models_pack(tmp_path):
    cfg = _finetune(tmp_path)
    a100 = choose(_sc(f"model={{config: {cfg}}}"))
    assert a100.label == "pack a100-80g/llama-3-8b (imported; same layer shapes as my-llama-finetune)"
    # the H100 measured both llama-3-8b and llama-3.1-8b: both measured, the one whose decode
    # attention reaches the longer context wins (llama-3.1-8b's 131,071 tokens against 8,191)
    h100 = choose(_sc(f"model={{config: {cfg}}}", "hardware.gpu=h100-80g"))
    assert h100.label == "pack h100-80g/llama-3.1-8b (measured; same layer shapes as my-llama-finetune)"
    # a GPU of the class with no pack: the twin of the class transferred (the H100 SXM is nearest)
    pcie = choose(_sc(f"model={{config: {cfg}}}", "hardware.gpu=h100-pcie"))
    assert (pcie.model, pcie.calibrated, pcie.pack) == ("pack", False, "h100-80g/llama-3.1-8b")
    assert pcie.label.startswith("pack transferred from h100-80g/llama-3.1-8b (same layer shapes as "
                                 "my-llama-finetune) by op-wise efficiency (no pack for h100-pcie; ")
    # an FP8 KV cache: the twin of the model's own KV dtype, by the FP8 KV rule
    kv = choose(_sc(f"model={{config: {cfg}}}", "engine.kv_cache_dtype=fp8"))
    assert kv.label.startswith("pack a100-80g/llama-3-8b (imported; same layer shapes as my-llama-finetune) "
                               "with an FP8 KV cache by rule (")


def test_a_shape_that_matches_nothing_still_says_roofline_and_why(tmp_path):
    c = choose(_sc(f"model={{config: {_finetune(tmp_path, intermediate_size=14000)}}}"))
    assert c.model == "roofline" and not c.calibrated and c.twin_of is None
    assert c.label.startswith("roofline (uncalibrated): no calibration pack for a100-80g/my-llama-finetune tp 1: "
                              "packs are named for library models, and none of a100-80g's has this model's "
                              "layer shapes and precision (packs for a100-80g: ")
    assert "\n" not in c.label


def test_precision_must_match_too(tmp_path):
    shape = MODELS["llama-3.1-8b"]
    assert [p.name for p in same_shape_packs("a100-80g", shape)] == ["llama-3-8b"]
    assert same_shape_packs("a100-80g", with_precision(shape, "fp8")) == []  # no fp8 weights measured there
    assert same_shape_packs("a100-80g", replace(shape, dtype_bytes=4)) == []  # fp32 weights: dtype differs
    c = choose(_sc("model={name: llama-3.1-8b, quantization: fp8}"))
    assert c.model == "roofline" and "weights fp8" in c.reason
    # on the H200, fp8 weights have two measured packs (llama-3.1-8b-fp8 since device call 33; derived
    # before): the one measured to longer contexts first, never a bf16 one
    ft = replace(with_precision(shape, "fp8"), name="my-ft")
    assert [p.name for p in same_shape_packs("h200", ft)] == ["llama-3.1-8b-fp8", "llama-3-8b-fp8"]
    # fp8_static weights: each GPU's packs of that scheme (the H200's since device call 28), never
    # the fp8 (dynamic) ones
    st = replace(with_precision(shape, "fp8_static"), name="my-ft")
    assert [p.name for p in same_shape_packs("h100-80g", st)] == ["llama-3-8b-fp8_static", "llama-3.1-8b-fp8_static"]
    # on the H200 the llama-3.1-8b one first: its attention rows (the H200 bf16 llama-3.1-8b pack's)
    # reach 128K contexts, the llama-3-8b one's 8K (the longest-reach rule)
    assert [p.name for p in same_shape_packs("h200", st)] == ["llama-3.1-8b-fp8_static", "llama-3-8b-fp8_static"]
    assert same_shape_packs("a100-80g", st) == []


def test_expert_keys_must_match():
    moe = replace(MODELS["qwen3-30b-a3b"], name="my-moe")
    assert [p.name for p in same_shape_packs("h200", moe)] == ["qwen3-30b-a3b"]
    assert same_shape_packs("h200", replace(moe, num_experts_per_tok=4)) == []
    assert same_shape_packs("h200", replace(moe, moe_intermediate_size=1024)) == []
    assert same_shape_packs("h200", replace(moe, num_experts=0)) == []  # dense with the same layer keys


def _mla_root(tmp_path, drop: str | None = None) -> Path:
    """A pack root whose a100-80g/llama-3-8b records a latent-attention shape (``drop``: a key left out)."""
    root = tmp_path / "packs"
    (root / "a100-80g").mkdir(parents=True)
    src = REPO / "calibration/packs/a100-80g"
    shutil.copy(src / "llama-3-8b.csv", root / "a100-80g")
    meta = yaml.safe_load((src / "llama-3-8b.yaml").read_text())
    mla = {"q_lora_rank": 0, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}
    meta["shape"] = {**meta["shape"], **{k: v for k, v in mla.items() if k != drop}}
    (root / "a100-80g" / "llama-3-8b.yaml").write_text(yaml.safe_dump(meta))
    return root


def test_latent_keys_must_match_and_be_recorded(tmp_path, monkeypatch):
    mla = replace(MODELS["llama-3-8b"], name="my-mla", q_lora_rank=0, kv_lora_rank=512, qk_nope_head_dim=128,
                  qk_rope_head_dim=64, v_head_dim=128)
    root = _mla_root(tmp_path)
    monkeypatch.setattr(packmod, "pack_root", lambda: root)
    assert [p.name for p in same_shape_packs("a100-80g", mla)] == ["llama-3-8b"]
    assert same_shape_packs("a100-80g", replace(mla, kv_lora_rank=256)) == []
    assert same_shape_packs("a100-80g", replace(mla, qk_rope_head_dim=32)) == []
    assert same_shape_packs("a100-80g", MODELS["llama-3.1-8b"]) == []  # GQA model, latent pack
    root2 = _mla_root(tmp_path / "b", drop="v_head_dim")  # a latent key not recorded: not compared, so no twin
    monkeypatch.setattr(packmod, "pack_root", lambda: root2)
    assert same_shape_packs("a100-80g", mla) == []


def test_the_own_pack_file_stands_even_where_it_does_not_fit(tmp_path, monkeypatch):
    """A pack of the model's own name that does not fit is reported, not hidden by a twin."""
    root = tmp_path / "packs"
    shutil.copytree(packmod.pack_root() / "a100-80g", root / "a100-80g")
    meta = yaml.safe_load((root / "a100-80g/llama-3-8b.yaml").read_text())
    meta["model"] = "llama-3.1-8b"
    meta["shape"]["vocab_size"] = 1000  # measured for another shape
    (root / "a100-80g/llama-3.1-8b.yaml").write_text(yaml.safe_dump(meta))
    shutil.copy(root / "a100-80g/llama-3-8b.csv", root / "a100-80g/llama-3.1-8b.csv")
    monkeypatch.setattr(packmod, "pack_root", lambda: root)
    c = choose(_sc("model={name: llama-3.1-8b}"))
    assert c.model == "roofline" and c.reason.startswith("pack a100-80g/llama-3.1-8b does not fit: ")


def test_explicit_step_time_models_name_the_twin():
    c = choose(_sc("model={name: llama-3.1-8b}", "step_time={model: pack}"))
    assert c.label == "pack a100-80g/llama-3-8b (imported; same layer shapes as llama-3.1-8b)"
    r = choose(_sc("model={name: llama-3.1-8b}", "step_time={model: roofline}"))
    assert r.reason.endswith("(a pack of the same layer shapes exists: a100-80g/llama-3-8b; remove step_time to use it)")


def test_the_h100_tp2_finds_a_twin_of_its_class_to_transfer():
    c = choose(_sc("model={name: llama-3.1-8b}", "hardware.gpu=h100-80g", "hardware.tp=2",
                   "hardware.gpus_per_replica=2"))
    assert (c.model, c.calibrated, c.pack) == ("pack", False, "h200/llama-3-8b-tp2")
    assert "(same layer shapes as llama-3.1-8b)" in c.label


def _run(*sets):
    from servesim.simulate import build, run_built

    b = build(_sc(*sets))
    return b, run_built(b)


def test_a_twin_runs_the_step_times_of_the_twin_packs_own_run(tmp_path):
    b3, r3 = _run()  # llama-3-8b, its own pack
    b31, r31 = _run("model={name: llama-3.1-8b}")
    bft, rft = _run(f"model={{config: {_finetune(tmp_path)}}}")
    new = np.array([1, 1, 1, 512, 7, 1], np.int64)
    ctx = np.array([100, 900, 4000, 0, 300, 2000], np.int64)
    for b in (b31, bft):
        assert b.model.name == "pack" and b.model.pack.csv_path == b3.model.pack.csv_path
        assert b.model.predict(new, ctx) == b3.model.predict(new, ctx)
    for r in (r31, rft):
        for key in ("ttft_s", "tpot_s", "e2e_s"):
            assert np.array_equal(getattr(r.requests, key), getattr(r3.requests, key), equal_nan=True), key
    assert r31.summary["step_model"]["label"] == "pack a100-80g/llama-3-8b (imported; same layer shapes as llama-3.1-8b)"
    assert r31.summary["step_model"]["pack_id"] == r3.summary["step_model"]["pack_id"]


def test_long_contexts_of_a_3_1_model_show_in_the_extrapolation_share():
    """The twin's context grid stays what was measured: a 3.1 model's 16K prompts lie beyond it."""
    from servesim.simulate import build, run_built

    sc = servesim.load_scenario(QUICK, ["stop={requests: 20, warmup_requests: 0}", "model={name: llama-3.1-8b}",
                                        "engine.max_model_len=32768", "engine.max_num_batched_tokens=32768",
                                        "workload.prompt={dist: fixed, value: 16000}",
                                        "workload.output={dist: fixed, value: 16}"])
    s = run_built(build(sc)).summary
    assert s["step_model"]["same_layer_shapes_as"] == "llama-3.1-8b"
    ex = s["extrapolation"]
    assert ex["measured_grid"] and ex["iterations_outside"] > 0
    assert ex["by_op"]["decode_kv_per_seq"]["iterations"] > 0


def test_sweep_keys_read_the_twins_file():
    from servesim.sweep.spec import _pack_files

    files = _pack_files(_sc("model={name: llama-3.1-8b}"))
    assert [f.name for f in files] == ["llama-3-8b.csv", "llama-3-8b.yaml"] and all(f.is_file() for f in files)


def test_provenance_carries_the_twin():
    p = provenance(_sc("model={name: llama-3.1-8b}"))
    assert p["same_layer_shapes_as"] == "llama-3.1-8b" and p["pack"] == "a100-80g/llama-3-8b"


@pytest.mark.parametrize("more", [["step_time={model: pack}"], ["engine.kv_cache_dtype=fp8"],
                                  ["engine.kv_cache_dtype=fp8", "step_time={model: pack}"],
                                  ["hardware.gpu=a100-40g"]],
                         ids=["explicit-pack", "fp8-kv-rule", "explicit-pack-fp8-kv-rule", "transferred"])
def test_every_route_to_a_twin_builds_the_twin_packs_model(more):
    """The step model of llama-3.1-8b by a twin equals llama-3-8b's by the same route."""
    from servesim.perf.build import build_step_model

    new = np.array([1, 1, 300, 1], np.int64)
    ctx = np.array([2000, 50, 0, 7000], np.int64)
    twin = build_step_model(_sc("model={name: llama-3.1-8b}", *more))
    own = build_step_model(_sc(*more))
    assert twin.name == own.name == "pack"
    assert twin.predict(new, ctx) == own.predict(new, ctx)
    c = choose(_sc("model={name: llama-3.1-8b}", *more))
    assert c.twin_of == "llama-3.1-8b" and c.pack.endswith("/llama-3-8b")


def test_of_two_measured_twins_the_one_measured_to_longer_contexts_wins(tmp_path, monkeypatch):
    """Both H100 packs are measured on llama-3.1-8b's layer shapes; llama-3.1-8b's decode attention
    reaches 131,071 tokens, llama-3-8b's 8,191: a fine-tune's long contexts are read, not
    extrapolated. Source rank still comes first: a derived llama-3.1-8b pack ranks after the measured
    llama-3-8b whatever its reach (a pack root where the long-reach copy says ``source: derived``;
    the H200's llama-3.1-8b-fp8, the shipped example of this until device call 33, is measured now)."""
    ft = replace(MODELS["llama-3.1-8b"], name="my-ft")
    assert [p.name for p in same_shape_packs("h100-80g", ft)] == ["llama-3.1-8b", "llama-3-8b"]
    assert [p.name for p in same_shape_packs("h200", ft)] == ["llama-3.1-8b", "llama-3-8b"]
    assert [p.name for p in same_shape_packs("h200", with_precision(ft, "fp8"))] == ["llama-3.1-8b-fp8", "llama-3-8b-fp8"]
    root = tmp_path / "packs"
    (root / "h100-80g").mkdir(parents=True)
    src = REPO / "calibration/packs/h100-80g"
    for name in ("llama-3-8b", "llama-3.1-8b"):
        shutil.copy(src / f"{name}.csv", root / "h100-80g")
        meta = yaml.safe_load((src / f"{name}.yaml").read_text())
        if name == "llama-3.1-8b":
            meta["source"] = "derived"
        (root / "h100-80g" / f"{name}.yaml").write_text(yaml.safe_dump(meta))
    monkeypatch.setattr(packmod, "pack_root", lambda: root)
    assert [p.name for p in same_shape_packs("h100-80g", ft)] == ["llama-3-8b", "llama-3.1-8b"]

