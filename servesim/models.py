"""Transformer model shapes and the memory they need.

A :class:`ModelShape` holds what determines the cost of serving a decoder-only model: layer count,
hidden size, attention heads (query and key/value, for grouped-query attention), head dimension,
MLP intermediate size and vocabulary. From it follow the weight bytes, the KV-cache bytes per token
and the FLOPs of every op, for any tensor-parallel degree.

Built-in shapes are copied from the models' published ``config.json`` files.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_model_len: int = 8192
    tie_word_embeddings: bool = False
    dtype_bytes: int = 2  # bf16

    # --- derived sizes -------------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def params_per_layer(self) -> int:
        h = self.hidden_size
        attn = h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h
        mlp = 3 * h * self.intermediate_size  # gated MLP: gate, up, down
        norms = 2 * h
        return attn + mlp + norms

    def num_params(self) -> int:
        emb = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else emb
        return emb + head + self.num_layers * self.params_per_layer() + self.hidden_size

    def weight_bytes(self, tp: int = 1, pp: int = 1) -> int:
        """Weight bytes held by one GPU: layers split across PP stages, matrices across TP ranks."""
        layer_bytes = self.params_per_layer() * self.dtype_bytes
        emb_bytes = self.vocab_size * self.hidden_size * self.dtype_bytes
        # Embedding on the first stage and LM head on the last; count both on the heaviest stage
        # only when there is one stage (a conservative and simple rule for pp > 1).
        edge = emb_bytes * (1 if self.tie_word_embeddings else 2) if pp == 1 else emb_bytes
        layers_here = -(-self.num_layers // pp)
        return (layers_here * layer_bytes + edge) // tp

    def kv_bytes_per_token(self, tp: int = 1, pp: int = 1) -> int:
        """KV-cache bytes one token occupies on one GPU (K and V, every layer of the stage)."""
        kv_heads_here = max(1, self.num_kv_heads // tp)  # KV heads are replicated when tp > kv heads
        layers_here = -(-self.num_layers // pp)
        return 2 * layers_here * kv_heads_here * self.head_dim * self.dtype_bytes

    def activation_bytes_per_token(self, tp: int = 1) -> int:
        """Peak activation bytes per batched token during a forward pass (one layer live at a time).

        Counts the residual stream and its normed copy, the fused QKV output, the attention output
        and the gated-MLP intermediate (gate and up, then their product), in the model dtype.
        """
        h = self.hidden_size
        per_token = 3 * h + (self.q_dim + 2 * self.kv_dim) // tp + self.q_dim // tp
        per_token += 3 * self.intermediate_size // tp
        return per_token * self.dtype_bytes


MODELS: dict[str, ModelShape] = {
    # meta-llama/Meta-Llama-3-8B config.json
    "llama-3-8b": ModelShape(
        name="llama-3-8b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
        head_dim=128, intermediate_size=14336, vocab_size=128256, max_model_len=8192,
    ),
    # Qwen/Qwen3-4B config.json (tied embeddings)
    "qwen3-4b": ModelShape(
        name="qwen3-4b", num_layers=36, hidden_size=2560, num_heads=32, num_kv_heads=8,
        head_dim=128, intermediate_size=9728, vocab_size=151936, max_model_len=32768,
        tie_word_embeddings=True,
    ),
    # Qwen/Qwen3-8B config.json
    "qwen3-8b": ModelShape(
        name="qwen3-8b", num_layers=36, hidden_size=4096, num_heads=32, num_kv_heads=8,
        head_dim=128, intermediate_size=12288, vocab_size=151936, max_model_len=32768,
    ),
    # Qwen/Qwen3-14B config.json
    "qwen3-14b": ModelShape(
        name="qwen3-14b", num_layers=40, hidden_size=5120, num_heads=40, num_kv_heads=8,
        head_dim=128, intermediate_size=17408, vocab_size=151936, max_model_len=32768,
    ),
}


def model_names() -> list[str]:
    return sorted(MODELS)
