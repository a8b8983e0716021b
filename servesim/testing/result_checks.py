"""Checks of a finished run's Result and of a KV tier stack, from their own numbers: counts,
percentiles, fragmentation shares, tier conservation. :class:`~servesim.testing.checker.Checker`
runs them at the end of a watched run; each is public (``servesim.testing``) for a user's own
tests of a Result.
"""

from __future__ import annotations

import numpy as np

from servesim.request import FINISHED, REJECTED, RUNNING, WAITING
from servesim.testing.invariants import InvariantViolation


def check_tiers(stack, now: float | None = None) -> None:
    """kv_conserved / kv_capacity of a tier stack (the reference object's, tests/reference_kv/tiers.py), recomputed from its
    counters: what L1 sent down is stored or refreshed in L2, what L2 evicted goes to L3, what
    the last tier evicted is dropped; a tier holds stored - evicted blocks, at most its capacity."""
    sent = int(stack.demoted)
    for tier in stack.tiers:
        s = tier.stats
        if s.inserted + s.refreshed != sent:
            raise InvariantViolation("kv_conserved", f"tier {tier.name}: {sent} blocks sent down but "
                                     f"{s.inserted} stored + {s.refreshed} refreshed", now)
        if s.inserted - s.evicted != len(tier.blocks):
            raise InvariantViolation("kv_conserved", f"tier {tier.name}: {s.inserted} stored - {s.evicted} "
                                     f"evicted != {len(tier.blocks)} held", now)
        if len(tier.blocks) > tier.capacity:
            raise InvariantViolation("kv_capacity", f"tier {tier.name} holds {len(tier.blocks)} blocks, "
                                     f"capacity {tier.capacity}", now)
        sent = int(s.evicted)
    if sent != int(stack.dropped):
        raise InvariantViolation("kv_conserved", f"the last tier evicted {sent} blocks but {stack.dropped} "
                                 f"were dropped", now)


def check_counts(result) -> None:
    """arrivals_accounted on a finished run: the summary's counts are the table's."""
    t, r = result.table, result.summary["requests"]
    counts = np.bincount(t.status, minlength=5)
    fin, rej = int(counts[FINISHED]), int(counts[REJECTED])
    flight = int(counts[WAITING] + counts[RUNNING])
    if (r["completed"], r["rejected"], r["in_flight"]) != (fin, rej, flight):
        raise InvariantViolation("arrivals_accounted", f"summary says {r['completed']} completed, "
                                 f"{r['rejected']} rejected, {r['in_flight']} in flight; the requests say "
                                 f"{fin}, {rej}, {flight}")
    if r["arrived"] != fin + rej + flight:
        raise InvariantViolation("arrivals_accounted", f"summary: arrived {r['arrived']} != completed "
                                 f"{fin} + rejected {rej} + in flight {flight}")


PCT_ORDER = ("p50", "p90", "p95", "p99", "p999", "max")


def _latency_blocks(summary: dict):
    yield "latency_s", summary.get("latency_s", {})
    for cls, part in (summary.get("by_class") or {}).items():
        yield f"by_class.{cls}.latency_s", part.get("latency_s", {})


def check_percentiles(summary: dict) -> None:
    """percentiles_monotone over every latency block of a summary."""
    for where, block in _latency_blocks(summary):
        for metric, d in block.items():
            vals = [(k, d.get(k)) for k in PCT_ORDER if d.get(k) is not None]
            path = f"{where}.{metric}"
            for (ka, a), (kb, b) in zip(vals, vals[1:]):
                if not a <= b:
                    raise InvariantViolation("percentiles_monotone", f"{path}: {ka} {a!r} > {kb} {b!r}")
            if vals and not vals[0][1] >= 0:
                raise InvariantViolation("percentiles_monotone", f"{path}: {vals[0][0]} {vals[0][1]!r} < 0")
            mean, top = d.get("mean"), d.get("max")
            if mean is not None and top is not None and not mean <= top * (1 + 1e-12) + 1e-15:
                raise InvariantViolation("percentiles_monotone", f"{path}: mean {mean!r} > max {top!r}")


FRAG_KEYS = ("utilization", "internal_fragmentation", "reservation_waste", "external_fragmentation")


def check_fragmentation(result) -> None:
    """fragmentation_bounded: summary KV shares and every time bin's in [0, 1]."""
    kv = result.summary.get("kv", {})

    def bounded(path, v):
        if v is not None and not (-1e-12 <= v <= 1 + 1e-12):
            raise InvariantViolation("fragmentation_bounded", f"{path} = {v!r} is outside [0, 1]")

    for key in FRAG_KEYS:
        for stat, v in (kv.get(key) or {}).items():
            bounded(f"kv.{key}.{stat}", v)
    for key in ("peak_usage", "mean_usage"):
        bounded(f"kv.{key}", kv.get(key))
    for key, v in (kv.get("of_allocated") or {}).items():
        bounded(f"kv.of_allocated.{key}", v)
    from servesim.metrics.summary import timeseries_columns

    cols = timeseries_columns(result.recorder, result.memory.num_blocks, result.scenario.engine.block_size)
    for name, col in cols.items():
        if name.startswith("kv_") and name != "kv_blocks_mean" and name != "kv_blocks_peak":
            vals = col[~np.isnan(col)]
            if len(vals) and not ((vals >= -1e-12) & (vals <= 1 + 1e-12)).all():
                bad = vals[(vals < -1e-12) | (vals > 1 + 1e-12)][0]
                raise InvariantViolation("fragmentation_bounded", f"time series {name} has {float(bad)!r}")
