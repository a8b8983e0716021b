"""Model shapes from Hugging Face ``config.json`` files, read offline.

The keys differ by family; this reader maps each onto :class:`~servesim.models.shape.ModelShape`:

==================  ======================================================================
dense (llama,       num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads,
mistral, qwen2/3,   head_dim (default hidden / heads), intermediate_size, vocab_size,
gemma, gemma2/3)    max_position_embeddings, tie_word_embeddings, attention_bias (qwen2: always)
experts             num_local_experts (mixtral, gpt-oss) | num_experts (qwen2/3-moe) |
                    n_routed_experts (deepseek); num_experts_per_tok | experts_per_token;
                    moe_intermediate_size (else intermediate_size); shared: n_shared_experts x
                    moe_intermediate_size (deepseek) | shared_expert_intermediate_size (qwen2-moe);
                    dense layers: first_k_dense_replace (deepseek), mlp_only_layers and
                    decoder_sparse_step (qwen)
MLA (deepseek)      q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim
sliding window      sliding_window with layer_types (gpt-oss, new transformers), gemma2 (every
                    other layer), gemma3 (sliding_window_pattern), mistral (all layers);
                    ignored where use_sliding_window is false (qwen)
precision           quantization_config.quant_method (fp8, awq, gptq, mxfp4): the checkpoint's
==================  ======================================================================

A multimodal config's ``text_config`` is read as the language model's. A family that is not a
plain decoder (state-space or linear-attention hybrids) is refused by name, and a missing key is
named in the error: nothing is guessed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from servesim.models.precision import WEIGHT_FORMATS
from servesim.models.shape import ModelShape

REFUSED_TYPES = ("jamba", "mamba", "mamba2", "nemotron_h", "falcon_h1", "zamba", "zamba2", "bamba",
                 "qwen3_next", "rwkv", "recurrent_gemma", "minimax", "granitemoehybrid")
TIED_BY_DEFAULT = ("gemma", "gemma2", "gemma3", "gemma3_text")


class ConfigError(ValueError):
    """A config.json this reader cannot turn into a shape; the message names the key."""


def read_config(path: str | Path) -> dict[str, Any]:
    """The JSON of a ``config.json`` file, or of the ``config.json`` inside a folder."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ConfigError(f"{path}: no such file (give a config.json or a folder holding one)")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{p}: not a readable JSON file ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a JSON object (a Hugging Face config.json)")
    return data


def _int(cfg: dict, key: str, where: str, default: Any = None) -> int:
    v = cfg.get(key, default)
    if v is None:
        raise ConfigError(f"{where}: key '{key}' is missing (needed for the model's shape)")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v < 0:
        raise ConfigError(f"{where}: '{key}' = {v!r} must be a whole number >= 0")
    return int(v)


def checkpoint_quantization(cfg: dict) -> str:
    """The checkpoint's weight format (``none`` when it has no quantization_config).

    Two FP8 checkpoints price differently (servesim/models/precision.py): an ``fp8`` checkpoint
    whose ``activation_scheme`` is ``static`` (vLLM model_executor/layers/quantization/fp8.py,
    Fp8Config reads that key) and a ModelOpt FP8 checkpoint (``quant_method: modelopt``,
    ``quant_algo: FP8``; vLLM quantization/modelopt.py) carry calibrated activation scales, so
    they read as ``fp8_static``; ``activation_scheme: dynamic`` stays ``fp8``."""
    q = cfg.get("quantization_config") or {}
    method = str(q.get("quant_method", "none")).lower() if isinstance(q, dict) else "none"
    if method in ("none", ""):
        return "none"
    if method == "fp8" and str(q.get("activation_scheme", "dynamic")).lower() == "static":
        return "fp8_static"
    if method == "modelopt":
        algo = str(q.get("quant_algo", "")).upper()
        if algo == "FP8":
            return "fp8_static"
        if algo == "NVFP4":
            return "nvfp4"
        raise ConfigError(f"quantization_config.quant_algo {q.get('quant_algo')!r} (modelopt) is not modelled; "
                          f"allowed: FP8, NVFP4")
    if method not in WEIGHT_FORMATS:
        raise ConfigError(f"quantization_config.quant_method {method!r} is not modelled; "
                          f"allowed: {', '.join(WEIGHT_FORMATS)}")
    return method


def _sliding_layers(cfg: dict, layers: int, mtype: str) -> tuple[int, int]:
    window = cfg.get("sliding_window") or 0
    if not window or cfg.get("use_sliding_window") is False:
        return 0, 0
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        return int(window), sum(1 for t in types if "sliding" in str(t))
    if mtype == "gemma2":
        return int(window), layers // 2
    if mtype in ("gemma3", "gemma3_text"):
        pattern = int(cfg.get("sliding_window_pattern", 6))
        return int(window), layers - layers // pattern
    return int(window), layers


def shape_from_config(cfg: dict[str, Any], name: str, source: str = "", *,
                      max_model_len: int | None = None) -> ModelShape:
    """The :class:`ModelShape` of a decoder's ``config.json`` contents (module doc for the keys)."""
    where = source or name
    if isinstance(cfg.get("text_config"), dict):
        outer = cfg
        cfg = {**cfg["text_config"], "quantization_config": outer.get("quantization_config")}
        if "tie_word_embeddings" in outer:
            cfg["tie_word_embeddings"] = outer["tie_word_embeddings"]
    mtype = str(cfg.get("model_type", "")).lower()
    if mtype in REFUSED_TYPES:
        raise ConfigError(f"{where}: model_type {mtype!r} is not a plain transformer decoder (state-space or "
                          f"linear-attention layers); servesim models attention decoders only")
    layers = _int(cfg, "num_hidden_layers", where)
    hidden = _int(cfg, "hidden_size", where)
    heads = _int(cfg, "num_attention_heads", where)
    if layers < 1 or hidden < 1 or heads < 1:
        raise ConfigError(f"{where}: num_hidden_layers, hidden_size and num_attention_heads must be >= 1")
    kv_heads = _int(cfg, "num_key_value_heads", where, heads)
    vocab = _int(cfg, "vocab_size", where)
    shape: dict[str, Any] = dict(
        name=name, num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=kv_heads,
        vocab_size=vocab, source=source,
        max_model_len=max_model_len or _int(cfg, "max_position_embeddings", where, 8192),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", mtype in TIED_BY_DEFAULT)),
        attention_bias=bool(cfg.get("attention_bias", mtype in ("qwen2", "qwen2_moe"))),
        quantization=checkpoint_quantization(cfg),
    )
    if cfg.get("kv_lora_rank"):  # MLA
        nope, rope = _int(cfg, "qk_nope_head_dim", where), _int(cfg, "qk_rope_head_dim", where)
        # DeepSeek-V2-Lite writes "q_lora_rank": null (no low-rank query): read as 0
        shape.update(q_lora_rank=_int({**cfg, "q_lora_rank": cfg.get("q_lora_rank") or 0}, "q_lora_rank", where), kv_lora_rank=_int(cfg, "kv_lora_rank", where),
                     qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=_int(cfg, "v_head_dim", where),
                     head_dim=nope + rope, num_kv_heads=heads)
    else:
        hd = cfg.get("head_dim")
        shape["head_dim"] = _int(cfg, "head_dim", where) if hd is not None else hidden // heads
    experts = next((_int(cfg, k, where) for k in ("num_local_experts", "num_experts", "n_routed_experts")
                    if cfg.get(k)), 0)
    inter = cfg.get("intermediate_size")
    if experts:
        topk = next((_int(cfg, k, where) for k in ("num_experts_per_tok", "experts_per_token") if cfg.get(k)), None)
        if topk is None:
            raise ConfigError(f"{where}: key 'num_experts_per_tok' is missing (an MoE model routes each token "
                              f"to that many experts)")
        moe_inter = _int(cfg, "moe_intermediate_size", where, inter)
        shared = _int(cfg, "n_shared_experts", where, 0) * moe_inter
        shared = shared or _int(cfg, "shared_expert_intermediate_size", where, 0)
        dense = _int(cfg, "first_k_dense_replace", where, 0)
        if "mlp_only_layers" in cfg or "decoder_sparse_step" in cfg:
            only = set(cfg.get("mlp_only_layers") or [])
            step = _int(cfg, "decoder_sparse_step", where, 1) or 1
            dense = sum(1 for i in range(layers) if i in only or (i + 1) % step)
        if topk > experts:
            raise ConfigError(f"{where}: num_experts_per_tok {topk} exceeds the {experts} experts")
        shape.update(num_experts=experts, num_experts_per_tok=topk, moe_intermediate_size=moe_inter,
                     shared_expert_intermediate_size=shared, num_dense_layers=min(dense, layers),
                     intermediate_size=_int(cfg, "intermediate_size", where, 0) if dense else int(inter or 0))
    else:
        shape["intermediate_size"] = _int(cfg, "intermediate_size", where)
    window, sliding = _sliding_layers(cfg, layers, mtype)
    shape.update(sliding_window=window, num_sliding_layers=min(sliding, layers))
    return ModelShape(**shape)


def shape_from_file(path: str | Path, name: str | None = None, *, max_model_len: int | None = None) -> ModelShape:
    """A shape from a ``config.json`` (or a folder holding one); named after the folder."""
    p = Path(path)
    cfg = read_config(p)
    label = name or (p.name if p.is_dir() else p.parent.name) or "custom"
    return shape_from_config(cfg, label, str(p), max_model_len=max_model_len)
