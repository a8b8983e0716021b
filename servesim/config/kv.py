"""Config models of the KV side: allocator details, eviction, preload, lower tiers.

Scenario shape (the switches live in ``engine`` under vLLM's names; details in ``engine.kv``)::

    engine:
      kv_allocator: paged | static | elastic      # default paged
      enable_prefix_caching: true                  # vLLM's flag; paged only
      prefix_cache_eviction: lru | priority | sglang   # default lru (vLLM); sglang: radix-tree leaves
      kv:
        static:  {reserve: max_model_len | request, fit: first | best}
        elastic: {base_tokens: 1024, growth_tokens: 256}
        protect_share: [1.0]                       # priority eviction: per-class protected share
        preload: {min_hits: 4, window_s: 60, max_share: 0.1}
        hash_outputs: true                         # cache session turns' output blocks
    kv_tiers:                                      # below the GPU pool, in order (L2, then L3)
      - {kind: cpu, capacity_gib: 256}             # bandwidth: the GPU's PCIe link by default
      - {kind: remote, capacity_gib: 2048, bandwidth_gb_s: 12.5, latency_s: 0.001}

Frozen, ``extra="forbid"``, validated when built; messages name the value and the allowed range.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from servesim.fields import NUM_CLASSES, GiB, Seconds, Share, Share0, StrictModel


_Frozen = StrictModel  # frozen, unknown fields refused, strict types, finite floats


class StaticKVConfig(_Frozen):
    """``reserve``: slots each admitted request reserves (``max_model_len``: the engine limit;
    ``request``: its prompt + output). ``fit``: hole choice (``first``: lowest address; ``best``:
    smallest hole that fits)."""

    reserve: Literal["max_model_len", "request"] = "max_model_len"
    fit: Literal["first", "best"] = "first"


class ElasticKVConfig(_Frozen):
    """Base reservation per sequence and growth step, in tokens (rounded up to whole blocks)."""

    base_tokens: int = 1024
    growth_tokens: int = 256

    @field_validator("base_tokens", "growth_tokens")
    @classmethod
    def _tokens(cls, v: int, info) -> int:
        if not 1 <= v <= 1 << 22:
            raise ValueError(f"{info.field_name} {v} must be between 1 and {1 << 22} tokens")
        return v


class PreloadConfig(_Frozen):
    """Hot-prefix preload: a block looked up by at least ``min_hits`` requests in the last
    ``window_s`` seconds is kept resident in L1 (up to ``max_share`` of the GPU blocks)."""

    min_hits: int = 4
    window_s: Seconds = 60.0
    max_share: Share = 0.1

    @field_validator("min_hits")
    @classmethod
    def _hits(cls, v: int) -> int:
        if not 1 <= v <= 1_000_000:
            raise ValueError(f"min_hits {v} must be between 1 and 1000000")
        return v


class KVConfig(_Frozen):
    static: StaticKVConfig = StaticKVConfig()
    elastic: ElasticKVConfig = ElasticKVConfig()
    # priority eviction: share of the GPU blocks protected per class P0..P4 ([1.0]: pin P0)
    protect_share: list[Share0] = [1.0]
    preload: PreloadConfig | None = None
    hash_outputs: bool = True

    @field_validator("protect_share")
    @classmethod
    def _protect(cls, v: list[float]) -> list[float]:
        if len(v) > NUM_CLASSES:
            raise ValueError(f"protect_share has {len(v)} entries; at most {NUM_CLASSES} (P0..P4)")
        for i, x in enumerate(v):
            if not 0.0 <= x <= 1.0:
                raise ValueError(f"protect_share[{i}] = {x} must be between 0 and 1")
        return v

    def protect_note(self) -> tuple[str, ...]:
        """A warning when the quotas add up to more than the pool: they cannot all hold at once
        (it was accepted with no word); the drain order still protects P0's first."""
        total = sum(self.protect_share)
        if total <= 1.0 + 1e-9:
            return ()
        return (f"warning: engine.kv.protect_share {self.protect_share} sums to {total:g}: the quotas are shares "
                f"of one GPU pool and cannot all hold at once (when they compete, a lower class's quota is "
                f"drained first); shares summing to at most 1 each hold",)


# the registry of tier kinds: a kind's name and its typical figures (set your own); the kind
# Literal below and the test strategies read it
TIER_DEFAULTS = {
    "cpu": {"latency_s": 10e-6},  # bandwidth: the GPU's PCIe figure (servesim.hardware)
    "remote": {"bandwidth_gb_s": 12.5, "latency_s": 1e-3},  # a 100 Gb/s NIC, a store round trip
}


class TierConfig(_Frozen):
    """One lower tier. ``capacity_gib`` is the tier's size for the whole replica (all its GPUs'
    KV slices); ``bandwidth_gb_s`` (GB/s, 1e9 bytes) and ``latency_s`` describe the link from one
    GPU to it; ``channels`` transfers may run on it at once. ``shared_link``: in a fleet, every
    replica reaches this tier over the same link (a cluster-wide L3 such as Halo's Redis): one
    contended resource whose ``channels`` serve all replicas' fetches first come first served
    (kv/ptiers.py); each replica still holds its own copy of the tier's contents."""

    kind: Literal[tuple(TIER_DEFAULTS)]  # type: ignore[valid-type]
    name: str | None = None
    capacity_gib: GiB
    bandwidth_gb_s: float | None = None
    latency_s: float | None = None
    channels: Annotated[int, Field(ge=1, le=1024)] = 1
    shared_link: bool = False

    @field_validator("bandwidth_gb_s")
    @classmethod
    def _bandwidth(cls, v: float | None) -> float | None:
        if v is not None and not 0 < v <= 1e4:
            raise ValueError(f"bandwidth_gb_s {v} must be > 0 and <= 10000 GB/s")
        return v

    @field_validator("latency_s")
    @classmethod
    def _latency(cls, v: float | None) -> float | None:
        if v is not None and not 0 <= v <= 60:
            raise ValueError(f"latency_s {v} must be between 0 and 60 seconds")
        return v

    def resolved(self, pcie_bytes_per_s: float) -> tuple[float, float]:
        """(bandwidth in bytes/s, latency in s) with the defaults filled in."""
        d = TIER_DEFAULTS[self.kind]
        bw = self.bandwidth_gb_s * 1e9 if self.bandwidth_gb_s is not None else d.get("bandwidth_gb_s", 0) * 1e9
        if self.bandwidth_gb_s is None and self.kind == "cpu":
            bw = pcie_bytes_per_s
        lat = self.latency_s if self.latency_s is not None else d["latency_s"]
        return bw, lat
