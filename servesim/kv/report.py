"""From KV manager counters and fragmentation samples to the ``"kv"`` entries of ``summary.json``.

::

    "kv": {
      "internal_fragmentation": {"mean", "peak"},   # shares of the pool, see servesim.kv.frag
      "reservation_waste":      {"mean", "peak"},
      "external_fragmentation": {"mean", "peak"},
      "utilization":            {"mean", "peak"},
      "prefix_hit_rate": {"tokens", "blocks", "by_class": {"P0": {"tokens", "blocks"}, ...}},
      "prefix_cache": {"query_tokens", "hit_tokens", "query_blocks", "hit_blocks", "evictions",
                       "stale_hits", "cached_blocks"},
      "ttft_effect": {"with_hit": {"requests", "mean_s", "p50_s", "p99_s"}, "without_hit": {...}},
      "tiers": {"L1": {"hit_blocks", "hit_rate", "by_class"},
                "L2": {... , "capacity_blocks", "blocks", "bytes_fetched", "bytes_stored",
                       "fetches", "stores", "busy_s", "queue_s", "evicted", "preloaded",
                       "bytes_fetched_by_class"},
                "fetch_wait_s": {"total", "mean", "by_class"}, "dropped_blocks"}
    }

Hit rates follow vLLM's prefix-cache metric: hit tokens / looked-up tokens (the known tokens of
each request when it is admitted with a lookup), and the same in blocks (looked-up blocks: the
chain blocks a lookup may match). A tier's ``hit_rate`` is its hit blocks over looked-up blocks,
so the tiers' rates add up to the block hit rate. Rates are ``None`` when nothing was looked up.
A tier's ``stores`` counts blocks written down to it (``bytes_stored`` their bytes).
"""

from __future__ import annotations

import numpy as np

from servesim.request import CLASS_NAMES, NUM_CLASSES


def _rate(hit, query) -> float | None:
    return float(hit) / float(query) if query else None


def fetch_wait_entry(wait_s: np.ndarray, waits: np.ndarray) -> dict:
    """``tiers.fetch_wait_s``: seconds waited for tier fetches per class (``wait_s``) over the
    fetches waited for (``waits``): total, mean, and mean by class (one engine's, or a fleet's
    summed counters)."""
    return {"total": float(wait_s.sum()), "mean": float(wait_s.sum() / waits.sum()) if waits.sum() else None,
            "by_class": {CLASS_NAMES[g]: float(wait_s[g] / waits[g]) for g in range(NUM_CLASSES) if waits[g]}}


def kv_report(kv, ttft: np.ndarray | None = None) -> dict:
    """The ``"kv"`` entries of a prefix-caching manager (hit rates, tier traffic, TTFT effect) to
    merge into the summary's ``"kv"`` dict; fragmentation comes from the engine's recorder.
    ``ttft``: per-request TTFT in seconds indexed by request id (NaN: not measured)."""
    out: dict = {}
    if kv.prefix_caching:
        out.update(prefix_report(kv, ttft))
    return out


def prefix_report(kv, ttft: np.ndarray | None = None) -> dict:
    by_class = {}
    for g in range(NUM_CLASSES):
        if kv.query_tokens[g]:
            by_class[CLASS_NAMES[g]] = {"tokens": _rate(kv.hit_tokens[g], kv.query_tokens[g]),
                                        "blocks": _rate(kv.hit_blocks[g], kv.query_blocks[g])}
    qt, ht = int(kv.query_tokens.sum()), int(kv.hit_tokens.sum())
    qb, hb = int(kv.query_blocks.sum()), int(kv.hit_blocks.sum())
    out = {
        "prefix_hit_rate": {"tokens": _rate(ht, qt), "blocks": _rate(hb, qb), "by_class": by_class},
        "prefix_cache": {"query_tokens": qt, "hit_tokens": ht, "query_blocks": qb, "hit_blocks": hb,
                         "evictions": int(kv.evictions), "stale_hits": int(kv.stale_hits),
                         "cached_blocks": kv.cached_blocks()},
        "tiers": tier_report(kv),
    }
    if ttft is not None:
        out["ttft_effect"] = ttft_effect(np.asarray(ttft, dtype=np.float64), kv.hit_tokens_of)
    return out


def tier_report(kv) -> dict:
    qb = kv.query_blocks
    names = ["L1"] + ([t.name for t in kv.tiers.tiers] if kv.tiers is not None else [])
    out: dict = {}
    for i, name in enumerate(names):
        hits = kv.tier_hit_blocks[i]
        entry = {
            "hit_blocks": int(hits.sum()),
            "hit_rate": _rate(hits.sum(), qb.sum()),
            "by_class": {CLASS_NAMES[g]: _rate(hits[g], qb[g]) for g in range(NUM_CLASSES) if qb[g]},
        }
        if i > 0:
            t = kv.tiers.tiers[i - 1]
            ln = t.link
            entry.update({
                "capacity_blocks": t.capacity, "blocks": len(t), "bytes_fetched": ln.bytes_up,
                "bytes_stored": ln.bytes_down, "fetches": ln.fetches, "stores": ln.stores,
                "busy_s": ln.busy_s, "queue_s": ln.queue_s, "evicted": t.stats.evicted,
                "preloaded": t.stats.preloaded,
                "bytes_fetched_by_class": {CLASS_NAMES[g]: int(hits[g]) * kv.tiers.block_bytes
                                           for g in range(NUM_CLASSES) if hits[g]},
            })
        out[name] = entry
    out["fetch_wait_s"] = fetch_wait_entry(kv.fetch_wait_s, kv.fetch_waits)
    out["dropped_blocks"] = int(kv.tiers.dropped) if kv.tiers is not None else 0
    return out


def ttft_effect(ttft: np.ndarray, hit_tokens: np.ndarray) -> dict:
    """TTFT of measured requests whose (last) admission reused cached tokens vs. the rest."""
    ok = ~np.isnan(ttft)
    out = {}
    for name, sel in (("with_hit", ok & (hit_tokens > 0)), ("without_hit", ok & (hit_tokens == 0))):
        x = ttft[sel]
        out[name] = {"requests": int(len(x)),
                     "mean_s": float(x.mean()) if len(x) else None,
                     "p50_s": float(np.percentile(x, 50)) if len(x) else None,
                     "p99_s": float(np.percentile(x, 99)) if len(x) else None}
    return out
