"""Step times of weight formats, KV dtypes, MoE (with expert parallelism) and MLA on the roofline,
checked against the arithmetic they stand for, and the end-to-end runs the issue asks for."""

from __future__ import annotations

import numpy as np
import pytest

from servesim import scenario_from_dict
from servesim.errors import PackError, ScenarioError
from servesim.hardware import GPUS
from servesim.models import MODELS, with_precision
from servesim.perf.roofline import RooflineStepModel


def model(name, gpu="h100-80g", tp=1, q=None, kv=None, ep=False, imbalance=1.0, **kw):
    return RooflineStepModel(GPUS[gpu], with_precision(MODELS[name], q, kv), tp, 1, expert_parallel=ep,
                             moe_imbalance=imbalance, **kw)


def decode(m, n, ctx):
    return m.predict(np.ones(n, np.int64), np.full(n, ctx, np.int64))


def prefill(m, t):
    return m.predict(np.array([t]), np.array([0]))


def test_unquantized_dense_models_keep_the_dense_path():
    assert model("llama-3.1-8b")._general == {}
    assert model("llama-3.1-8b", q="fp8")._general["general"] == 1


def test_fp8_on_hopper_halves_weight_reads_and_doubles_gemm_rate():
    bf, f8 = model("llama-3.1-8b", overhead_s=0.0), model("llama-3.1-8b", q="fp8", overhead_s=0.0)
    s = MODELS["llama-3.1-8b"]
    lm = s.hidden_size * s.vocab_size * 2 / (GPUS["h100-80g"].hbm_bytes_per_s * 0.8)  # LM head stays bf16
    # batch 1, short context: the weight reads; fp8 reads half of the layers' weights
    r = (decode(f8, 1, 16) - lm) / (decode(bf, 1, 16) - lm)
    assert 0.5 < r < 0.56, r
    # a long prefill is compute bound: fp8 GEMMs at twice the rate
    assert 0.5 < prefill(f8, 8192) / prefill(bf, 8192) < 0.75


def test_fp8_on_ampere_is_weight_only():
    bf, f8 = model("llama-3.1-8b", "a100-80g"), model("llama-3.1-8b", "a100-80g", q="fp8")
    assert "weight-only" in f8.describe()
    assert decode(f8, 1, 16) < decode(bf, 1, 16)  # fewer bytes
    assert prefill(f8, 8192) > prefill(bf, 8192)  # no FP8 tensor cores: bf16 rate plus dequantization


def test_int4_weight_only_wins_at_small_batch_and_loses_at_large():
    bf, aw = model("llama-3.1-8b", overhead_s=0.0), model("llama-3.1-8b", q="awq", overhead_s=0.0)
    assert decode(aw, 1, 16) < 0.45 * decode(bf, 1, 16)
    assert prefill(aw, 8192) > prefill(bf, 8192)


def test_fp8_kv_cache_halves_the_kv_reads_of_long_decodes():
    bf, kv8 = model("llama-3.1-8b", overhead_s=0.0), model("llama-3.1-8b", kv="fp8", overhead_s=0.0)
    base = decode(bf, 128, 0)
    assert 0.45 < (decode(kv8, 128, 32768) - base) / (decode(bf, 128, 32768) - base) < 0.55


def test_moe_decode_reads_only_the_routed_experts_at_batch_one():
    """Mixtral at batch 1 reads attention plus 2 of 8 experts per layer: its step ~ a dense model of
    its active parameters, far below its total."""
    m = model("mixtral-8x7b", "h200", overhead_s=0.0)
    s = MODELS["mixtral-8x7b"]
    bw = GPUS["h200"].hbm_bytes_per_s * 0.8
    t = decode(m, 1, 16)
    assert 0.95 < t / (s.active_params() * 2 / bw) < 1.15
    # a large batch hits every expert: the weight reads approach the whole model's
    assert decode(m, 256, 16) > 0.9 * s.num_params() * 2 / bw


def test_expert_parallelism_imbalance_and_all_to_all():
    tp_sharded = model("qwen3-30b-a3b", tp=2, overhead_s=0.0)
    ep = model("qwen3-30b-a3b", tp=2, ep=True, overhead_s=0.0)
    skew = model("qwen3-30b-a3b", tp=2, ep=True, imbalance=1.5, overhead_s=0.0)
    assert "EP 2" in ep.describe() and "TP-sharded" in tp_sharded.describe()
    for t in (4096, 16384):  # compute-bound expert GEMMs: the busiest rank sets the time
        assert prefill(skew, t) > prefill(ep, t) * 1.1
    assert ep._general["moe_n"] == 768 and tp_sharded._general["moe_n"] == 384


def test_mla_decode_reads_the_compressed_latent():
    m = model("deepseek-v3", "h200", tp=8, overhead_s=0.0)
    s = MODELS["deepseek-v3"]
    assert m._kv_bytes_tok_layer == (512 + 64) * 2 * 1  # fp8 checkpoint, auto KV = bf16: 2 bytes
    bw = GPUS["h200"].hbm_bytes_per_s * 0.8
    extra = decode(m, 64, 8192) - decode(m, 64, 0)
    assert 0.9 < extra / (64 * 8192 * s.kv_bytes_per_token() / bw) < 1.3


def test_scenario_refuses_what_would_be_ignored():
    with pytest.raises(ScenarioError, match="enable_expert_parallel"):
        scenario_from_dict({"model": "llama-3-8b", "engine": {"enable_expert_parallel": True}}, "t")
    with pytest.raises(ScenarioError, match="moe_imbalance"):
        scenario_from_dict({"model": {"name": "mixtral-8x7b"}, "hardware": {"gpu": "h200"},
                            "engine": {"max_model_len": 8192}, "step_time": {"model": "roofline", "moe_imbalance": 1.3}},
                           "t")


@pytest.fixture
def bf16_only(tmp_path, monkeypatch):
    """A pack root holding only the shipped bf16 H200 llama-3-8b pack: what these tests check holds
    whether or not packs of other precisions (issue 34) are shipped beside it."""
    import shutil

    from servesim.perf import pack as packmod

    (tmp_path / "h200").mkdir()
    for ext in ("csv", "yaml"):
        shutil.copy(packmod.pack_root() / "h200" / f"llama-3-8b.{ext}", tmp_path / "h200")
    monkeypatch.setattr(packmod, "pack_root", lambda: tmp_path)


def test_a_bf16_pack_is_not_used_for_another_precision(bf16_only):
    from servesim.perf.build import build_step_model

    sc = scenario_from_dict({"model": {"name": "llama-3-8b", "quantization": "fp8"}, "hardware": {"gpu": "h200"},
                             "step_time": {"model": "pack"}}, "t")
    with pytest.raises(PackError, match="weights fp8"):
        build_step_model(sc)


@pytest.mark.parametrize("model_name,gpu,tp", [("llama-3.1-8b", "h100-80g", 1), ("llama-3.1-8b", "h200", 1),
                                               ("llama-3.1-70b", "h100-80g", 2)])
def test_fp8_runs_end_to_end(model_name, gpu, tp):
    from servesim.simulate import simulate

    sc = scenario_from_dict({"model": {"name": model_name, "quantization": "fp8"}, "hardware": {"gpu": gpu},
                             "engine": {"tensor_parallel_size": tp, "kv_cache_dtype": "fp8", "max_model_len": 8192},
                             "workload": {"arrival": {"process": "poisson", "rate": 20.0},
                                          "prompt": {"dist": "fixed", "value": 512},
                                          "output": {"dist": "fixed", "value": 64}},
                             "stop": {"requests": 200}}, "t")
    r = simulate(sc)
    assert r.summary["requests"]["completed"] == 200
    assert r.summary["model"]["quantization"] == "fp8" and "fp8" in r.step_model
    # the FP8 pack (derived or transferred) with the FP8 KV rule on top, not the roofline
    assert r.step_model.startswith(f"pack {gpu}/{model_name}-fp8") and "with an FP8 KV cache by rule" in r.step_model
    # an FP8 cache: 1 byte per value, at least twice the blocks of the same weights over a bf16 cache
    # (more: the FP8 weights free memory too)
    bf = simulate(sc.override({"model": {"name": model_name}, "engine.kv_cache_dtype": "auto"}))
    assert r.summary["kv"]["blocks_total"] > 2 * bf.summary["kv"]["blocks_total"]


def test_the_default_step_model_falls_back_to_the_roofline_for_a_precision_no_pack_holds(bf16_only):
    from servesim.perf.select import choose

    base = {"hardware": {"gpu": "h200"}}
    assert choose(scenario_from_dict({**base, "model": "llama-3-8b"}, "t")).model == "pack"
    c = choose(scenario_from_dict({**base, "model": {"name": "llama-3-8b", "quantization": "fp8"}}, "t"))
    assert c.model == "roofline" and not c.calibrated and "weights fp8" in c.reason and "bf16" in c.reason
    # an FP8 KV cache alone is priced on the bf16-KV pack by rule (servesim/perf/kvfp8.py)
    c = choose(scenario_from_dict({**base, "model": "llama-3-8b", "engine": {"kv_cache_dtype": "fp8"}}, "t"))
    assert c.model == "pack" and c.kv_rule and c.label.startswith("pack h200/llama-3-8b with an FP8 KV cache")


def test_a_gpu_without_a_pack_gets_one_transferred_from_its_class():
    """H100 and qwen3-4b (measured on the H200 only): the H200's measured pack with every op at its
    measured efficiency (achieved / peak) under the H100's peaks: bandwidth-bound ops 4.8 / 3.35
    slower, compute-bound GEMMs unchanged (same bf16 peak). Named 'transferred' wherever the step
    model is reported; not calibrated. Where the H100 has its own measured pack (llama-3-8b and llama-3.1-8b, from
    2026-12-05; qwen3-8b since the sixth session's calls 23-24) that pack runs, calibrated, and no transfer hides it."""
    from servesim.perf.build import build_step_model
    from servesim.perf.pack import load_pack
    from servesim.perf.select import choose
    from servesim.perf.transfer import transfer_pack

    sc = scenario_from_dict({"hardware": {"gpu": "h100-80g"}, "model": "qwen3-4b",
                             "engine": {"max_model_len": 8192}}, "t")
    c = choose(sc)
    assert c.model == "pack" and not c.calibrated and c.label.startswith("pack transferred from h200/qwen3-4b")
    assert "transferred from h200/qwen3-4b" in build_step_model(sc).describe()
    q8 = choose(scenario_from_dict({"hardware": {"gpu": "h100-80g"}, "model": "qwen3-8b",
                                    "engine": {"max_model_len": 8192}}, "t"))
    assert q8.calibrated and q8.label == "pack h100-80g/qwen3-8b"
    src = load_pack("h200", "qwen3-4b")
    dst = transfer_pack(src, "h100-80g")
    t = src.rows("input_norm").time_ms  # its floor stays, the time above it scales by the HBM ratio
    assert np.allclose(dst.rows("input_norm").time_ms, t.min() + (t - t.min()) * 4.8 / 3.35)
    assert dst.rows("input_norm").time_ms.min() == pytest.approx(t.min())
    big = src.rows("gate_up_proj").tokens >= 8192  # compute bound on both: same peak, same time
    assert np.allclose(dst.rows("gate_up_proj").time_ms[big], src.rows("gate_up_proj").time_ms[big])
    own = choose(scenario_from_dict({"hardware": {"gpu": "h100-80g"}, "model": "llama-3-8b"}, "t"))
    assert own.model == "pack" and own.calibrated and own.label == "pack h100-80g/llama-3-8b"
    # llama-3.1-8b: its own H100 pack (2026-12-05, calls 17-18) is the default, not h200's transferred
    own = choose(scenario_from_dict({"hardware": {"gpu": "h100-80g"}, "model": "llama-3.1-8b",
                                     "engine": {"max_model_len": 8192}}, "t"))
    assert own.model == "pack" and own.calibrated and own.label == "pack h100-80g/llama-3.1-8b"
    # no GPU of the L40S's class has a pack: the roofline, saying why
    assert choose(scenario_from_dict({"hardware": {"gpu": "l40s"}, "model": "llama-3-8b"}, "t")).model == "roofline"
