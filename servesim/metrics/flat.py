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

Per class: ``<name>@<class label>`` reads ``by_class.<label>`` (docs/scenario.md, "Results per
class"): ``ttft_p99@chat``, ``goodput_req_per_s@P0``, ``slo_attainment@gold``; latencies,
throughputs, ``slo_attainment`` and the request counts (``arrived`` ... ``measured``). A class
that did not appear in a run reads NaN.

``queue_mean`` is the mean wait in queue (arrival to first scheduled): the quantity of the
Pollaczek-Khinchine formula for an M/G/1 replica. A value the run could not measure (no
completed request) is NaN, never dropped.
"""

from __future__ import annotations

import math
import re

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

# what a by_class entry holds, by the same names
CLASS_METRIC_PATHS: dict[str, tuple[str, ...]] = {
    k: v for k, v in METRIC_PATHS.items()
    if v[0] in ("latency_s", "throughput", "slo") or (v[0] == "requests" and k != "preemptions")}
_LABEL = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:+-]{0,63}$")  # a class label (workload/stream_config.py)


def metric_path(name: str) -> tuple[str, ...] | None:
    """Where a metric lives in a summary; None for a name that is not a metric."""
    if "@" in name:
        base, label = name.split("@", 1)
        inner = CLASS_METRIC_PATHS.get(base)
        return None if inner is None or not _LABEL.match(label) else ("by_class", label) + inner
    return METRIC_PATHS.get(name)


def class_metric_names(summary: dict) -> tuple[str, ...]:
    """``<name>@<label>`` for every class of this summary's ``by_class``."""
    labels = list((summary.get("by_class") or {}).keys())
    return tuple(f"{k}@{lab}" for lab in labels for k in CLASS_METRIC_PATHS)


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
        v = _dig(summary, metric_path(name) or ())
        out[name] = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan
    return out


def check_metric_name(name: str) -> str | None:
    """None if ``name`` is a metric, else a one-line explanation listing what is allowed."""
    if metric_path(name) is not None:
        return None
    base = name.split("@", 1)[0]
    if "@" in name and base in METRIC_PATHS:
        return (f"{name!r}: {base} is not reported per class (per class: latencies, throughputs, "
                f"slo_attainment, request counts), or the label is not a class label")
    close = [m for m in METRIC_NAMES if m.split("_")[0] == base.split("_")[0]][:8]
    hint = f"; e.g. {', '.join(close)}" if close else ""
    return (f"{name!r} is not a metric (allowed: <ttft|tpot|itl|e2e|queue>_<mean|p50|p90|p95|p99|p999|max>, "
            f"req_per_s, goodput_req_per_s, slo_attainment, ..., per class NAME@CLASS; see docs/sweeps.md{hint})")
