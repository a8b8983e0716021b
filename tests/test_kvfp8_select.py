"""An FP8 KV cache priced by rule on the pack the run would use with the model's own KV dtype
(servesim/perf/kvfp8.py, chosen in servesim/perf/select.py, built in servesim/perf/build.py)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import servesim
from servesim.models import with_precision
from servesim.perf.build import build_step_model
from servesim.perf.kvfp8 import decode_ratio, survey_gpu, with_fp8_kv
from servesim.perf.pack import load_pack
from servesim.perf.select import choose, provenance
from servesim.perf.transfer import transfer_pack

H200_RULE = "with an FP8 KV cache by rule (decode attention x H200 survey fp8/bf16"
#: the H100 has its own decode_kv survey since device call 26 (calibration/COMMANDS.md)
H100_RULE = "with an FP8 KV cache by rule (decode attention x H100-80G survey fp8/bf16)"


def _sc(gpu: str, model: str, kv: str = "fp8", tp: int = 1):
    return servesim.load_scenario("scenarios/quickstart.yaml", [
        f"hardware.gpu={gpu}", f"model={model}", f"engine.kv_cache_dtype={kv}", "engine.max_model_len=8192",
        f"hardware.gpus_per_replica={tp}", "stop={requests: 30, warmup_requests: 0}"])


def _assert_rule_applied(model, base_pack, gpu):
    """Every op of the base pack as it was, decode attention x the ratio of ``gpu``'s survey (the
    H200's where ``gpu`` has none) at its (batch, context)."""
    run = model.pack
    for op, rows in base_pack.ops.items():
        if op == "attn_decode":
            want = rows.time_ms * decode_ratio(survey_gpu(gpu))(rows.batch, rows.context)
            np.testing.assert_allclose(run.rows(op).time_ms, want, rtol=1e-12)
            assert not np.allclose(run.rows(op).time_ms, rows.time_ms)  # the rule changed something
        else:
            np.testing.assert_array_equal(run.rows(op).time_ms, rows.time_ms)
    assert run.kv_cache_dtype == "fp8" and run.gpu == gpu


def test_measured_pack_with_an_fp8_kv_cache_runs_the_pack_by_rule_not_the_roofline():
    sc = _sc("h100-80g", "{name: llama-3.1-8b, quantization: fp8_static}")
    c = choose(sc)
    assert (c.model, c.calibrated) == ("pack", True)
    assert c.label == "pack h100-80g/llama-3.1-8b-fp8_static " + H100_RULE
    prov = provenance(sc)  # summary.json, capacity JSON and sweep rows read this record
    assert prov["label"] == c.label and prov["kv_rule"].startswith("decode attention x H100-80G survey")
    assert prov["pack_id"].startswith("h100-80g/llama-3.1-8b-fp8_static sha256:")
    m = build_step_model(sc)
    assert "with an FP8 KV cache by rule" in m.describe()
    base = load_pack("h100-80g", with_precision(sc.model_shape, kv_cache_dtype="auto"), 1)
    _assert_rule_applied(m, base, "h100-80g")
    # half the KV bytes in the memory plan (1 byte per value)
    bf16 = _sc("h100-80g", "{name: llama-3.1-8b, quantization: fp8_static}", kv="auto")
    assert sc.model_shape.kv_bytes_per_token() * 2 == bf16.model_shape.kv_bytes_per_token()


def test_on_the_h200_the_label_makes_no_transfer_assumption_and_a_derived_base_keeps_its_origin():
    c = choose(_sc("h200", "llama-3.1-8b"))
    assert c.label == "pack h200/llama-3.1-8b " + H200_RULE + ")"
    # a derived base: the 70B FP8 pack over TP 2 (h200/llama-3.1-8b-fp8, derived until the eighth
    # session, is measured since device call 33)
    c = choose(_sc("h200", "{name: llama-3.1-70b, quantization: fp8}", tp=2))
    assert c.label.startswith("pack h200/llama-3.1-70b-fp8-tp2 (derived from h200/llama-3-8b")
    assert c.label.endswith(H200_RULE + ")") and c.calibrated
    c = choose(_sc("h200", "{name: llama-3.1-8b, quantization: fp8}"))  # the shipped measured FP8 pack
    assert c.label == "pack h200/llama-3.1-8b-fp8 " + H200_RULE + ")" and c.calibrated


def test_a_transferred_base_is_transferred_first_then_priced_by_rule():
    sc = _sc("h100-80g", "{name: llama-3.1-70b, quantization: fp8}", tp=2)
    c = choose(sc)
    assert (c.model, c.calibrated, c.pack) == ("pack", False, "h200/llama-3.1-70b-fp8-tp2")
    assert c.label.startswith("pack transferred from h200/llama-3.1-70b-fp8-tp2 (derived from")
    assert c.label.endswith(H100_RULE)
    base_shape = with_precision(sc.model_shape, kv_cache_dtype="auto")
    base = transfer_pack(load_pack("h200", base_shape, 2), "h100-80g", base_shape)
    _assert_rule_applied(build_step_model(sc), base, "h100-80g")


def test_a_gpu_without_a_survey_takes_the_h200_ratio_and_says_it_is_assumed():
    sc = _sc("a100-80g", "llama-3-8b")
    c = choose(sc)
    assert survey_gpu("a100-80g") == "h200" and survey_gpu("h100-80g") == "h100-80g"
    assert c.label == "pack a100-80g/llama-3-8b " + H200_RULE + ", assumed to hold on a100-80g)"
    _assert_rule_applied(build_step_model(sc), load_pack("a100-80g", "llama-3-8b", 1), "a100-80g")
    # the choice matters: the two GPUs' ratios differ (H100 median 0.58, H200 0.76 at batch >= 32)
    b, ctx = np.array([64, 256]), np.array([8192, 16384])
    assert np.all(decode_ratio("h200")(b, ctx) > 1.2 * decode_ratio("h100-80g")(b, ctx))


@pytest.mark.parametrize("gpu, model, why", [
    ("h200", "deepseek-v2-lite", "no FP8 KV rule: a latent-attention (MLA) model"),
    ("h100-80g", "llama-3.1-70b", "no FP8 KV rule: no pack of the model's own KV dtype either"),
])
def test_refusals_stay_on_the_roofline_with_a_one_line_reason(gpu, model, why):
    c = choose(_sc(gpu, model))
    assert c.model == "roofline" and not c.calibrated
    assert why in c.reason and "\n" not in c.label
    assert c.label.startswith("roofline (uncalibrated): no calibration pack for") and "-kvfp8" in c.label


def test_a_kvfp8_pack_file_wins_and_equals_the_rule_on_its_base(tmp_path, monkeypatch):
    """The derive tool's kvfp8 pack (written into a temp pack root) is chosen over the rule, and its
    rows are the rule's on the measured bf16-KV pack: one function prices both."""
    import servesim.perf.pack as packmod
    from servesim.perf.pack import read_pack
    from servesim.tools.derive_variants import write_derived

    base = load_pack("h200", "llama-3-8b", 1)
    shutil.copytree(packmod.pack_root() / "h200", tmp_path / "h200", ignore=shutil.ignore_patterns("logs"))
    [path] = write_derived("h200", tmp_path, ["llama-3-8b"], [1], kv_cache_dtype="fp8")
    derived = read_pack(path)
    rule = with_fp8_kv(base, "fp8")
    assert set(derived.ops) == set(rule.ops)
    for op in derived.ops:  # equal up to the CSV's printed digits
        np.testing.assert_allclose(derived.rows(op).time_ms, rule.rows(op).time_ms, rtol=1e-6)
    monkeypatch.setattr(packmod, "pack_root", lambda: tmp_path)
    c = choose(_sc("h200", "llama-3-8b"))
    assert c.label.startswith("pack h200/llama-3-8b-kvfp8 (derived from h200/llama-3-8b") and c.kv_rule is None


def test_an_explicit_pack_step_model_takes_the_rule_on_the_gpus_own_pack_only():
    from servesim.errors import PackError

    sc = _sc("h100-80g", "llama-3.1-8b").override({"step_time": {"model": "pack"}})
    c = choose(sc)
    assert (c.asked, c.calibrated) == ("pack", True)
    assert c.label == "pack h100-80g/llama-3.1-8b " + H100_RULE
    _assert_rule_applied(build_step_model(sc), load_pack("h100-80g", "llama-3.1-8b", 1), "h100-80g")
    # no own pack: an explicit pack is not a transfer, refused in one line
    nvl = _sc("h100-nvl", "llama-3.1-8b").override({"step_time": {"model": "pack"}})
    with pytest.raises(PackError) as info:
        build_step_model(nvl)
    assert "h100-nvl/llama-3.1-8b-kvfp8" in str(info.value) and "\n" not in str(info.value)


def test_the_survey_ratio_is_the_survey_at_its_points_bilinear_between_and_held_at_the_edges():
    """GridRatio: at a surveyed (batch, context) the survey's own fp8/bf16 ratio; between two
    surveyed batches at a surveyed context, linear in log batch; outside the grid, the edge's."""
    import pandas as pd

    from servesim.perf.kvfp8 import BF16, FP8, GridRatio, survey_root

    frame = pd.read_csv(survey_root() / "h200" / "decode_kv.csv")
    p = frame.pivot_table(index=["batch", "context"], columns="variant", values="time_ms")
    ratio = (p[FP8] / p[BF16]).dropna()
    g = GridRatio(frame, FP8, BF16)
    b, c = (np.array(v) for v in zip(*ratio.index))
    np.testing.assert_allclose(g(b, c), ratio.to_numpy(), rtol=1e-12)
    batches = np.unique(b)
    ctx = next(x for x in np.unique(c) if {(batches[0], x), (batches[1], x)} <= set(ratio.index))
    mid = np.sqrt(batches[0] * batches[1])  # halfway in log batch
    want = (ratio[(batches[0], ctx)] + ratio[(batches[1], ctx)]) / 2
    np.testing.assert_allclose(g([mid], [ctx]), [want], rtol=1e-9)
    np.testing.assert_allclose(g([batches[0] / 4, batches[-1] * 8], [ctx, c[b == batches[-1]].min()]),
                               [ratio[(batches[0], ctx)], ratio[(batches[-1], c[b == batches[-1]].min())]], rtol=1e-12)
