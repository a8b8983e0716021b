"""Models: shapes, the precisions they are served in, and the one registry of named models.

The registry is the shipped library ``servesim/models/library/<name>.json``: each file holds the
facts of one public Hugging Face ``config.json`` (layer counts and sizes, nothing else), its
address (``source``) and, where the served context differs from ``max_position_embeddings``, the
``max_model_len`` the model card states (Qwen3: 32,768 tokens natively; ``max_position_embeddings``
40,960 includes generation headroom). A scenario names one (``model: llama-3.1-70b``) or points at
a config.json of its own (``model: {config: path/to/config.json}``): :mod:`servesim.models.hf`
reads both the same way. Adding a model = adding a file (docs/models.md).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from servesim.models.hf import ConfigError, shape_from_config, shape_from_file
from servesim.models.precision import KV_CACHE_DTYPES, WEIGHT_FORMATS, WeightFormat, weight_format
from servesim.models.shape import ModelShape

LIBRARY = Path(__file__).parent / "library"

__all__ = ["MODELS", "ModelShape", "model_names", "shape_from_file", "shape_from_config", "ConfigError",
           "with_precision", "WEIGHT_FORMATS", "KV_CACHE_DTYPES", "WeightFormat", "weight_format", "LIBRARY"]


def _load_library() -> dict[str, ModelShape]:
    out: dict[str, ModelShape] = {}
    for f in sorted(LIBRARY.glob("*.json")):
        entry = json.loads(f.read_text(encoding="utf-8"))
        out[entry["name"]] = shape_from_config(entry["config"], entry["name"], entry["source"],
                                               max_model_len=entry.get("max_model_len"))
    return out


MODELS: dict[str, ModelShape] = _load_library()


def model_names() -> list[str]:
    return sorted(MODELS)


def with_precision(shape: ModelShape, quantization: str | None = None, kv_cache_dtype: str | None = None) -> ModelShape:
    """``shape`` served with another weight format and/or KV-cache dtype (None: keep its own)."""
    changes = {}
    if quantization is not None and quantization != shape.quantization:
        weight_format(quantization)
        changes["quantization"] = quantization
    if kv_cache_dtype is not None and kv_cache_dtype != shape.kv_cache_dtype:
        changes["kv_cache_dtype"] = kv_cache_dtype
    return replace(shape, **changes) if changes else shape
