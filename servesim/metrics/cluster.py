"""A fleet's results: fleet-wide recorder, client-side times, the summary's ``cluster`` block.

Fleet-wide latency blocks come from the shared request table (every request, whichever replica
served it). The engines' recorders are merged for the fleet-wide ``engine``, ``kv`` and time
series: counts and time integrals add up exactly (KV token slots count with each engine's own
block size: metrics/summary.py ``pool_slots``); a bin's peak is the sum of the engines' peaks
in that bin (an upper bound of the fleet's instantaneous peak: the engines peak at different
instants of the bin); inter-token gaps are pooled. ``engine.busy_fraction`` of a fleet is the
mean over engines.

``cluster`` (summary.json)::

    "cluster": {
      "replicas": 24, "router": "least-tokens", "router_overhead_s": 0.0, "network_delay_s": 0.0,
      "servers_used": 3,
      "per_replica": [{"replica", "group", "gpu", "tp", "pp", "servers", "requests", "completed",
                       "rejected", "busy_share", "mean_batch", "kv_peak", "kv_mean",
                       "tokens", "prefix_hit_rate"?}, ...],
      "balance": {"requests": {"max", "mean", "max_over_mean", "cv"}, "busy_share": {...},
                  "tokens": {...}},
      "affinity": {"hits", "overflows"}?    (the affinity router)
      "cache_aware": {"cache_routed", "below_threshold", "unbalanced", "matched_token_share"}?
                                            (the cache-aware router: engine/prefix_router.py)
    }

Per replica: ``requests`` routed to it; ``busy_share`` its GPUs' busy time over the run (a
pipeline replica: the mean over its virtual engines -- the stage utilization of an ideal
pipeline); ``mean_batch`` running requests per iteration; ``kv_peak`` / ``kv_mean`` its KV
blocks in use over its blocks (a pipeline replica: the worst virtual engine's peak);
``tokens`` prompt + output tokens of the requests it completed.
"""

from __future__ import annotations

import numpy as np

from servesim.metrics.collect import BinnedSeries, Recorder
from servesim.request import FINISHED, REJECTED


def merge_recorders(recs: list[Recorder]) -> Recorder:
    """One recorder holding every engine's: sums, pooled inter-token gaps, summed time bins."""
    for r in recs:
        r.flush()
    out = Recorder(recs[0].series.bin_s if recs else 1.0)
    out.itl_from = min((r.itl_from for r in recs), default=0.0)
    bin_s = max(r.series.bin_s for r in recs)
    series = BinnedSeries(recs[0].series.bin_s, recs[0].series.max_bins)
    while series.bin_s < bin_s:
        series._coarsen()
    width = 0
    parts = []
    for r in recs:
        out.iterations += r.iterations
        out.busy_s += r.busy_s
        out.batch_seqs_sum += r.batch_seqs_sum
        out.batch_tokens_sum += r.batch_tokens_sum
        out.cpu_s += r.cpu_s
        out.extra_s += r.extra_s
        out.swap_outs += r.swap_outs
        for v, w in r.itl.parts():
            out.itl.add(np.asarray(v), np.asarray(w))
        s = r.series
        integ, peak = s.integral, s.peak
        b = s.bin_s
        while b < bin_s:  # coarsen a copy to the common width (integrals add, peaks max)
            cap = integ.shape[1] + integ.shape[1] % 2
            pad = lambda a: np.concatenate([a, np.zeros((a.shape[0], cap - a.shape[1]))], axis=1)  # noqa: E731
            integ, peak = pad(integ), pad(peak)
            integ = integ[:, 0::2] + integ[:, 1::2]
            peak = np.maximum(peak[:, 0::2], peak[:, 1::2])
            b *= 2
        parts.append((integ, peak))
        width = max(width, integ.shape[1])
        series.t_end = max(series.t_end, s.t_end)
    series.integral = np.zeros((len(BinnedSeries.SIGNALS), max(width, 1)))
    series.peak = np.zeros_like(series.integral)
    for integ, peak in parts:
        series.integral[:, : integ.shape[1]] += integ
        series.peak[:, : peak.shape[1]] += peak
    series._cap = series.integral.shape[1]
    out.series = series
    return out


def restore_client_times(table, delay_in: float, delay_out: float) -> None:
    """Requests reached their replica ``delay_in`` after their client sent them (and after their
    wait for an API server: ``table.api_queue``, engine/api_queue.py), and tokens reach clients
    ``delay_out`` after the replica made them: the table gets the client's times."""
    if table.api_queue is not None:
        table.arrival = table.api_queue.client_arrivals(table.arrival, delay_in)
    elif delay_in:
        table.arrival = table.arrival - delay_in
    if delay_out:
        for name in ("t_first_token", "t_last_token", "t_finish"):
            setattr(table, name, getattr(table, name) + delay_out)


def _spread(x: np.ndarray) -> dict:
    x = np.asarray(x, dtype=np.float64)
    mean = float(x.mean()) if len(x) else 0.0
    return {"max": float(x.max()) if len(x) else 0.0, "mean": mean,
            "max_over_mean": float(x.max() / mean) if mean > 0 else None,
            "cv": float(x.std() / mean) if mean > 0 else None}


def cluster_summary(sc, fleet, engines, replicas, table, sim_time: float) -> dict:
    """The ``cluster`` block (module docstring)."""
    t = max(sim_time, 1e-300)
    rep_of = fleet.replica_of
    n_rep = len(replicas)
    routed = np.bincount(rep_of[rep_of >= 0], minlength=n_rep)
    done = table.status == FINISHED
    completed = np.bincount(rep_of[done & (rep_of >= 0)], minlength=n_rep)
    rejected = np.bincount(rep_of[(table.status == REJECTED) & (rep_of >= 0)], minlength=n_rep)
    work = (table.prompt.astype(np.int64) + table.output.astype(np.int64))
    tokens = np.bincount(rep_of[done & (rep_of >= 0)], weights=work[done & (rep_of >= 0)], minlength=n_rep)
    rows = []
    busy = np.zeros(n_rep)
    for r, info in enumerate(replicas):
        es = [engines[i] for i in info.engines]
        recs = [e.recorder for e in es]
        for rec in recs:
            rec.flush()
        iters = sum(x.iterations for x in recs)
        busy[r] = sum(x.busy_s for x in recs) / t / len(recs)
        peaks, integ = [], 0.0
        blocks = sum(e.plan.num_blocks for e in es)
        for e, rec in zip(es, recs):
            s = rec.series
            nb = s.nbins()
            peaks.append(float(s.peak[0, :nb].max() / e.plan.num_blocks) if nb else 0.0)
            integ += float(s.integral[0, :nb].sum())
        row = {
            "replica": r, "group": info.group, "gpu": info.gpu, "tp": info.tp, "pp": info.pp,
            "servers": list(info.servers), "requests": int(routed[r]), "completed": int(completed[r]),
            "rejected": int(rejected[r]), "busy_share": float(busy[r]),
            "mean_batch": float(sum(x.batch_seqs_sum for x in recs) / iters) if iters else 0.0,
            "kv_blocks": int(blocks), "kv_peak": max(peaks), "kv_mean": integ / t / blocks,
            "tokens": int(tokens[r]),
        }
        hit = _prefix_hits([e.kv for e in es])
        if hit is not None:
            row["prefix_hit_rate"] = hit
        rows.append(row)
    c = sc.cluster
    out = {
        "replicas": n_rep, "engines": len(engines), "router": c.router,
        "router_overhead_s": c.router_overhead_s, "network_delay_s": c.network_delay_s,
        "servers_used": int(sc.placement.servers_used), "gpus_per_server": int(sc.hardware.gpus_per_server),
        "per_replica": rows,
        "balance": {"requests": _spread(routed), "busy_share": _spread(busy), "tokens": _spread(tokens)},
    }
    out.update(fleet.router.summary_entries())
    return out


def _prefix_hits(kvs) -> float | None:
    """Token hit rate of a replica's prefix caches (None without prefix caching)."""
    if not all(kv.prefix_caching for kv in kvs):
        return None
    q = sum(int(kv.query_tokens.sum()) for kv in kvs)
    h = sum(int(kv.hit_tokens.sum()) for kv in kvs)
    return float(h / q) if q else None


def fleet_kv_report(kvs: list, ttft: np.ndarray) -> dict:
    """The prefix-cache entries of ``summary.kv`` for a fleet: one engine's own report, or every
    engine's counters pooled (hit rates over all lookups; tiers: hit blocks and rates per level,
    fetch waits; a lower tier's link traffic summed over the engines -- each engine counts its own
    transfers, also on a link shared by all: ``kv_tiers[i].shared_link``)."""
    from servesim.kv.report import _rate, fetch_wait_entry, kv_report, ttft_effect
    from servesim.request import CLASS_NAMES, NUM_CLASSES

    if not kvs or not all(kv.prefix_caching for kv in kvs):
        return {}
    if len(kvs) == 1:
        return kv_report(kvs[0], ttft)
    qt = sum(kv.query_tokens for kv in kvs)
    ht = sum(kv.hit_tokens for kv in kvs)
    qb = sum(kv.query_blocks for kv in kvs)
    hb = sum(kv.hit_blocks for kv in kvs)
    by_class = {CLASS_NAMES[g]: {"tokens": _rate(ht[g], qt[g]), "blocks": _rate(hb[g], qb[g])}
                for g in range(NUM_CLASSES) if qt[g]}
    tiers: dict = {}
    names = ["L1"] + ([t.name for t in kvs[0].tiers.tiers] if kvs[0].tiers is not None else [])
    for i, name in enumerate(names):
        hits = sum(kv.tier_hit_blocks[i] for kv in kvs)
        tiers[name] = {"hit_blocks": int(hits.sum()), "hit_rate": _rate(hits.sum(), qb.sum()),
                       "by_class": {CLASS_NAMES[g]: _rate(hits[g], qb[g]) for g in range(NUM_CLASSES) if qb[g]}}
        links = [kv.tiers.tiers[i - 1].link for kv in kvs if i > 0 and kv.tiers is not None and len(kv.tiers.tiers) >= i]
        if links:
            tiers[name].update({"bytes_fetched": sum(ln.bytes_up for ln in links),
                                "bytes_stored": sum(ln.bytes_down for ln in links),
                                "fetches": sum(ln.fetches for ln in links), "stores": sum(ln.stores for ln in links),
                                "busy_s": float(sum(ln.busy_s for ln in links)),
                                "queue_s": float(sum(ln.queue_s for ln in links)),
                                "shared_link": bool(links[0].shared)})
    tiers["fetch_wait_s"] = fetch_wait_entry(sum(kv.fetch_wait_s for kv in kvs), sum(kv.fetch_waits for kv in kvs))
    tiers["dropped_blocks"] = int(sum(kv.tiers.dropped for kv in kvs if kv.tiers is not None))
    return {
        "prefix_hit_rate": {"tokens": _rate(int(ht.sum()), int(qt.sum())), "blocks": _rate(int(hb.sum()), int(qb.sum())),
                            "by_class": by_class},
        "prefix_cache": {"query_tokens": int(qt.sum()), "hit_tokens": int(ht.sum()), "query_blocks": int(qb.sum()),
                         "hit_blocks": int(hb.sum()), "evictions": int(sum(kv.evictions for kv in kvs)),
                         "stale_hits": int(sum(kv.stale_hits for kv in kvs)),
                         "cached_blocks": int(sum(kv.cached_blocks() for kv in kvs))},
        "tiers": tiers,
        "ttft_effect": ttft_effect(np.asarray(ttft, dtype=np.float64), sum(kv.hit_tokens_of for kv in kvs)),
    }
