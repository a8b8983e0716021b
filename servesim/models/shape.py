"""Transformer model shapes and the memory they need.

A :class:`ModelShape` holds what determines the cost of serving a decoder-only model: layer count,
hidden size, attention heads (query and key/value, for grouped-query attention), head dimension,
MLP intermediate size and vocabulary; for a mixture-of-experts model its experts (count, top-k,
expert and shared-expert sizes, dense first layers); for multi-head latent attention (MLA,
DeepSeek) its compressed-KV ranks; its sliding-window layers; and the precision it is served in
(``quantization``, ``kv_cache_dtype``, vLLM's names: :mod:`servesim.models.precision`). From it
follow the parameter counts, the weight bytes, the KV-cache bytes per token and the per-token
activation bytes, for any tensor-/pipeline-parallel degree.

Parameter counting (per decoder layer; the numbers a planner checks against a model card)::

    attention (GQA)   h (q + 2 kv) + q h            (+ q + 2 kv biases where attention_bias)
    attention (MLA)   q: h rq + rq + rq H (dn + dr)  (or h H (dn + dr) without a q rank)
                      kv: h (rkv + dr) + rkv + rkv H (dn + dv);   o: H dv h
    dense MLP         3 h I                          (gate, up, down)
    MoE MLP           E 3 h Ie + 3 h Is + h E        (routed experts, shared experts, router)
    norms             2 h

Weights: the linear layers of every decoder layer take the quantized bytes per parameter (only
the experts for ``mxfp4``, as gpt-oss ships it); embeddings, LM head, norms, biases and the router
stay in the model dtype, as vLLM loads them. KV cache: MLA keeps one compressed latent of
``kv_lora_rank + qk_rope_head_dim`` values per token and layer, the same on every TP rank (vLLM
does not shard it); GQA keeps K and V of ``num_kv_heads / tp`` heads. Sliding-window layers are
counted like full-attention layers (vLLM's behaviour without its hybrid KV-cache manager: a
conservative plan; docs/models.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from servesim.models.precision import kv_dtype_bytes, weight_format


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
    dtype_bytes: int = 2  # bf16 / fp16: activations, and weights unless quantized
    attention_bias: bool = False  # q, k, v projections carry biases (Qwen2, gpt-oss)
    # mixture of experts (num_experts 0: a dense model)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0  # one routed expert's intermediate size
    shared_expert_intermediate_size: int = 0  # all shared experts together (DeepSeek, Qwen2-MoE)
    num_dense_layers: int = 0  # layers with a dense MLP of intermediate_size (DeepSeek first_k_dense_replace)
    # multi-head latent attention (kv_lora_rank 0: none)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # sliding-window attention
    sliding_window: int = 0
    num_sliding_layers: int = 0
    # precision (vLLM --quantization / --kv-cache-dtype)
    quantization: str = "none"
    kv_cache_dtype: str = "auto"
    source: str = ""  # where the numbers come from (a config.json's address or path)

    # --- kinds ---------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def kind(self) -> str:
        parts = ["MoE" if self.is_moe else "dense"]
        if self.is_mla:
            parts.append("MLA")
        if self.num_sliding_layers:
            parts.append(f"{self.num_sliding_layers} sliding-window layers")
        return ", ".join(parts)

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    # --- derived sizes -------------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        if self.is_mla:
            return self.num_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def o_dim(self) -> int:
        """Width of the attention output (the o projection's input)."""
        return self.num_heads * self.v_head_dim if self.is_mla else self.q_dim

    def attention_linear_params(self) -> int:
        h = self.hidden_size
        if self.is_mla:
            dq = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (h * self.q_lora_rank + self.q_lora_rank * self.num_heads * dq if self.q_lora_rank
                 else h * self.num_heads * dq)
            kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + \
                self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim)
            return q + kv + self.o_dim * h
        return h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h

    def attention_other_params(self) -> int:
        """Biases and the MLA latent norms (kept in the model dtype)."""
        if self.is_mla:
            return self.q_lora_rank + self.kv_lora_rank
        return (self.q_dim + 2 * self.kv_dim) if self.attention_bias else 0

    def expert_params(self) -> int:
        """One routed expert (gate, up, down)."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    def _layer_parts(self, moe: bool) -> tuple[int, int, int]:
        """(linear params that take the quantized format, of which routed-expert params, other
        params kept in the model dtype) of one dense or MoE layer."""
        h = self.hidden_size
        attn = self.attention_linear_params()
        other = 2 * h + self.attention_other_params()
        if not moe:
            return attn + 3 * h * self.intermediate_size, 0, other
        experts = self.num_experts * self.expert_params()
        shared = 3 * h * self.shared_expert_intermediate_size
        return attn + experts + shared, experts, other + h * self.num_experts

    def params_per_layer(self, moe: bool | None = None) -> int:
        """Parameters of one layer (``moe``: of an MoE layer; default: the model's kind)."""
        lin, _, other = self._layer_parts(self.is_moe if moe is None else moe)
        return lin + other

    def num_params(self) -> int:
        emb = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else emb
        layers = (self.num_layers - self.num_moe_layers) * self.params_per_layer(False) + \
            self.num_moe_layers * self.params_per_layer(True)
        return emb + head + layers + self.hidden_size

    def active_params(self) -> int:
        """Parameters one token's forward pass uses: all but the routed experts it is not sent to
        and the input embedding table (a row lookup; counted when tied to the LM head)."""
        idle = self.num_moe_layers * (self.num_experts - self.num_experts_per_tok) * self.expert_params()
        emb = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return self.num_params() - idle - emb

    # --- memory --------------------------------------------------------------------------
    def _layer_bytes(self, moe: bool) -> int:
        fmt = weight_format(self.quantization)
        lin, experts, other = self._layer_parts(moe)
        if fmt.experts_only:
            q, plain = experts, lin - experts + other
        else:
            q, plain = lin, other
        wb = fmt.bytes_per_param if fmt.bytes_per_param is not None else self.dtype_bytes
        return int(round(q * wb)) + plain * self.dtype_bytes

    def weight_bytes(self, tp: int = 1, pp: int = 1) -> int:
        """Weight bytes held by one GPU: layers split across PP stages, matrices (and experts)
        across the TP ranks of a stage (with expert parallelism the experts are split whole across
        the same GPUs: the same bytes)."""
        layer_bytes = self._layer_bytes(self.is_moe)
        if self.is_moe and self.num_dense_layers:
            layer_bytes = max(layer_bytes, self._layer_bytes(False))  # the heaviest layer kind
        emb_bytes = self.vocab_size * self.hidden_size * self.dtype_bytes
        # Embedding on the first stage and LM head on the last; count both on the heaviest stage
        # only when there is one stage (a conservative and simple rule for pp > 1).
        edge = emb_bytes * (1 if self.tie_word_embeddings else 2) if pp == 1 else emb_bytes
        layers_here = -(-self.num_layers // pp)
        if pp == 1 and self.is_moe and self.num_dense_layers:
            total = (self.num_moe_layers * self._layer_bytes(True)
                     + self.num_dense_layers * self._layer_bytes(False))
            return (total + edge) // tp
        return (layers_here * layer_bytes + edge) // tp

    @property
    def kv_dtype_bytes(self) -> int:
        return kv_dtype_bytes(self.kv_cache_dtype, self.dtype_bytes)

    def kv_values_per_token_layer(self, tp: int = 1) -> int:
        """KV-cache values one token keeps per layer on one GPU."""
        if self.is_mla:  # one compressed latent + the rope key, replicated on every TP rank
            return self.kv_lora_rank + self.qk_rope_head_dim
        kv_heads_here = max(1, self.num_kv_heads // tp)  # KV heads are replicated when tp > kv heads
        return 2 * kv_heads_here * self.head_dim

    def kv_bytes_per_token(self, tp: int = 1, pp: int = 1) -> int:
        """KV-cache bytes one token occupies on one GPU (every layer of the stage)."""
        layers_here = -(-self.num_layers // pp)
        return layers_here * self.kv_values_per_token_layer(tp) * self.kv_dtype_bytes

    def mlp_width(self) -> int:
        """Intermediate values per token of the widest MLP (dense, or the routed top-k plus shared)."""
        if not self.is_moe:
            return self.intermediate_size
        moe = self.num_experts_per_tok * self.moe_intermediate_size + self.shared_expert_intermediate_size
        return max(moe, self.intermediate_size if self.num_dense_layers else 0)

    def activation_bytes_per_token(self, tp: int = 1) -> int:
        """Peak activation bytes per batched token during a forward pass (one layer live at a time).

        Counts the residual stream and its normed copy, the fused QKV output, the attention output
        and the gated-MLP intermediate (gate and up, then their product), in the model dtype.
        """
        h = self.hidden_size
        if self.is_mla:
            per_token = 3 * h + self.q_dim // tp + self.kv_lora_rank + self.qk_rope_head_dim + self.o_dim // tp
        else:
            per_token = 3 * h + (self.q_dim + 2 * self.kv_dim) // tp + self.q_dim // tp
        per_token += 3 * self.mlp_width() // tp
        return per_token * self.dtype_bytes

    def unlike_bf16_packs(self) -> str | None:
        """What a bf16 dense-decoder calibration pack cannot price about this model (None: nothing):
        its weight format, KV dtype, experts or latent attention."""
        what = [x for x in (f"weights {self.quantization}" if self.quantization != "none" else "",
                            f"KV cache {self.kv_cache_dtype}" if self.kv_cache_dtype != "auto" else "",
                            "mixture of experts" if self.is_moe else "",
                            "latent attention (MLA)" if self.is_mla else "") if x]
        return ", ".join(what) if what else None

    # --- reporting -------------------------------------------------------------------------
    def summary(self, tp: int = 1, pp: int = 1) -> dict:
        """The model's entry of summary.json: what it is, its size and its KV footprint."""
        return {
            "name": self.name, "kind": self.kind, "source": self.source,
            "params": self.num_params(), "active_params": self.active_params(),
            "quantization": self.quantization, "kv_cache_dtype": self.kv_cache_dtype,
            "kv_bytes_per_token": self.kv_bytes_per_token(),  # whole model, all layers
            "kv_bytes_per_token_per_gpu": self.kv_bytes_per_token(tp, pp),
            "weight_bytes_per_gpu": self.weight_bytes(tp, pp),
        }

    def headline(self) -> str:
        """One line for a run's header."""
        moe = (f", {self.num_experts} experts top-{self.num_experts_per_tok}" if self.is_moe else "")
        return (f"{self.name} ({self.kind}{moe}): {self.num_layers} layers, hidden {self.hidden_size}, heads "
                f"{self.num_heads}/{self.num_kv_heads} kv, {self.num_params() / 1e9:.2f} B params, "
                f"{self.active_params() / 1e9:.2f} B active per token; weights {self.quantization}, "
                f"KV {self.kv_cache_dtype} {self.kv_bytes_per_token():,} bytes/token")
