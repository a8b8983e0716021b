"""Models: the shipped config.json library, config.json reading, and memory plans checked
against hand counts (weights, KV bytes per token, blocks) for dense, MoE and MLA models in two
precisions each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servesim import scenario_from_dict
from servesim.errors import ScenarioError
from servesim.hardware import GPUS
from servesim.memory import NON_TORCH_BYTES, plan_memory
from servesim.models import LIBRARY, MODELS, ConfigError, shape_from_config, shape_from_file

# (total, active) parameters the model cards state, in billions; ours within 1.5 %
PUBLISHED = {
    "llama-3.1-8b": (8.03, None), "llama-3.1-70b": (70.6, None), "llama-3.1-405b": (405.9, None),
    "qwen2.5-72b": (72.7, None), "mixtral-8x7b": (46.7, 12.9), "qwen3-30b-a3b": (30.5, None),
    "qwen3-235b-a22b": (235.0, None), "deepseek-v3": (671.0, None), "gpt-oss-120b": (116.8, 5.13),
    "gpt-oss-20b": (20.9, 3.61), "gemma-2-9b": (9.24, None), "deepseek-v2-lite": (15.7, None),
}  # (DeepSeek-V2-Lite's card: "2.4B activated"; ours 2.45 B, 2 % above the card's two digits)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_library_parameter_counts_match_the_model_cards(name):
    total, active = PUBLISHED[name]
    s = MODELS[name]
    assert abs(s.num_params() / 1e9 / total - 1) < 0.015, s.num_params()
    if active is not None:  # Mixtral's card counts the input embedding too: 1.5 %
        assert abs(s.active_params() / 1e9 / active - 1) < 0.015, s.active_params()


def test_every_library_entry_cites_its_config_json():
    files = sorted(LIBRARY.glob("*.json"))
    assert len(files) == len(MODELS) >= 18
    for f in files:
        entry = json.loads(f.read_text())
        assert entry["source"].startswith("https://huggingface.co/") and entry["source"].endswith("/config.json")
        assert f.stem == entry["name"]


def test_moe_and_mla_shapes_are_read_from_their_configs():
    ds = MODELS["deepseek-v3"]
    assert (ds.num_experts, ds.num_experts_per_tok, ds.moe_intermediate_size) == (256, 8, 2048)
    assert (ds.shared_expert_intermediate_size, ds.num_dense_layers, ds.kv_lora_rank) == (2048, 3, 512)
    assert ds.quantization == "fp8"  # the checkpoint's format is the default, as in vLLM
    lite = MODELS["deepseek-v2-lite"]  # its config writes "q_lora_rank": null (no low-rank query)
    assert (lite.q_lora_rank, lite.kv_lora_rank, lite.num_dense_layers, lite.shared_expert_intermediate_size) == \
        (0, 512, 1, 2 * 1408)
    q = MODELS["qwen3-30b-a3b"]
    assert (q.num_experts, q.num_experts_per_tok, q.num_dense_layers, q.num_kv_heads) == (128, 8, 0, 4)
    g = MODELS["gpt-oss-120b"]
    assert (g.quantization, g.num_sliding_layers, g.sliding_window, g.attention_bias) == ("mxfp4", 18, 128, True)
    assert MODELS["gemma-2-9b"].tie_word_embeddings and MODELS["gemma-2-9b"].num_sliding_layers == 21
    assert MODELS["qwen2.5-72b"].attention_bias and not MODELS["qwen3-8b"].attention_bias


# --- hand counts ---------------------------------------------------------------------------
def gqa(h, heads, kv, hd):
    return h * heads * hd + 2 * h * kv * hd + heads * hd * h  # q, k, v, o


def dense_weights(layers, h, heads, kv, hd, inter, vocab, *, wb=2, bias=False, tie=False):
    lin = gqa(h, heads, kv, hd) + 3 * h * inter
    other = 2 * h + ((heads + 2 * kv) * hd if bias else 0)
    return int(layers * (lin * wb + other * 2) + (1 if tie else 2) * vocab * h * 2)


HAND = {
    # model: (hand-counted weights of the whole model at (none, fp8), KV bytes/token at (auto, fp8))
    "llama-3.1-8b": ((dense_weights(32, 4096, 32, 8, 128, 14336, 128256),
                      dense_weights(32, 4096, 32, 8, 128, 14336, 128256, wb=1)), 2 * 32 * 8 * 128),
    "llama-3.1-70b": ((dense_weights(80, 8192, 64, 8, 128, 28672, 128256),
                       dense_weights(80, 8192, 64, 8, 128, 28672, 128256, wb=1)), 2 * 80 * 8 * 128),
    "qwen3-8b": ((dense_weights(36, 4096, 32, 8, 128, 12288, 151936),
                  dense_weights(36, 4096, 32, 8, 128, 12288, 151936, wb=1)), 2 * 36 * 8 * 128),
    "qwen2.5-72b": ((dense_weights(80, 8192, 64, 8, 128, 29568, 152064, bias=True),
                     dense_weights(80, 8192, 64, 8, 128, 29568, 152064, wb=1, bias=True)), 2 * 80 * 8 * 128),
    "mistral-7b": ((dense_weights(32, 4096, 32, 8, 128, 14336, 32768),
                    dense_weights(32, 4096, 32, 8, 128, 14336, 32768, wb=1)), 2 * 32 * 8 * 128),
    "gemma-2-9b": ((dense_weights(42, 3584, 16, 8, 256, 14336, 256000, tie=True),
                    dense_weights(42, 3584, 16, 8, 256, 14336, 256000, wb=1, tie=True)), 2 * 42 * 8 * 256),
}


def _moe(layers, h, heads, kv, hd, vocab, experts, inter, wb):
    # attention + 8 experts (gate, up, down) quantized; norms and router bf16; embed + head bf16
    lin = gqa(h, heads, kv, hd) + experts * 3 * h * inter
    return int(layers * (lin * wb + (2 * h + h * experts) * 2) + 2 * vocab * h * 2)


HAND["mixtral-8x7b"] = ((_moe(32, 4096, 32, 8, 128, 32000, 8, 14336, 2), _moe(32, 4096, 32, 8, 128, 32000, 8, 14336, 1)),
                        2 * 32 * 8 * 128)
HAND["qwen3-30b-a3b"] = ((_moe(48, 2048, 32, 4, 128, 151936, 128, 768, 2),
                          _moe(48, 2048, 32, 4, 128, 151936, 128, 768, 1)), 2 * 48 * 4 * 128)


def _deepseek(wb):
    h, H, L = 7168, 128, 61
    q = h * 1536 + 1536 * H * (128 + 64)
    kv = h * (512 + 64) + 512 * H * (128 + 128)
    o = H * 128 * h
    attn = q + kv + o
    norms = 2 * h + 1536 + 512
    dense_layer = (attn + 3 * h * 18432) * wb + norms * 2
    moe_layer = (attn + 256 * 3 * h * 2048 + 3 * h * 2048) * wb + (norms + h * 256) * 2
    return int(3 * dense_layer + 58 * moe_layer + 2 * 129280 * h * 2)


HAND["deepseek-v3"] = ((_deepseek(2), _deepseek(1)), 61 * (512 + 64))  # MLA: one latent + rope key


def _gpt_oss(layers, experts, expert_bytes):
    h = 2880
    attn = gqa(h, 64, 8, 64)
    bias = (64 + 16) * 64
    experts_p = experts * 3 * h * 2880
    plain = attn + bias + 2 * h + h * experts  # attention, biases, norms, router: bf16
    return int(layers * (experts_p * expert_bytes + plain * 2) + 2 * 201088 * h * 2)


HAND_GPT_OSS = {"gpt-oss-120b": ((_gpt_oss(36, 128, 2), _gpt_oss(36, 128, 0.5 + 1 / 32)), 2 * 36 * 8 * 64)}


@pytest.mark.parametrize("name", sorted(HAND))
@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_weights_and_kv_bytes_match_hand_counts(name, precision):
    (w_none, w_fp8), kv = HAND[name]
    q = "none" if precision == "bf16" else "fp8"
    kv_dtype = "auto" if precision == "bf16" else "fp8"
    sc = scenario_from_dict({"model": {"name": name, "quantization": q},
                             "engine": {"kv_cache_dtype": kv_dtype, "max_model_len": 4096}}, "t")
    s = sc.model_shape
    assert s.weight_bytes() == (w_none if q == "none" else w_fp8)
    assert s.kv_bytes_per_token() == kv * (2 if kv_dtype == "auto" else 1)


def test_mxfp4_quantizes_only_the_experts():
    (w_bf16, w_mx), kv = HAND_GPT_OSS["gpt-oss-120b"]
    s = MODELS["gpt-oss-120b"]
    assert s.weight_bytes() == w_mx
    sc = scenario_from_dict({"model": {"name": "gpt-oss-120b", "quantization": "none"},
                             "engine": {"max_model_len": 4096}}, "t")
    assert sc.model_shape.weight_bytes() == w_bf16
    assert s.kv_bytes_per_token() == kv * 2


def test_awq_weights_are_four_bits_plus_group_scales():
    s = scenario_from_dict({"model": {"name": "llama-3.1-8b", "quantization": "awq"},
                            "engine": {"max_model_len": 4096}}, "t").model_shape
    lin = gqa(4096, 32, 8, 128) + 3 * 4096 * 14336
    per_param = 0.5 + (2 + 0.5) / 128  # 4-bit value; per 128: fp16 scale + 4-bit zero point
    assert s.weight_bytes() == int(round(32 * lin * per_param)) + 32 * 2 * 4096 * 2 + 2 * 128256 * 4096 * 2


# (model, gpu, tp, quantization, kv dtype): blocks from the hand-counted weights and KV bytes
PLANS = [
    ("llama-3.1-8b", "h100-80g", 1, "none", "auto"), ("llama-3.1-8b", "h100-80g", 1, "fp8", "fp8"),
    ("llama-3.1-70b", "h100-80g", 2, "fp8", "auto"), ("llama-3.1-70b", "h200", 2, "none", "fp8"),
    ("qwen3-8b", "a100-80g", 1, "fp8", "fp8"), ("qwen2.5-72b", "h200", 4, "none", "auto"),
    ("mistral-7b", "l40s", 1, "fp8", "auto"), ("mixtral-8x7b", "h100-80g", 2, "none", "auto"),
    ("mixtral-8x7b", "h100-80g", 1, "fp8", "fp8"), ("qwen3-30b-a3b", "h200", 1, "none", "fp8"),
    ("deepseek-v3", "h200", 8, "fp8", "auto"), ("gemma-2-9b", "a100-40g", 1, "none", "auto"),
]


@pytest.mark.parametrize("name,gpu,tp,q,kv_dtype", PLANS)
def test_memory_plan_blocks_follow_from_the_hand_counts(name, gpu, tp, q, kv_dtype):
    (w_none, w_fp8), kv = HAND[name]
    sc = scenario_from_dict({"model": {"name": name, "quantization": q}, "hardware": {"gpu": gpu},
                             "engine": {"tensor_parallel_size": tp, "kv_cache_dtype": kv_dtype,
                                        "max_model_len": 4096}}, "t")
    plan = plan_memory(sc)
    weights = (w_none if q == "none" else w_fp8) // tp
    kv_tok = kv * (2 if kv_dtype == "auto" else 1)
    if not MODELS[name].is_mla:
        kv_tok //= tp  # GQA heads split across ranks; the MLA latent is on every rank
    assert plan.weight_bytes == weights and plan.kv_bytes_per_token == kv_tok
    budget = int(0.9 * GPUS[gpu].memory_bytes)
    assert plan.num_blocks == (budget - weights - plan.activation_bytes - NON_TORCH_BYTES) // (16 * kv_tok) > 0


# --- config.json files ---------------------------------------------------------------------
def _write(tmp_path: Path, cfg: dict, folder: str = "my-model") -> Path:
    d = tmp_path / folder
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_a_scenario_reads_a_config_json_relative_to_its_file(tmp_path):
    cfg = json.loads((LIBRARY / "qwen3-30b-a3b.json").read_text())["config"]
    _write(tmp_path, cfg)
    (tmp_path / "s.yaml").write_text("model: {config: my-model, quantization: fp8}\n"
                                     "engine: {max_model_len: 4096}\n")
    from servesim.scenario import load_scenario

    sc = load_scenario(tmp_path / "s.yaml")
    s = sc.model_shape
    assert s.name == "my-model" and s.quantization == "fp8" and s.num_experts == 128
    assert s.num_params() == MODELS["qwen3-30b-a3b"].num_params()


def test_multimodal_text_config_and_family_defaults(tmp_path):
    gemma3 = {"model_type": "gemma3", "text_config": {
        "model_type": "gemma3_text", "num_hidden_layers": 62, "hidden_size": 5376, "num_attention_heads": 32,
        "num_key_value_heads": 16, "head_dim": 128, "intermediate_size": 21504, "vocab_size": 262208,
        "sliding_window": 1024, "sliding_window_pattern": 6, "max_position_embeddings": 131072}}
    s = shape_from_file(_write(tmp_path, gemma3))
    assert (s.num_layers, s.num_sliding_layers, s.tie_word_embeddings) == (62, 52, True)


@pytest.mark.parametrize("cfg,needle", [
    ({"model_type": "jamba", "num_hidden_layers": 2}, "not a plain transformer decoder"),
    ({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 10}, "'intermediate_size'"),
    ({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 10, "intermediate_size": 8,
      "num_local_experts": 4}, "num_experts_per_tok"),
    ({"num_hidden_layers": "two"}, "'num_hidden_layers' = 'two'"),
])
def test_config_errors_name_the_key(cfg, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        shape_from_config(cfg, "x")


def test_scenario_errors_are_one_line(tmp_path):
    for model, needle in [({"config": str(tmp_path / "nope")}, "model.config"),
                          ({"name": "llama-3.1-8b", "config": "x"}, "exactly one of name"),
                          ({"name": "llama-3.1-8b", "quantization": "int3"}, "model.quantization")]:
        with pytest.raises(ScenarioError, match=needle) as e:
            scenario_from_dict({"model": model}, "t")
        assert "\n" not in str(e.value)


def test_summary_json_and_header_give_params_and_kv_bytes_per_token():
    from servesim.simulate import simulate

    sc = scenario_from_dict({"model": {"name": "qwen3-30b-a3b", "quantization": "fp8"}, "hardware": {"gpu": "h200"},
                             "engine": {"max_model_len": 4096, "kv_cache_dtype": "fp8"},
                             "step_time": {"model": "constant", "seconds": 0.01}, "stop": {"requests": 20}}, "t")
    m = simulate(sc).summary["model"]
    assert m["params"] == MODELS["qwen3-30b-a3b"].num_params() and m["active_params"] < m["params"] / 9
    assert m["kv_bytes_per_token"] == 48 * 2 * 4 * 128 and m["quantization"] == "fp8"
    assert m["kind"] == "MoE" and m["source"].endswith("Qwen3-30B-A3B/blob/main/config.json")
    assert "active per token" in sc.model_shape.headline()


def test_docs_list_every_model_and_gpu_and_each_gpu_number_has_a_source():
    import re

    doc = (Path(__file__).parent.parent / "docs" / "models.md").read_text()
    for name in list(MODELS) + list(GPUS):
        assert f"| `{name}` |" in doc, name
    src = (Path(__file__).parent.parent / "servesim" / "hardware.py").read_text()
    numeric = ("memory_bytes", "hbm_bytes_per_s", "bf16_flops_per_s", "fp8_flops_per_s", "int8_ops_per_s",
               "nvlink_bytes_per_s", "pcie_bytes_per_s")
    lines = [ln for ln in src.splitlines() if re.match(rf"\s+({'|'.join(numeric)})=", ln)]
    assert len(lines) >= 6 * len(GPUS)
    for ln in lines:  # a comment naming the data sheet (or the driver's reading) beside each number
        assert re.search(r"#.*(\[[A-Z0-9]+\]|nvidia-smi)", ln), ln
    sheets = set(re.findall(r"^\* \[([A-Z0-9]+)\]", src, re.M))
    assert {g.source for g in GPUS.values()} <= sheets


def test_gpu_names_come_from_the_registry():
    for gpu in GPUS:
        sc = scenario_from_dict({"hardware": {"gpu": gpu}}, "t")
        assert sc.hardware.gpu == gpu
    with pytest.raises(ScenarioError, match="b200"):
        scenario_from_dict({"hardware": {"gpu": "h300"}}, "t")


@pytest.mark.parametrize("qcfg,expected", [
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "fp8"),  # DeepSeek-V3's checkpoint
    ({"quant_method": "fp8"}, "fp8"),  # no scheme given: vLLM's Fp8Config default, dynamic
    ({"quant_method": "fp8", "activation_scheme": "static"}, "fp8_static"),
    ({"quant_method": "modelopt", "quant_algo": "FP8"}, "fp8_static"),  # NVIDIA ModelOpt FP8
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "nvfp4"),
])
def test_a_checkpoints_activation_scheme_picks_the_fp8_recipe(qcfg, expected):
    cfg = json.loads((LIBRARY / "llama-3.1-8b.json").read_text())["config"]
    assert shape_from_config({**cfg, "quantization_config": qcfg}, "x").quantization == expected


def test_an_unmodelled_modelopt_algorithm_is_named():
    cfg = json.loads((LIBRARY / "llama-3.1-8b.json").read_text())["config"]
    with pytest.raises(ConfigError, match="quant_algo 'W4A8_AWQ'.*allowed: FP8, NVFP4"):
        shape_from_config({**cfg, "quantization_config": {"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}}, "x")


def test_vllms_modelopt_flag_is_the_static_fp8_recipe():
    """``--quantization modelopt`` pasted from a vLLM command line means a ModelOpt FP8 checkpoint."""
    sc = scenario_from_dict({"model": {"name": "llama-3.1-8b", "quantization": "modelopt"},
                             "engine": {"max_model_len": 8192}}, "t")
    assert sc.model_shape.quantization == "fp8_static"
