"""One flat vocabulary of scalar metrics, shared by sweeps, replications and SLOs.

A run's summary is a nested dictionary; a sweep wants one row per run, and an SLO names one
number. Both use the names defined here, so ``--slo ttft_p99=0.8``, a sweep's ``metrics:
[ttft_p99]`` and the column of ``simulate_many`` are the same thing::

    ttft_p99            latency_s.ttft.p99          (seconds; also tpot, itl, e2e, queue x
                                                     mean, p50, p90, p95, p99, p999, max)
    req_per_s           throughput.req_per_s        (and output_tok_per_s, input_tok_per_s,
                                                     goodput_req_per_s)
    slo_attainment      slo.attainment
    completed           requests.completed          (and arrived, rejected, in_flight, measured,
                                                     preemptions)
    kv_peak_usage       kv.peak_usage               (and kv_mean_usage)
    busy_fraction       engine.busy_fraction        (and iterations, mean_running,
                                                     mean_batch_tokens)
    waiting_s           blockage.all.waiting_s      (and wait_share_<cause> per cause)
    sim_time_s          sim_time_s
    prefix_hit_rate     kv.prefix_hit_rate.tokens   (prefix caching only)

``queue_mean`` is the mean wait in queue (arrival to first scheduled): the quantity of the
Pollaczek-Khinchine formula for an M/G/1 replica. A value the run could not measure (no
completed request) is NaN, never dropped.
"""

from __future__ import annotations

import math

from servesim.metrics.stats import PCT_KEYS
from servesim.request import CAUSE_NAMES

LATENCIES = ("ttft", "tpot", "itl", "e2e", "queue")
STATS = ("mean",) + PCT_KEYS + ("max",)

_PATHS: dict[str, tuple[str, ...]] = {}
for _m in LATENCIES:
    for _s in STATS:
        _PATHS[f"{_m}_{_s}"] = ("latency_s", _m, _s)
for _k in ("req_per_s", "output_tok_per_s", "input_tok_per_s", "goodput_req_per_s"):
    _PATHS[_k] = ("throughput", _k)
_PATHS["slo_attainment"] = ("slo", "attainment")
for _k in ("arrived", "completed", "rejected", "in_flight", "measured", "preemptions"):
    _PATHS[_k] = ("requests", _k)
_PATHS["kv_peak_usage"] = ("kv", "peak_usage")
_PATHS["kv_mean_usage"] = ("kv", "mean_usage")
for _k in ("busy_fraction", "iterations", "mean_running", "mean_batch_tokens"):
    _PATHS[_k] = ("engine", _k)
_PATHS["waiting_s"] = ("blockage", "all", "waiting_s")
for _c in CAUSE_NAMES:
    _PATHS[f"wait_share_{_c}"] = ("blockage", "all", "share", _c)
_PATHS["sim_time_s"] = ("sim_time_s",)
_PATHS["prefix_hit_rate"] = ("kv", "prefix_hit_rate", "tokens")

METRIC_PATHS: dict[str, tuple[str, ...]] = dict(_PATHS)
METRIC_NAMES: tuple[str, ...] = tuple(METRIC_PATHS)


def _dig(d: dict, path: tuple[str, ...]):
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def flat_metrics(summary: dict, names: tuple[str, ...] | list[str] | None = None) -> dict[str, float]:
    """``{name: value}`` for every metric of the vocabulary (or ``names``); NaN where the run
    has no value (an empty percentile, a cause with no waiting, prefix caching off)."""
    out: dict[str, float] = {}
    for name in names if names is not None else METRIC_NAMES:
        v = _dig(summary, METRIC_PATHS[name])
        out[name] = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan
    return out


def check_metric_name(name: str) -> str | None:
    """None if ``name`` is a metric, else a one-line explanation listing what is allowed."""
    if name in METRIC_PATHS:
        return None
    close = [m for m in METRIC_NAMES if m.split("_")[0] == name.split("_")[0]][:8]
    hint = f"; e.g. {', '.join(close)}" if close else ""
    return (f"{name!r} is not a metric (allowed: <ttft|tpot|itl|e2e|queue>_<mean|p50|p90|p95|p99|p999|max>, "
            f"req_per_s, goodput_req_per_s, slo_attainment, ... see docs/sweeps.md{hint})")
