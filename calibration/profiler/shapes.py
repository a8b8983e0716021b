"""Model shapes and what one tensor-parallel rank of them computes; pack file stems.

The shapes come from servesim's model library (``servesim/models/library/<name>.json``, the
facts of each model's Hugging Face ``config.json``), read here as plain JSON: the GPU machines
that run the profiler have PyTorch but not servesim's dependencies, and ``import servesim`` loads
them all. The keys are mapped as :func:`servesim.models.hf.shape_from_config` maps them for the
dense and Qwen3-MoE decoders profiled here; tests/test_calibration_profiler.py holds every shape
equal to servesim's ``MODELS`` and the stems equal to ``servesim.perf.pack.pack_stem``. Torch-free.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

#: servesim's model library (the repository's copy: the profiler runs from a checkout)
LIBRARY = Path(__file__).resolve().parents[2] / "servesim" / "models" / "library"
#: the library models the profiler measures packs for (``all --models`` defaults to them)
PROFILED = ("llama-3-8b", "qwen3-4b", "qwen3-8b", "qwen3-14b",
            # the 128K-context Llama (same layer shapes as llama-3-8b): long-context attention rows
            "llama-3.1-8b",
            # mixture of experts: every layer sparse, 128 experts, top-8 renormalized (Qwen3-MoE)
            "qwen3-30b-a3b",
            # multi-head attention (32 KV heads, 4x Llama-3's KV bytes per token), 4,096 tokens: the
            # model of the A100 LMDeploy / TensorRT-LLM rows, to measure on newer GPUs
            "llama-2-7b")
MOE_KEYS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size")
SHAPE_KEYS = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
              "intermediate_size", "vocab_size")


def library_shape(name: str, library: Path = LIBRARY) -> dict:
    """One library model's shape as the profiler's dict (``SHAPE_KEYS``, ``max_model_len``,
    ``tie_word_embeddings`` and, for an MoE model, ``MOE_KEYS``). Only plain GQA decoders whose
    MoE layers are all sparse: anything else is refused by name, never approximated."""
    path = library / f"{name}.json"
    entry = json.loads(path.read_text(encoding="utf-8"))
    cfg = entry["config"]
    for key in ("kv_lora_rank", "first_k_dense_replace", "n_shared_experts", "shared_expert_intermediate_size"):
        if cfg.get(key):
            raise SystemExit(f"{path}: {key} = {cfg[key]} is not profiled (dense GQA and all-sparse MoE only)")
    if cfg.get("mlp_only_layers") or (cfg.get("decoder_sparse_step") or 1) != 1:
        raise SystemExit(f"{path}: dense MLP layers among the MoE layers are not profiled")
    heads = cfg["num_attention_heads"]
    s = dict(num_layers=cfg["num_hidden_layers"], hidden_size=cfg["hidden_size"], num_heads=heads,
             num_kv_heads=cfg.get("num_key_value_heads", heads),
             head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
             intermediate_size=cfg["intermediate_size"], vocab_size=cfg["vocab_size"],
             max_model_len=entry.get("max_model_len") or cfg.get("max_position_embeddings", 8192),
             tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)))
    experts = next((cfg[k] for k in ("num_local_experts", "num_experts") if cfg.get(k)), 0)
    if experts:
        s.update(num_experts=experts, num_experts_per_tok=cfg["num_experts_per_tok"],
                 moe_intermediate_size=cfg.get("moe_intermediate_size") or cfg["intermediate_size"])
    return s


#: The profiled models' shapes, from servesim's model library.
SHAPES: dict[str, dict] = {name: library_shape(name) for name in PROFILED}
#: Tiny shapes for logic tests on CPU (not servesim models; never written as real packs).
TEST_SHAPES: dict[str, dict] = {
    "tiny": dict(num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64,
                 intermediate_size=512, vocab_size=1000, max_model_len=2048,
                 tie_word_embeddings=False),
    "tiny-tied": dict(num_layers=3, hidden_size=128, num_heads=4, num_kv_heads=4, head_dim=32,
                      intermediate_size=256, vocab_size=777, max_model_len=1024,
                      tie_word_embeddings=True),
    "tiny-moe": dict(num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64,
                     intermediate_size=512, vocab_size=1000, max_model_len=2048,
                     tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2,
                     moe_intermediate_size=64),
}
ALL_SHAPES = {**SHAPES, **TEST_SHAPES}


@dataclass(frozen=True)
class RankShape:
    """What one tensor-parallel rank computes: heads, KV heads, MLP width and vocab split by TP.

    KV heads are replicated when TP exceeds them (min 1), as vLLM does; the hidden size is not
    split (activations are full width on every rank after each all-reduce).
    """

    model: str
    tp: int
    L: int
    h: int
    H: int
    KVH: int
    D: int
    I: int  # noqa: E741 - intermediate size, the usual name
    V: int
    max_len: int
    tied: bool
    weights: str = "bf16"  # weight format of the four projection GEMMs (variants.WEIGHT_FORMATS)
    E: int = 0  # experts (0: dense MLP)
    K: int = 0  # experts per token
    MI: int = 0  # per-expert intermediate size, per rank (experts tensor-sharded, no EP)

    @classmethod
    def of(cls, model: str, tp: int, weights: str = "bf16") -> "RankShape":
        s = ALL_SHAPES[model]
        if s["num_heads"] % tp or s["intermediate_size"] % tp or s.get("moe_intermediate_size", 0) % tp:
            raise SystemExit(f"tp={tp} does not divide the heads/intermediate size of {model}")
        if weights not in PACK_WEIGHTS:
            raise SystemExit(f"--weights {weights}: packs are measured for {PACK_WEIGHTS}; time other "
                             f"formats with the `survey` mode")
        if weights != "bf16" and s.get("num_experts"):
            raise SystemExit(f"--weights {weights} with {model}: quantized experts are not measured "
                             f"(the experts' grouped GEMMs run bf16); use --weights bf16")
        return cls(model=model, tp=tp, L=s["num_layers"], h=s["hidden_size"], H=s["num_heads"] // tp,
                   KVH=max(1, s["num_kv_heads"] // tp), D=s["head_dim"],
                   I=s["intermediate_size"] // tp, V=-(-s["vocab_size"] // tp),
                   max_len=s["max_model_len"], tied=bool(s["tie_word_embeddings"]), weights=weights,
                   E=s.get("num_experts", 0), K=s.get("num_experts_per_tok", 0),
                   MI=s.get("moe_intermediate_size", 0) // tp)

    @property
    def moe(self) -> bool:
        return self.E > 0

    @property
    def stem(self) -> str:
        return pack_stem(self.model, self.tp, self.weights)

    def moe_shape(self):
        from .variants import MoEShape  # torch: loaded by the modes that measure

        return MoEShape(self.E, self.K, self.MI, self.h)

    def linear(self, w):
        """A projection weight as the forward multiplies it: the bf16 tensor itself, or a
        quantized linear (variants.QLinear) for --weights fp8 / fp8_static."""
        from .variants import QLinear  # torch: loaded by the modes that measure

        return w if self.weights == "bf16" else QLinear(w, self.weights)

    @property
    def act_fp8(self) -> bool:
        """Whether the ops before a projection write e4m3 (static activation scales: the
        quantization is upstream of the linear, variants.py ``fp8_static``)."""
        return self.weights == "fp8_static"

    @property
    def qkv_out(self) -> int:
        return (self.H + 2 * self.KVH) * self.D

    def as_dict(self) -> dict:
        d = dict(num_layers=self.L, hidden_size=self.h, num_heads=self.H, num_kv_heads=self.KVH,
                 head_dim=self.D, intermediate_size=self.I, vocab_size=self.V)
        if self.moe:
            d.update(num_experts=self.E, num_experts_per_tok=self.K, moe_intermediate_size=self.MI)
        return d


#: weight formats a pack can be measured in (the stem's quantization suffix: servesim's
#: ``model.quantization`` name); other formats are timed by ``survey`` only
PACK_WEIGHTS = ("bf16", "fp8", "fp8_static")


def pack_stem(model: str, tp: int, weights: str = "bf16") -> str:
    """``<model>[-<quantization>][-tp<N>]`` (calibration/PACK_FORMAT.md)."""
    q = "" if weights == "bf16" else f"-{weights}"
    return f"{model}{q}" if tp == 1 else f"{model}{q}-tp{tp}"


def stem_tp(stem: str) -> int:
    head, sep, tail = stem.rpartition("-tp")
    return int(tail) if sep and tail.isdigit() else 1

