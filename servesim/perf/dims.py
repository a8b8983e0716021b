"""Per-rank sizes of a decoder under tensor parallelism: the GEMM shapes and per-token widths that
the pack transfer (:mod:`servesim.perf.transfer`, at run time) and the offline derivation
(:mod:`servesim.tools.derive`) both scale by."""

from __future__ import annotations

from dataclasses import dataclass

from servesim.models import ModelShape


@dataclass(frozen=True)
class RankDims:
    """Per-rank sizes of one decoder under tensor parallelism (KV heads replicated when TP exceeds
    them, as vLLM does; the vocab split across ranks)."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    vocab: int
    layers: int

    @classmethod
    def of(cls, hidden: int, heads: int, kv_heads: int, head_dim: int, inter: int, vocab: int,
           layers: int, tp: int) -> "RankDims":
        return cls(hidden, max(1, heads // tp), max(1, kv_heads // tp), head_dim, inter // tp,
                   -(-vocab // tp), layers)

    @classmethod
    def of_shape(cls, shape: ModelShape, tp: int) -> "RankDims":
        return cls.of(shape.hidden_size, shape.num_heads, shape.num_kv_heads, shape.head_dim,
                      shape.intermediate_size, shape.vocab_size, shape.num_layers, tp)

    def gemm(self, op: str) -> tuple[int, int]:
        """(K, N) of a GEMM op: ``x[M, K] @ W[K, N]``."""
        h, d = self.hidden, self.head_dim
        return {"qkv_proj": (h, (self.heads + 2 * self.kv_heads) * d), "o_proj": (self.heads * d, h),
                "gate_up_proj": (h, 2 * self.inter), "down_proj": (self.inter, h),
                "lm_head": (h, self.vocab)}[op]

    def width(self, op: str) -> int:
        """Values moved per token, up to a constant per op (the transfer uses ratios only)."""
        return {"input_norm": self.hidden, "post_attn_norm": self.hidden, "final_norm": self.hidden,
                "residual_add": self.hidden, "embed": self.hidden, "act": self.inter,
                "rope": (self.heads + self.kv_heads) * self.head_dim,
                "kv_write": self.kv_heads * self.head_dim}[op]
