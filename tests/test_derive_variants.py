"""Derived packs for precisions, experts and latent attention (servesim/tools/derive_variants.py):
each rule against the measurements it was not fitted on (numbers: calibration/VALIDATION.md,
"Derived packs for precisions, experts and latent attention")."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from servesim.errors import PackError
from servesim.hardware import GPUS
from servesim.models import MODELS, with_precision
from servesim.perf.pack import load_pack
from servesim.tools.derive_checks import fp8_from_bf16, grid_leave_one_out, moe_leave_one_out
from servesim.tools.derive_variants import (GemmRatio, MoeRule, MoeShape, derive_any, gemm_ratio,
                                            mla_decode_rows, read_survey)


def test_fp8_derived_from_bf16_predicts_the_measured_fp8_pack_and_its_forwards():
    """h200/llama-3-8b-fp8 from the bf16 pack + the GEMM survey only; scored against the measured
    FP8 pack's GEMMs and the FP8 validation forwards (neither read by the rule)."""
    ops, its = fp8_from_bf16()
    g = ops.set_index("op")
    for op in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):  # o_proj's 4096 x 4096: not surveyed
        assert g.loc[op, "median"] < 0.10, g
    graph = its[(its["mode"] == "graph")].set_index("pack")
    assert graph.loc["derived (bf16 pack + GEMM survey)", "median"] < 0.05, its
    assert graph.loc["derived (bf16 pack + GEMM survey)", "max"] < 0.30, its


def test_fp8_rule_leave_one_surveyed_shape_out():
    from servesim.tools.derive_checks import gemm_leave_one_shape_out

    df = gemm_leave_one_shape_out(variants=("fp8",))
    assert len(df) == 3 and (df["median"] < 0.10).all() and (df["max"] < 0.40).all(), df


def test_moe_rule_leave_one_configuration_out():
    """Five surveyed layer configurations (Qwen3-30B-A3B, DeepSeek-V2-Lite, Mixtral-8x7B,
    gpt-oss-120b, DeepSeek-V3), each on the fused kernel's rows derive reads."""
    df = moe_leave_one_out()
    layer = df[df.op == "layer (sum)"].set_index("held-out config")
    assert len(layer) == 5 and (layer["median"] < 0.20).all() and (layer["max"] < 0.5).all(), layer


def test_decode_survey_interpolation_leave_one_context_out():
    df = grid_leave_one_out()
    assert (df["median"] < 0.02).all() and (df["max"] < 0.12).all(), df


def test_gemm_ratio_is_the_survey_at_a_surveyed_shape_and_int4_never_loses_to_bf16():
    g = read_survey("h200", "gemm")
    p = g[(g.n == 28672) & (g.k == 4096)].pivot_table(index="tokens", columns="variant", values="time_ms")
    r = GemmRatio(g, "fp8")(4096, 28672, p.index.to_numpy())
    assert np.allclose(r, (p["fp8"] / p["bf16"]).to_numpy())
    int4 = gemm_ratio("h200", "awq")(4096, 14336, np.array([1.0, 16.0, 4096.0]))
    assert int4[0] < 0.7 and np.all(int4 <= 1.0) and int4[-1] == 1.0
    with pytest.raises(PackError, match="int8"):
        gemm_ratio("h200", "int8")


def test_moe_experts_time_follows_hit_experts_and_imbalance():
    from servesim.tools.derive_moe import moe_survey

    s, backend, _ = moe_survey("h200")  # the rows derive reads: one backend (triton-fused)
    assert backend == "triton-fused" and "backend" not in s.columns
    rule = MoeRule(s, "h200")
    cfg = MoeShape(128, 8, 768, 2048)
    t = rule.experts_ms(cfg, np.array([1.0, 16.0, 256.0, 16384.0]))
    assert np.all(np.diff(t) > 0)
    # at the surveyed configuration the rule returns the survey (its own efficiency, weight 1)
    want = s[(s.variant == "experts") & (s.experts == 128) & (s.top_k == 8)].set_index("tokens").time_ms
    assert np.allclose(rule.experts_ms(cfg, want.index.to_numpy(np.float64)), want.to_numpy())
    # imbalance scales only the compute-bound part: none at one token, up to x1.5 at 16K
    skew = rule.experts_ms(cfg, np.array([1.0, 16384.0]), imbalance=1.5) / t[[0, -1]]
    assert skew[0] == pytest.approx(1.0) and 1.2 < skew[1] <= 1.5 + 1e-9


def test_mla_decode_rows_are_the_survey_at_its_heads_and_latent():
    m = read_survey("h200", "mla")
    ds = MODELS["deepseek-v3"]
    rows = mla_decode_rows(m, ds, 8, "triton-bf16", np.array([4096, 16384]))  # 16 heads per rank
    want = m[(m.n == 16) & (m.variant == "triton-bf16") & m.context.isin([4096, 16384])]
    got = rows.set_index(["batch", "context"]).time_ms
    for r in want.itertuples():
        assert got[(r.batch, r.context)] == pytest.approx(r.time_ms)
    mid = mla_decode_rows(m, ds, 2, "triton-bf16", np.array([16384])).set_index("batch").time_ms  # 64 heads
    lo = rows[rows.context == 16384].set_index("batch").time_ms
    hi = mla_decode_rows(m, ds, 1, "triton-bf16", np.array([16384])).set_index("batch").time_ms
    assert ((mid > lo) & (mid < hi)).all()


def test_an_moe_mla_pack_derives_records_its_shape_and_transfers_to_the_h100():
    from servesim.perf.transfer import transfer_pack
    from servesim.tools.derive_variants import _shape_meta

    shape = MODELS["deepseek-v2-lite"]
    rows, meta = derive_any("h200", shape, 1, [load_pack("h200", "llama-3-8b", t) for t in (1, 2)])
    assert meta["shape"] == _shape_meta(shape) and meta["source"] == "derived"
    ops = {r[0] for r in rows}
    assert {"moe_gate", "moe_experts", "moe_combine"} <= ops and not ops & {"gate_up_proj", "down_proj", "act"}
    assert "1 dense first layers of 27" in meta["derived"]["moe_experts"]
    import tempfile
    from pathlib import Path

    from servesim.perf.pack import read_pack, write_pack

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "h200" / "deepseek-v2-lite.csv"
        write_pack(rows, meta, path)
        pack = read_pack(path)
        h100 = transfer_pack(pack, "h100-80g", shape)
    src, dst = GPUS["h200"], GPUS["h100-80g"]
    ratio = h100.rows("moe_experts").time_ms / pack.rows("moe_experts").time_ms
    # bandwidth-bound at few tokens (HBM ratio), compute-bound at many (same bf16 peak)
    assert ratio[0] == pytest.approx(src.hbm_bytes_per_s / dst.hbm_bytes_per_s, rel=1e-6)
    assert ratio[-1] == pytest.approx(1.0, rel=0.05)
    g = pack.rows("moe_gate").time_ms  # a small op: its floor stays, the time above it scales
    assert np.allclose(h100.rows("moe_gate").time_ms, g.min() + (g - g.min()) * src.hbm_bytes_per_s / dst.hbm_bytes_per_s)
    # latent decode at 16 heads: 2 (2 x 512 + 64) FLOPs per head and key over 1,152 bytes per key
    # and layer: bandwidth-bound on both GPUs, so the HBM ratio
    dec = h100.rows("attn_decode").time_ms / pack.rows("attn_decode").time_ms
    assert np.allclose(dec, src.hbm_bytes_per_s / dst.hbm_bytes_per_s)


def test_derive_refuses_a_bad_imbalance():
    with pytest.raises(PackError, match="imbalance"):
        derive_any("h200", MODELS["qwen3-30b-a3b"], 1, [load_pack("h200", "llama-3-8b")], imbalance=0.5)


def test_fp8_weights_of_an_expert_layer_use_the_gemm_ratio_at_tokens_per_expert():
    base = derive_any("h200", MODELS["qwen3-30b-a3b"], 1, [load_pack("h200", "llama-3-8b")])[0]
    fp8 = derive_any("h200", with_precision(MODELS["qwen3-30b-a3b"], "fp8"), 1, [load_pack("h200", "llama-3-8b")])[0]
    b = pd.DataFrame(base, columns=["op", "tokens", "b", "c", "n", "t", "s"])
    f = pd.DataFrame(fp8, columns=["op", "tokens", "b", "c", "n", "t", "s"])
    for op in ("moe_gate", "lm_head", "attn_decode"):  # untouched by the weight format
        assert np.allclose(b[b.op == op].t.to_numpy(), f[f.op == op].t.to_numpy())
    assert not np.allclose(b[b.op == "moe_experts"].t.to_numpy(), f[f.op == "moe_experts"].t.to_numpy())


def test_the_published_mla_row_replays_on_the_derived_pack_transferred_to_the_h100(monkeypatch):
    """benchmarks/derived_published.py: the DeepSeek-V2-Lite row runs on the pack derive leaves in
    the pack folder, transferred to the H100 and named so (its error is recorded in docs/models.md)."""
    import shutil
    import sys
    from pathlib import Path

    from servesim.perf import pack as packmod

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import derived_published as dp

    row = next(r for r in dp.ROWS if r["model"] == "deepseek-v2-lite")
    root = dp.derived_root([row["model"]])
    try:
        monkeypatch.setattr(packmod, "pack_root", lambda: root)
        got = dp.replay(row, {"model": "auto"})
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert got["step"].startswith("pack h100-80g/deepseek-v2-lite (transferred from h200/deepseek-v2-lite (derived)")
    assert "eager" in got["step"] and got["req_per_s"] > 0


def test_summary_step_model_names_a_derived_pack_and_a_transfer_of_one():
    """summary.json's step_model (and every output that prints its label) says 'derived from ...'
    for a shipped derived pack, also when it is transferred to another GPU of its class."""
    import servesim
    from servesim.perf.select import provenance

    own = provenance(servesim.scenario_from_dict({"model": "qwen3-4b", "hardware": {"gpu": "a100-80g"},
                                                  "engine": {"max_model_len": 8192}}, "t"))
    assert own["label"] == "pack a100-80g/qwen3-4b (derived from Vidur A100 profiles of 4 models)"
    assert own["derived"].startswith("derived from")
    moved = provenance(servesim.scenario_from_dict({"model": "qwen3-4b", "hardware": {"gpu": "a100-40g"},
                                                    "engine": {"max_model_len": 8192}}, "t"))
    assert moved["label"].startswith("pack transferred from a100-80g/qwen3-4b (derived from Vidur") and not moved["calibrated"]
    measured = provenance(servesim.scenario_from_dict({"model": "llama-3-8b", "hardware": {"gpu": "h200"},
                                                       "engine": {"max_model_len": 8192}}, "t"))
    assert measured["label"] == "pack h200/llama-3-8b" and "derived" not in measured


def test_expert_parallelism_is_not_priced_by_a_pack(tmp_path, monkeypatch):
    """A pack times TP-sharded experts: with engine.enable_expert_parallel over TP 2 the default
    falls back to the roofline (which prices EP's all-to-all) and says why; step_time pack refuses."""
    import shutil

    import servesim
    from servesim.perf import pack as packmod
    from servesim.perf.build import build_step_model
    from servesim.perf.select import choose
    from servesim.tools.derive_variants import write_derived

    shutil.copytree(packmod.pack_root() / "h200", tmp_path / "h200")
    write_derived("h200", tmp_path, ["qwen3-30b-a3b"], [2])
    monkeypatch.setattr(packmod, "pack_root", lambda: tmp_path)
    base = {"model": "qwen3-30b-a3b", "hardware": {"gpu": "h200"},
            "engine": {"tensor_parallel_size": 2, "max_model_len": 8192}}
    assert choose(servesim.scenario_from_dict(base, "t")).model == "pack"
    ep = servesim.scenario_from_dict({**base, "engine": {**base["engine"], "enable_expert_parallel": True}}, "t")
    c = choose(ep)
    assert c.model == "roofline" and c.reason.startswith("expert parallelism over 2 GPUs")
    with pytest.raises(PackError, match="expert parallelism"):
        build_step_model(ep.override({"step_time": {"model": "pack"}}))


@pytest.mark.parametrize("model_name,gpu,tp,pack", [
    # derived until the eighth session, measured since (device call 33)
    ("llama-3.1-8b", "h200", 1, "pack h200/llama-3.1-8b-fp8"),
    # the H100's own pack: derived (its GEMM survey, device call 26) in the seventh session, measured
    # (vLLM's dynamic recipe, device call 30) since the eighth; a derived H100 FP8 pack is still
    # built and run end to end by test_h100_derived_fp8_pack_runs_end_to_end below
    ("llama-3.1-8b", "h100-80g", 1, "pack h100-80g/llama-3.1-8b-fp8"),
    ("llama-3.1-70b", "h100-80g", 2, "pack transferred from h200/llama-3.1-70b-fp8-tp2 (derived from")])
def test_fp8_llama_runs_end_to_end_on_the_shipped_derived_packs(model_name, gpu, tp, pack):
    """The issue's FP8 runs (llama-3.1-8b on h100-80g and h200, 70B on 2x H100) on the shipped
    derived FP8 packs (the 70B one transferred within the Hopper class: no H100 all-reduce was
    measured), named so in summary.json."""
    import servesim
    from servesim.simulate import simulate

    sc = servesim.scenario_from_dict({
        "model": {"name": model_name, "quantization": "fp8"}, "hardware": {"gpu": gpu},
        "engine": {"tensor_parallel_size": tp, "max_model_len": 8192},
        "workload": {"arrival": {"process": "poisson", "rate": 20.0}, "prompt": {"dist": "fixed", "value": 512},
                     "output": {"dist": "fixed", "value": 64}},
        "stop": {"requests": 100}}, "t")
    r = simulate(sc)
    assert r.summary["requests"]["completed"] == 100
    assert r.summary["step_model"]["label"].startswith(pack), r.summary["step_model"]["label"]


def test_h100_derived_fp8_pack_runs_end_to_end(tmp_path, monkeypatch):
    """The H100 derivation (bf16 pack + the H100's GEMM survey) still builds an FP8 pack that runs
    and is labelled derived, now that the shipped H100 FP8 packs are measured: derived into a copy
    of the pack folder without them."""
    import shutil

    import servesim
    from servesim.perf import pack as packmod
    from servesim.simulate import simulate
    from servesim.tools.derive_variants import write_derived

    shutil.copytree(packmod.pack_root(), tmp_path, dirs_exist_ok=True)
    for f in (tmp_path / "h100-80g").glob("*-fp8.*"):
        f.unlink()
    monkeypatch.setattr(packmod, "pack_root", lambda: tmp_path)
    write_derived("h100-80g", tmp_path, ["qwen3-8b"], [1], "fp8")
    sc = servesim.scenario_from_dict({
        "model": {"name": "qwen3-8b", "quantization": "fp8"}, "hardware": {"gpu": "h100-80g"},
        "engine": {"max_model_len": 8192},
        "workload": {"arrival": {"process": "poisson", "rate": 20.0}, "prompt": {"dist": "fixed", "value": 512},
                     "output": {"dist": "fixed", "value": 64}},
        "stop": {"requests": 50}}, "t")
    r = simulate(sc)
    assert r.summary["requests"]["completed"] == 50
    assert r.summary["step_model"]["label"].startswith(
        "pack h100-80g/qwen3-8b-fp8 (derived from h100-80g/qwen3-8b"), r.summary["step_model"]["label"]


def test_moe_rule_reads_the_engine_class_backend_when_surveyed(tmp_path, monkeypatch):
    """A survey with a ``backend`` column: derive reads the fused kernel's rows (triton-fused),
    not grouped_mm's; without the column (the first survey) the rows are grouped_mm's; a backend
    not surveyed is refused in one line. A fused survey timed on a sibling GPU (H100 for the
    H200) beats the H200's own grouped_mm rows and is carried over by efficiency: experts scale
    with the peaks' ratio, router and combine with the HBM ratio."""
    from servesim.tools import derive_common
    from servesim.tools.derive_moe import moe_survey

    raw = read_survey("h200", "moe")  # both backends; the grouped_mm rows stand in for a first survey
    old = raw[raw.backend == "grouped_mm"].drop(columns="backend").reset_index(drop=True)
    fused = old.assign(time_ms=old.time_ms * 0.5, backend="triton-fused")
    both = pd.concat([old.assign(backend="grouped_mm"), fused], ignore_index=True)
    (tmp_path / "h200").mkdir()
    both.to_csv(tmp_path / "h200" / "moe.csv", index=False)
    monkeypatch.setattr(derive_common, "survey_root", lambda: tmp_path)
    m, backend, where = moe_survey("h200")
    assert (backend, where) == ("triton-fused", "h200") and np.allclose(m.time_ms, fused.time_ms)
    assert moe_survey("h200", "grouped_mm")[0].time_ms.sum() == pytest.approx(old.time_ms.sum())
    with pytest.raises(PackError, match="backend 'loop' not surveyed"):
        moe_survey("h200", "loop")
    cfg = MoeShape.of(MODELS["qwen3-30b-a3b"], 1)
    f, g = MoeRule(m, "h200"), MoeRule(moe_survey("h200", "grouped_mm")[0], "h200")
    assert np.allclose(f.experts_ms(cfg, [10, 1000]), 0.5 * g.experts_ms(cfg, [10, 1000]))
    # the first survey (no backend column) on the H200, the fused one on the H100
    old.to_csv(tmp_path / "h200" / "moe.csv", index=False)
    assert moe_survey("h200")[1:] == ("grouped_mm", "h200")
    (tmp_path / "h100-80g").mkdir()
    fused.to_csv(tmp_path / "h100-80g" / "moe.csv", index=False)
    m, backend, where = moe_survey("h200")
    assert (backend, where) == ("triton-fused", "h100-80g")
    moved, own = MoeRule(m, "h200", survey_gpu="h100-80g"), MoeRule(m, "h100-80g")
    h100, h200 = GPUS["h100-80g"], GPUS["h200"]
    bw = h100.hbm_bytes_per_s / h200.hbm_bytes_per_s
    assert np.allclose(moved.gate_ms(cfg, [64]), bw * own.gate_ms(cfg, [64]))
    assert np.allclose(moved.experts_ms(cfg, [10]), bw * own.experts_ms(cfg, [10]), rtol=1e-6)  # HBM-bound
