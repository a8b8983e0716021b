"""Packs of other precisions and of mixture-of-experts models (issue 34's FP8, FP8-KV and MoE packs).

A pack's stem names the precision it was measured in, ``<model>[-<quantization>][-kv<dtype>][-tp<N>]``
(calibration/PACK_FORMAT.md); the default step model (``auto``) finds the pack of the model's own
precision and refuses, in one line, one measured in another weight dtype, KV dtype or expert shape.
An MoE pack times ``moe_gate, moe_experts, moe_combine`` where a dense pack has the MLP's three
ops. Every pack here is synthetic, written into a temporary pack root (nothing is shipped).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import servesim
from servesim.errors import PackError
from servesim.models import MODELS, with_precision
from servesim.perf import pack as packmod
from servesim.perf.pack import (LAYER_TOKEN_OPS, MOE_LAYER_TOKEN_OPS, SHAPE_KEYS, available_packs, load_pack,
                                pack_path, pack_stem, split_stem, write_pack)
from servesim.perf.select import choose, pack_problem

TOK = (1, 64, 512)  # token grid of every token op: three points
CHUNKS, PRE_CTX = (16, 64, 512), (0, 512, 2048)
DEC_B, DEC_C = (1, 8, 64), (16, 512, 2048)
MOE = MODELS["qwen3-30b-a3b"]
DENSE = MODELS["llama-3-8b"]
TOKEN_OPS = sorted(set(LAYER_TOKEN_OPS + MOE_LAYER_TOKEN_OPS + ("embed", "final_norm", "lm_head")))


def op_ms(op: str, t: float, scale: float = 1.0) -> float:
    """Affine in tokens with a distinct intercept per op; the expert GEMMs cost 10x the rest."""
    k = TOKEN_OPS.index(op) + 1
    return scale * (10.0 if op == "moe_experts" else 1.0) * (0.001 * k + 1e-6 * k * t)


def prefill_ms(t: float, c: float) -> float:
    return 0.01 + 1e-8 * t * (c + (t + 1) / 2)


def decode_ms(b: float, c: float) -> float:
    return 0.01 + 0.0005 * b + 2e-7 * b * c


def gaps_ms(b: float) -> float:
    return 0.1 + 0.0001 * b


def rows(layer_ops: tuple[str, ...], scale: float = 1.0) -> list[tuple]:
    out = [(op, t, 0, 0, 0, op_ms(op, t, scale), 0.0) for op in layer_ops + ("embed", "final_norm", "lm_head")
           for t in TOK]
    out += [("attn_prefill", t, 0, c, 0, prefill_ms(t, c), 0.0) for t in CHUNKS for c in PRE_CTX]
    out += [("attn_decode", 0, b, c, 0, decode_ms(b, c), 0.0) for b in DEC_B for c in DEC_C]
    out += [("overhead_eager", 0, b, 0, 0, 1.0 + 0.001 * b, 0.0) for b in (1, 64)]
    out += [("overhead_cuda_graph", 0, b, 0, 0, gaps_ms(b), 0.0) for b in (1, 64)]
    return out


def write(root: Path, shape_, tp: int = 1, scale: float = 1.0, stem: str | None = None, **meta) -> Path:
    """A synthetic pack of ``shape_`` (its precision and kind) under ``root/h200``; ``meta``
    overrides metadata keys (None drops one)."""
    shape = shape_
    moe = shape.is_moe
    keys = SHAPE_KEYS + (("num_experts", "num_experts_per_tok", "moe_intermediate_size") if moe else ())
    m = {"gpu": "h200", "model": shape.name, "tp": tp, "source": "measured", "origin": "test",
         "dtype": packmod.WEIGHT_DTYPES[shape.quantization], "quantization": shape.quantization,
         "kv_cache_dtype": shape.kv_cache_dtype, "gemm_backend": "test",
         "shape": {k: getattr(shape, k) for k in keys}}
    if moe:
        m["routing"] = "uniform"
    for k, v in meta.items():
        if v is None:
            m.pop(k, None)
        else:
            m[k] = v
    path = root / "h200" / f"{stem or pack_stem(shape, tp)}.csv"
    write_pack(rows(MOE_LAYER_TOKEN_OPS if moe else LAYER_TOKEN_OPS, scale), m, path)
    return path


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setattr(packmod, "pack_root", lambda: tmp_path)
    return tmp_path


def scenario(model, gpu="h200", **engine):
    return servesim.scenario_from_dict({"model": model, "hardware": {"gpu": gpu},
                                        "engine": {"max_model_len": 8192, **engine}}, "t")


FP8 = {"name": "llama-3-8b", "quantization": "fp8"}


def test_stems_round_trip_and_bf16_stems_are_unchanged(root):
    cases = [("llama-3-8b", 1, "none", "auto"), ("llama-3-8b", 2, "none", "auto"), ("llama-3-8b", 1, "fp8", "auto"),
             ("llama-3-8b", 1, "none", "fp8"), ("llama-3-8b", 2, "fp8", "fp8"), ("qwen3-30b-a3b", 1, "none", "auto"),
             ("llama-3.1-8b", 4, "int8", "fp8_e4m3"), ("qwen3-30b-a3b", 8, "awq", "auto")]
    for model, tp, q, kv in cases:
        stem = pack_stem(model, tp, q, kv)
        assert split_stem(stem) == (model, tp, q, kv), stem
        assert pack_stem(with_precision(MODELS[model], q, kv), tp) == stem
    assert pack_stem("llama-3-8b", 2) == "llama-3-8b-tp2" and pack_stem("qwen3-30b-a3b", 1) == "qwen3-30b-a3b"
    assert pack_stem("llama-3-8b", 1, "fp8") == "llama-3-8b-fp8"
    assert pack_stem("llama-3-8b", 1, kv_cache_dtype="fp8") == "llama-3-8b-kvfp8"
    assert pack_stem("llama-3-8b", 2, "fp8", "fp8") == "llama-3-8b-fp8-kvfp8-tp2"
    shape = with_precision(DENSE, "fp8", "fp8")
    assert pack_path("h200", shape, 2).name == "llama-3-8b-fp8-kvfp8-tp2.csv"
    write(root, DENSE)
    write(root, shape, tp=2)
    write(root, MOE)
    assert available_packs() == [("h200", "llama-3-8b", 1), ("h200", "llama-3-8b-fp8-kvfp8", 2),
                                 ("h200", "qwen3-30b-a3b", 1)]
    pack = load_pack("h200", "llama-3-8b-fp8-kvfp8", 2)  # by pack name, as available_packs lists it
    assert (pack.model, pack.quantization, pack.kv_cache_dtype, pack.stem) == \
        ("llama-3-8b", "fp8", "fp8", "llama-3-8b-fp8-kvfp8-tp2")


def test_an_fp8_model_runs_its_fp8_pack_and_a_bf16_model_does_not(root):
    write(root, DENSE)
    write(root, with_precision(DENSE, "fp8"), scale=0.5)
    fp8, bf16 = scenario(FP8), scenario("llama-3-8b")
    c = choose(fp8)
    assert c.model == "pack" and c.calibrated and c.reason is None
    assert c.label == "pack h200/llama-3-8b-fp8" and c.pack_id.startswith("h200/llama-3-8b-fp8 sha256:")
    b = choose(bf16)
    assert b.label == "pack h200/llama-3-8b" and b.pack_id.startswith("h200/llama-3-8b sha256:")
    from servesim.perf.build import build_step_model

    m8, m16 = build_step_model(fp8), build_step_model(bf16)
    assert m8.describe().startswith("pack h200/llama-3-8b-fp8 (") and m16.describe().startswith("pack h200/llama-3-8b (")
    new, ctx = np.array([64]), np.array([0])
    lin8, lin16 = m8._lin_at(64), m16._lin_at(64)
    assert lin8 == pytest.approx(0.5 * lin16, rel=1e-12)  # the fp8 pack's own (halved) token ops
    assert m8.predict(new, ctx) < m16.predict(new, ctx)
    # an explicit step_time: pack finds the same pack
    assert choose(fp8.override({"step_time": {"model": "pack"}})).label == "pack h200/llama-3-8b-fp8"
    # the KV-fp8 variant has no pack here: the bf16-KV pack with the FP8 KV rule (servesim/perf/kvfp8.py)
    kv = choose(scenario("llama-3-8b", kv_cache_dtype="fp8"))
    assert kv.model == "pack" and kv.calibrated and kv.label == (
        "pack h200/llama-3-8b with an FP8 KV cache by rule (decode attention x H200 survey fp8/bf16)")


@pytest.mark.parametrize("case", ["dtype", "quantization", "kv", "experts", "expert-keys", "dense-for-moe"])
def test_a_pack_of_another_precision_or_expert_shape_is_refused_in_one_line(root, case):
    fp8, kv8 = with_precision(DENSE, "fp8"), with_precision(DENSE, kv_cache_dtype="fp8")
    shape, make = {
        "dtype": (fp8, lambda: write(root, fp8, dtype="bf16")),
        "quantization": (fp8, lambda: write(root, fp8, quantization="int8", dtype="int8")),
        "kv": (kv8, lambda: write(root, kv8, kv_cache_dtype="auto")),
        "experts": (MOE, lambda: write(root, MOE, shape={**{k: getattr(MOE, k) for k in SHAPE_KEYS},
                                                         "num_experts": 64, "num_experts_per_tok": 8,
                                                         "moe_intermediate_size": 768})),
        "expert-keys": (MOE, lambda: write(root, MOE, shape={k: getattr(MOE, k) for k in SHAPE_KEYS})),
        "dense-for-moe": (MOE, None),
    }[case]
    if case == "dense-for-moe":  # a dense pack written under the MoE model's name
        write(root, DENSE, stem="qwen3-30b-a3b", model="qwen3-30b-a3b",
              shape={k: getattr(MOE, k) for k in SHAPE_KEYS})
    else:
        make()
    why = pack_problem("h200", shape, 1, 1, cuda_graph=True)
    expect = {"dtype": "dtype is bf16", "quantization": "quantization=int8", "kv": "kv_cache_dtype=auto",
              "experts": "shape.num_experts is 64", "expert-keys": "shape.num_experts is missing",
              "dense-for-moe": "dense-MLP timings"}[case]
    assert why is not None and expect in why and "\n" not in why, why
    assert why.startswith(f"pack h200/{pack_stem(shape, 1)} does not fit: ")
    sc = scenario({"name": shape.name, "quantization": shape.quantization}, kv_cache_dtype=shape.kv_cache_dtype)
    c = choose(sc)
    assert c.model == "roofline" and not c.calibrated and c.reason == why
    from servesim.perf.build import build_step_model

    with pytest.raises(PackError) as info:
        build_step_model(sc.override({"step_time": {"model": "pack"}}))
    assert expect in str(info.value) and "\n" not in str(info.value)


def test_a_latent_attention_model_needs_a_pack_timed_for_its_latent(root):
    """No pack of the MLA model: the roofline, saying it is latent attention; a pack under its name
    that records no latent shape (GQA timings) is refused in one line."""
    ds = MODELS["deepseek-v2-lite"]
    why = pack_problem("h200", ds, 1, 1, cuda_graph=False)
    assert why.startswith("no calibration pack for h200/deepseek-v2-lite tp 1") and "latent attention (MLA)" in why
    write(root, DENSE, stem="deepseek-v2-lite", model="deepseek-v2-lite",
          shape={k: getattr(ds, k) for k in SHAPE_KEYS})
    why = pack_problem("h200", ds, 1, 1, cuda_graph=False)
    assert "records no shape.kv_lora_rank" in why and "\n" not in why


def test_an_moe_pack_prices_an_iteration_as_the_sum_of_its_ops(root):
    write(root, MOE)
    from servesim.perf.packmodel import load_pack_model

    m = load_pack_model("h200", "qwen3-30b-a3b", cuda_graph=True, graph_scope="all")
    assert m.token_ops == MOE_LAYER_TOKEN_OPS and "gate_up_proj" not in m.curves
    L = MOE.num_layers

    def lin(t):
        return L * (sum(op_ms(op, t) for op in MOE_LAYER_TOKEN_OPS) + op_ms("residual_add", t)) + op_ms("embed", t)

    def head(n):
        return op_ms("lm_head", n) + op_ms("final_norm", n) + gaps_ms(n)

    for t in (64, 512):  # one prefill of t tokens at context 0
        want = lin(t) + head(1) + L * prefill_ms(t, 0)
        assert m.predict(np.array([t]), np.array([0])) * 1e3 == pytest.approx(want, rel=1e-9)
    # 8 decodes at context 512 (a measured batch row) beside one 56-token prefill at context 512
    new, ctx = np.array([56] + [1] * 8), np.array([512] * 9)
    want = lin(64) + head(9) + L * (decode_ms(8, 512) + prefill_ms(56, 512))
    got = m.predict(new, ctx) * 1e3
    # prefill attention of 56 tokens lies between measured chunks (bilinear): take the model's
    assert got == pytest.approx(want - L * prefill_ms(56, 512)
                                + L * float(m.prefill_attn(np.array([56]), np.array([512]))[0]), rel=1e-9)
    assert m.grid_ends()["gemm_tokens"] == 512


def test_an_moe_run_counts_extrapolation_and_names_its_pack(root):
    write(root, MOE)
    sc = servesim.scenario_from_dict({
        "model": "qwen3-30b-a3b", "hardware": {"gpu": "h200"}, "engine": {"max_model_len": 8192},
        "workload": {"arrival": {"process": "closed", "clients": 4, "think_s": 0},
                     "prompt": {"dist": "fixed", "value": 2000}, "output": {"dist": "fixed", "value": 8}},
        "stop": {"requests": 12, "warmup_requests": 0}}, "t")
    s = servesim.simulate(sc).summary
    assert s["step_model"]["label"] == "pack h200/qwen3-30b-a3b" and s["step_model"]["calibrated"] is True
    by = s["extrapolation"]["by_op"]
    assert by["gemm_tokens"]["grid_end"] == 512 and by["gemm_tokens"]["iterations"] > 0
    assert by["prefill_chunk"]["iterations"] > 0 and s["extrapolation"]["iterations_outside"] > 0


def test_precision_and_moe_packs_transfer_within_their_class(root):
    """An MoE pack transfers too (its experts by their expected work: servesim/perf/transfer.py),
    named as such; never across classes."""
    write(root, with_precision(DENSE, "fp8"))
    write(root, MOE)
    c = choose(scenario(FP8, gpu="h100-80g"))
    assert c.model == "pack" and not c.calibrated and c.label.startswith("pack transferred from h200/llama-3-8b-fp8")
    assert choose(scenario("llama-3-8b", gpu="h100-80g")).model == "roofline"  # no bf16 pack in this root
    c = choose(scenario("qwen3-30b-a3b", gpu="h100-80g"))
    assert c.model == "pack" and not c.calibrated and c.label.startswith("pack transferred from h200/qwen3-30b-a3b")
    assert choose(scenario("qwen3-30b-a3b", gpu="a100-80g")).model == "roofline"


def test_validation_rows_are_predicted_in_their_precision(root, tmp_path_factory):
    from servesim.tools.calibrate_cli import error_table, read_validation, validate_frame
    from servesim.perf.packmodel import load_pack_model

    write(root, DENSE)
    write(root, with_precision(DENSE, "fp8"), scale=0.5)
    val = tmp_path_factory.mktemp("val")
    head = "model,tp,cuda_graph,n_prefill,prefill_len,prefill_ctx,n_decode,decode_ctx,measured_ms,std_ms"
    (val / "llama-3-8b.csv").write_text(f"{head}\nllama-3-8b,1,true,1,64,0,0,0,2.0,0.01\n")
    (val / "llama-3-8b-fp8.csv").write_text(f"{head},quantization,kv_cache_dtype\n"
                                             "llama-3-8b,1,true,1,64,0,0,0,1.0,0.01,fp8,auto\n")
    res = validate_frame("h200", read_validation(val)).set_index("file")
    for f, name in (("llama-3-8b.csv", "llama-3-8b"), ("llama-3-8b-fp8.csv", "llama-3-8b-fp8")):
        m = load_pack_model("h200", name, cuda_graph=True, graph_scope="all")
        assert res.loc[f, "predicted_ms"] == pytest.approx(m.predict(np.array([64]), np.array([0])) * 1e3, rel=1e-12)
        assert res.loc[f, "pack"] == name
    assert set(error_table(res.reset_index())["model"]) == {"llama-3-8b", "llama-3-8b-fp8"}
    (val / "bad.csv").write_text(f"{head},quantization\nllama-3-8b,1,true,1,64,0,0,0,1.0,0.01,fp9\n")
    with pytest.raises(PackError, match="quantization 'fp9' is unknown"):
        read_validation(val)


def test_efficiency_counts_the_packs_own_bytes(root):
    """An FP8 KV cache is read at 1 byte per value and FP8 weights at 1 byte per weight, so the
    achieved bandwidth the floors hold a pack to is not doubled by counting bf16 bytes."""
    from servesim.perf.efficiency import decode_bandwidth, pack_efficiency

    write(root, DENSE)
    write(root, with_precision(DENSE, "fp8", "fp8"))
    bf, f8 = load_pack("h200", "llama-3-8b"), load_pack("h200", "llama-3-8b-fp8-kvfp8")
    assert np.allclose(decode_bandwidth(f8)["bytes"], 0.5 * decode_bandwidth(bf)["bytes"])
    b = 64 * 2049 * 2 * DENSE.num_kv_heads * DENSE.head_dim * 1  # batch 64, context 2048, 1 byte
    assert b in decode_bandwidth(f8)["bytes"]
    small = "gemm_tokens_le_16_TBps"
    assert pack_efficiency(f8)[small]["median"] < pack_efficiency(bf)[small]["median"]  # same times, fewer bytes


def test_a_roofline_fits_to_a_precision_pack_by_its_stem(root):
    from servesim.perf.rooflinefit import fit_roofline

    write(root, with_precision(DENSE, "fp8"), scale=0.5)
    fit_roofline.cache_clear()  # fits are cached by reference: this root's pack, not another's
    sc = servesim.scenario_from_dict({"model": FP8, "hardware": {"gpu": "h200"}, "engine": {"max_model_len": 8192},
                                      "step_time": {"model": "roofline", "fit": "h200/llama-3-8b-fp8"}}, "t")
    assert choose(sc).pack == "h200/llama-3-8b-fp8"
    f = fit_roofline("h200/llama-3-8b-fp8")
    assert f.pack == "h200/llama-3-8b-fp8" and f.points > 10 and 0 < f.mfu <= 1
    fit_roofline.cache_clear()


def test_a_sweep_digests_the_pack_a_replica_runs(root):
    """The sweep's input digests (servesim/sweep/spec.py) cover the pack of the model's precision,
    and the source pack of a transferred one."""
    from servesim.perf.pack import pack_path as path_of
    from servesim.sweep.spec import _pack_files

    csv = write(root, with_precision(DENSE, "fp8"))
    assert _pack_files(scenario(FP8)) == [csv, csv.with_suffix(".yaml")]
    assert _pack_files(scenario(FP8, gpu="h100-80g")) == [csv, csv.with_suffix(".yaml")]  # transferred from it
    assert path_of("h200", with_precision(DENSE, "fp8")) == csv
