"""Results per class label and per stream: ``summary["by_class"]`` and ``summary["by_stream"]``.

A request's *class label* is its stream's ``class`` (``workload.streams``), or its SLA class
P0..P4 in the single-stream form (so a priority scheduler's P0 tail is one lookup away). Each
group gets the summary's blocks, computed the same way over the group's measured requests::

    "by_class": {"P0": {"streams": [...], "requests": {...}, "throughput": {...},
                        "slo": {...}, "latency_s": {"ttft", "tpot", "itl", "e2e", "queue"}}, ...}

* throughput uses the run's measurement window (first measured arrival to last measured finish,
  all requests), so the groups' rates add up to the run's;
* goodput and ``slo.attainment`` count a request as good when it meets *its own stream's* SLO:
  every target metric of the request at most the target (``{ttft_p99: 0.8}``: TTFT <= 0.8 s), or
  the scenario's ``slo`` (TTFT <= ttft_s and TPOT <= tpot_s) for streams without one;
* ``slo.met`` checks each percentile target against the group's percentile (``p99 <= 0.8``);
* ``itl``: the engine records inter-token gaps per iteration, not per request, so a group's ITL
  block holds the exact mean (a request's gaps add up to E2E - TTFT over output - 1 gaps) and the
  gap count; its percentiles are ``None`` (the run's ITL percentiles are in ``latency_s.itl``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servesim.metrics.stats import PCT_KEYS, describe
from servesim.request import CLASS_NAMES, FINISHED, REJECTED, RequestTable
from servesim.config.streams import StreamSpec, split_target

METRICS = ("ttft", "tpot", "itl", "e2e", "queue")


@dataclass(frozen=True)
class GlobalSLO:
    """The scenario's ``slo`` block: per-request thresholds for streams without their own."""

    ttft_s: float
    tpot_s: float


@dataclass(frozen=True)
class Groups:
    """Requests grouped for results: ``code[i]`` is request i's group in ``names``."""

    names: tuple[str, ...]
    code: np.ndarray  # int16 [n]
    members: tuple[tuple[str, ...], ...]  # stream names in each group


def class_groups(klass: np.ndarray, stream: np.ndarray, specs: tuple[StreamSpec, ...]) -> Groups:
    """Groups by class label. Streams without a label (the single-stream form) group by SLA
    class: P0..P4, those present, first; then the configured labels in stream order (all listed,
    even when no request has them)."""
    unlabelled = [sp for sp in specs if sp.label is None]
    rows = np.isin(stream, [sp.index for sp in unlabelled]) if unlabelled else np.zeros(len(stream), dtype=bool)
    names = [CLASS_NAMES[k] for k in sorted(np.unique(klass[rows]).tolist())]
    members: dict[str, list[str]] = {x: [sp.name for sp in unlabelled] for x in names}
    for sp in specs:
        if sp.label is not None:
            if sp.label not in members:
                names.append(sp.label)
                members[sp.label] = []
            members[sp.label].append(sp.name)
    label_of_stream = np.zeros(len(specs), dtype=np.int16)
    for sp in specs:
        if sp.label is not None:
            label_of_stream[sp.index] = names.index(sp.label)
    code = label_of_stream[stream]
    if rows.any():
        index_of_class = np.zeros(len(CLASS_NAMES), dtype=np.int16)
        for x in names:
            if x in CLASS_NAMES:
                index_of_class[CLASS_NAMES.index(x)] = names.index(x)
        code = np.where(rows, index_of_class[klass.astype(np.int64)], code)
    return Groups(tuple(names), code.astype(np.int16), tuple(tuple(members[x]) for x in names))


def stream_groups(stream: np.ndarray, specs: tuple[StreamSpec, ...]) -> Groups:
    return Groups(tuple(sp.name for sp in specs), stream.astype(np.int16), tuple((sp.name,) for sp in specs))


# ------------------------------------------------------------------------------------- SLOs
def _thresholds(slo, default: GlobalSLO) -> dict[str, float]:
    """Per-request thresholds by metric: the tightest target per metric of a stream SLO, or the
    scenario's ttft_s/tpot_s."""
    if slo is None:
        return {"ttft": default.ttft_s, "tpot": default.tpot_s}
    out: dict[str, float] = {}
    for key, value in slo.targets().items():
        metric, _ = split_target(key)
        out[metric] = min(value, out.get(metric, value))
    return out


def update_good(good: np.ndarray, metric: str, col: np.ndarray, stream: np.ndarray,
                specs: tuple[StreamSpec, ...], default: GlobalSLO) -> None:
    """Clear ``good`` for requests whose ``metric`` (``col``, same rows as ``stream``) misses its
    own stream's threshold. Called once per metric, so only one latency column is alive at a
    time. A missing TPOT (one output token) meets any TPOT target, as in the run's goodput."""
    for sp in specs:
        limit = _thresholds(sp.slo, default).get(metric)
        if limit is None:
            continue
        rows = stream == sp.index
        if not rows.any():
            continue
        x = col[rows]
        hit = x <= limit
        if metric == "tpot":
            hit |= np.isnan(x)
        good[rows] &= hit


def overdue(req: RequestTable, sim_time: float, warmup: int, specs: tuple[StreamSpec, ...],
            default: GlobalSLO) -> dict[str, np.ndarray]:
    """Requests after the warm-up still unfinished at the run's end (not rejected) that have
    already missed a target, by metric: TTFT when no first token came within the threshold (or it
    came late), E2E when their age passed the threshold. They are certain misses however the run
    would have gone on, so attainment counts them (a run cut by stop.duration_s under overload
    would otherwise judge only the requests that got through). TPOT cannot be known early."""
    n = req.n
    open_ = (req.status != FINISHED) & (req.status != REJECTED) & ~np.isnan(req.arrival) & (req.arrival <= sim_time)
    open_[:warmup] = False
    out = {"ttft": np.zeros(n, dtype=bool), "e2e": np.zeros(n, dtype=bool)}
    if not open_.any():
        return out
    age = sim_time - req.arrival
    first = req.t_first_token - req.arrival
    for sp in specs:
        th = _thresholds(sp.slo, default)
        rows = open_ & (req.stream == sp.index)
        if "ttft" in th:
            late = np.where(np.isnan(first), age > th["ttft"], first > th["ttft"])
            out["ttft"] |= rows & late
        if "e2e" in th:
            out["e2e"] |= rows & (age > th["e2e"])
    return out


def _met(slo, lat_blocks: dict, arrived: int = 0, measured: int = 0,
         late: dict[str, int] | None = None) -> tuple[dict, bool | None]:
    """Each percentile target against the group's percentile. A class with arrivals but no
    completed request misses its targets (``value`` None, ``met`` False); requests that were
    still unfinished and already past a target (``late``: count by metric) count above it, so a
    p-th percentile target is missed when they are more than (100 - p) % of the group."""
    if slo is None:
        return {}, None
    late = late or {}
    met = {}
    for key, target in slo.targets().items():
        metric, pct = split_target(key)
        pkey = "p999" if pct == 99.9 else f"p{int(pct)}"
        value = lat_blocks[metric][pkey]
        n_late = int(late.get(metric, 0))
        if value is None:
            verdict = False if arrived > 0 else None
        else:
            verdict = bool(value <= target) and not (n_late > (1 - pct / 100.0) * (measured + n_late))
        entry = {"target": target, "value": value, "met": verdict}
        if n_late:
            entry["overdue"] = n_late
        if value is None and arrived > 0:
            entry["why"] = "no request of this group completed after the warm-up"
        met[key] = entry
    verdicts = [m["met"] for m in met.values()]
    return met, (None if any(v is None for v in verdicts) else all(verdicts))


# ----------------------------------------------------------------------------------- blocks
def _itl_block(req: RequestTable, idx: np.ndarray) -> dict:
    out = req.output[idx].astype(np.int64)
    multi = out > 1
    gaps = int((out[multi] - 1).sum())
    span = float((req.t_finish[idx][multi] - req.t_first_token[idx][multi]).sum())
    block = {"mean": span / gaps if gaps else None, **{k: None for k in PCT_KEYS}, "max": None, "count": gaps}
    return block


class GroupStats:
    """Per-group latency blocks, filled one metric column at a time (bounded memory)."""

    def __init__(self, groups: Groups, measured_rows: np.ndarray):
        self.groups = groups
        self.rows = measured_rows
        code = groups.code[measured_rows]
        self.sel = [code == g for g in range(len(groups.names))]
        self.blocks: list[dict] = [{} for _ in groups.names]

    def add(self, metric: str, col: np.ndarray) -> None:
        for g, sel in enumerate(self.sel):
            self.blocks[g][metric] = describe(col[sel])

    def summaries(self, req: RequestTable, good: np.ndarray, window: float, sim_time: float,
                  slo_of_group: list, default: GlobalSLO, key: str, tags: list,
                  late: dict[str, np.ndarray] | None = None, missed: np.ndarray | None = None) -> dict:
        """One block per group, headed ``{key: tags[g]}``: a class's streams, or a stream's class
        label."""
        per_s = (lambda x: x / window) if window > 0 else (lambda x: 0.0)
        status = req.status
        arrived_mask = (status != 0) | (~np.isnan(req.arrival) & (req.arrival <= sim_time))
        out = {}
        for g, name in enumerate(self.groups.names):
            rows = self.groups.code == g
            sel = self.sel[g]
            idx = self.rows[sel]
            arrived = int((arrived_mask & rows).sum())
            completed = int(((status == FINISHED) & rows).sum())
            rejected = int(((status == REJECTED) & rows).sum())
            n_good = int(good[sel].sum())
            n_missed = int((missed & rows).sum()) if missed is not None else 0
            blocks = {m: (_itl_block(req, idx) if m == "itl" else self.blocks[g][m]) for m in METRICS}
            slo = slo_of_group[g]
            n_late = {m: int((v & rows).sum()) for m, v in (late or {}).items()}
            met, all_met = _met(slo, blocks, arrived - rejected, len(idx), n_late)
            targets = slo.targets() if slo is not None else {f"{m}_s": v for m, v in _thresholds(None, default).items()}
            out[name] = {
                key: tags[g],
                "requests": {"arrived": arrived, "completed": completed, "rejected": rejected,
                             "in_flight": arrived - completed - rejected, "measured": int(len(idx))},
                "throughput": {
                    "req_per_s": per_s(len(idx)),
                    "output_tok_per_s": per_s(float(req.output[idx].sum(dtype=np.int64))),
                    "input_tok_per_s": per_s(float(req.prompt[idx].sum(dtype=np.int64))),
                    "goodput_req_per_s": per_s(n_good),
                },
                "slo": {"targets": targets,
                        "attainment": (n_good / (len(idx) + n_missed)) if len(idx) + n_missed else None,
                        "overdue": n_missed, "met": met, "all_met": all_met},
                "latency_s": blocks,
            }
        return out


def slo_per_group(groups: Groups, specs: tuple[StreamSpec, ...]) -> list:
    """Each group's SLO: its streams' (one per label, checked when the scenario loads)."""
    by_name = {sp.name: sp.slo for sp in specs}
    return [by_name[m[0]] if m else None for m in groups.members]
