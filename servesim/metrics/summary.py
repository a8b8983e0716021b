"""From recorded columns to the per-request frame and the summary dictionary.

Definitions (vLLM ``benchmark_serving`` conventions):

* TTFT  = first token time - arrival
* TPOT  = (E2E - TTFT) / (output tokens - 1), for requests with more than one output token
* ITL   = every gap between consecutive tokens of a request (weighted sample, see collect.py)
* E2E   = finish - arrival;  queue = first scheduled - arrival
* throughput = measured completed requests (or their output tokens) / measurement window, the
  window spanning the first measured arrival to the last measured finish
* goodput = measured requests meeting both SLOs (TTFT <= slo.ttft_s, TPOT <= slo.tpot_s) per second

"Measured" requests are the completed ones after the first ``warmup_requests`` in arrival order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from dataclasses import dataclass

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

from servesim.request import FINISHED, PENDING, REJECTED, WAITING, Reject, RequestTable
from servesim.metrics.by_class import (GlobalSLO, Groups, GroupStats, class_groups, overdue, slo_per_group,
                                       stream_groups, update_good)
from servesim.metrics.collect import Recorder
from servesim.metrics.sketch import LogSketch
from servesim.metrics.stats import describe
from servesim.request import CAUSE_NAMES, NUM_CAUSES, Cause
from servesim.config.streams import StreamSpec


STATUS_NAMES = ["pending", "waiting", "running", "finished", "rejected"]


@dataclass(frozen=True)
class Labels:
    """Names for the label columns of the request output: ``stream`` (codes into
    ``stream_names``) and ``class_label`` (``class_code``, codes into ``class_names``)."""

    stream_names: tuple[str, ...]
    class_names: tuple[str, ...]
    class_code: np.ndarray  # int16 per request


def request_labels(req: RequestTable, specs: tuple[StreamSpec, ...]) -> Labels:
    g = class_groups(req.klass, req.stream, specs)
    return Labels(tuple(sp.name for sp in specs), g.names, g.code)


LABEL_COLUMNS = ("stream", "class_label")


def request_columns(req: RequestTable, lo: int = 0, hi: int | None = None,
                    labels: Labels | None = None, sent_only: bool = False) -> dict[str, np.ndarray]:
    """The per-request output columns for rows ``lo:hi`` (chunks keep big runs in bounded memory).
    With ``labels``, two more: ``stream`` and ``class_label`` as codes (see :class:`Labels`).
    With ``sent_only`` (requests.parquet, ``Result.requests``), only the requests sent by the
    run's end: a closed loop draws its requests ahead, and at a duration stop those its clients
    never sent read status pending with no arrival, or one after the end (a client still
    thinking), as if they were on their way; an open loop has no row past the end either."""
    hi = req.n if hi is None else hi
    sl = slice(lo, hi)
    arrival, status, out = req.arrival[sl], req.status[sl], req.output[sl]
    finished = status == FINISHED
    ttft = req.t_first_token[sl] - arrival
    e2e = req.t_finish[sl] - arrival
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (e2e - ttft) / (out - 1), np.nan)
    cols = {
        "id": np.arange(lo, hi, dtype=np.int64),
        "klass": req.klass[sl],
        "arrival_s": arrival,
        "prompt_tokens": req.prompt[sl],
        "output_tokens": out,
        "status": status,
        "reject_reason": req.reject_reason[sl],
        "first_scheduled_s": req.t_first_sched[sl],
        "first_token_s": req.t_first_token[sl],
        "finish_s": np.where(finished, req.t_finish[sl], np.nan),
        "ttft_s": np.where(finished, ttft, np.nan),
        "tpot_s": np.where(finished, tpot, np.nan),
        "e2e_s": np.where(finished, e2e, np.nan),
        "queue_s": req.t_first_sched[sl] - arrival,
        "preemptions": req.preemptions[sl],
    }
    ended = req.end_s is not None  # the run closed the waits still open at its end (engine/waits.py)
    settled = ~np.isnan(req.t_first_sched[sl]) | (ended & (status == WAITING))
    blocked = req.blocked[sl]
    for c in range(NUM_CAUSES):
        col = np.where(settled, blocked[:, c], np.nan)
        if c == Cause.PREEMPTED:
            col = np.where(req.preemptions[sl] > 0, blocked[:, c], 0.0)
            if not ended:
                col = np.where(status == WAITING, np.nan, col)  # still waiting after a preemption
        cols[f"blocked_{CAUSE_NAMES[c]}_s"] = col
    if req.replica is not None:  # a fleet's run
        cols["replica"] = req.replica[sl]
    if labels is not None:
        cols["stream"] = req.stream[sl]
        cols["class_label"] = labels.class_code[sl]
    if sent_only and req.end_s is not None:
        sent = (status != PENDING) | (arrival <= req.end_s)
        if not sent.all():
            cols = {k: v[sent] for k, v in cols.items()}
    return cols


def frame_from_columns(cols: dict[str, np.ndarray], labels: Labels | None = None) -> "pd.DataFrame":
    import pandas as pd  # (not at import: a CLI run writes parquet without it)

    cols = dict(cols)
    cols["status"] = pd.Categorical.from_codes(cols["status"], STATUS_NAMES)
    reasons = np.array([""] + [Reject.NAMES[k] for k in sorted(Reject.NAMES)], dtype=object)
    cols["reject_reason"] = reasons[cols["reject_reason"]]
    if labels is not None:
        cols["stream"] = pd.Categorical.from_codes(cols["stream"], labels.stream_names)
        cols["class_label"] = pd.Categorical.from_codes(cols["class_label"], labels.class_names)
    return pd.DataFrame(cols)


def request_frame(req: RequestTable, labels: Labels | None = None) -> "pd.DataFrame":
    return frame_from_columns(request_columns(req, labels=labels, sent_only=True), labels)


CHUNK = 1 << 20  # rows per pass when aggregating over all requests (bounded memory)


def _blockage(req: RequestTable, measured: np.ndarray, groups: Groups) -> dict:
    """Share of waiting seconds by cause over the measured requests, overall (``all``) and per
    class label, grouped as ``by_class`` is (``groups``: P0..P4 in the single-stream form, the
    streams' ``class`` labels otherwise; a label ``all`` is keyed ``all (class)``), groups
    without a measured request left out.
    Accumulated chunk by chunk (never a copy of the whole blocked-seconds matrix)."""
    ng = len(groups.names)
    secs = np.zeros((ng, NUM_CAUSES))
    present = np.zeros(ng, dtype=bool)
    for lo in range(0, req.n, CHUNK):
        hi = min(lo + CHUNK, req.n)
        m = measured[lo:hi]
        if not m.any():
            continue
        g = groups.code[lo:hi][m].astype(np.int64)
        present[np.unique(g)] = True
        rows = req.blocked[lo:hi][m]
        for c in range(NUM_CAUSES):
            secs[:, c] += np.bincount(g, weights=rows[:, c], minlength=ng)
    out: dict = {}
    # a class labelled "all" must not overwrite the run's entry (flat metrics read blockage.all)
    entries = [("all", secs.sum(axis=0), present.any())] + [
        ("all (class)" if name == "all" else name, secs[g], present[g]) for g, name in enumerate(groups.names)]
    for name, row, here in entries:
        if not here:
            continue
        total = float(row.sum())
        out[name] = {
            "waiting_s": total,
            "share": {CAUSE_NAMES[c]: (float(row[c] / total) if total > 0 else 0.0) for c in range(NUM_CAUSES)},
        }
    return out


def _latency(req: RequestTable, idx: np.ndarray, metric: str) -> np.ndarray:
    arrival = req.arrival[idx]
    if metric == "queue":
        return req.t_first_sched[idx] - arrival
    if metric == "e2e":
        return req.t_finish[idx] - arrival
    ttft = req.t_first_token[idx] - arrival
    if metric == "ttft":
        return ttft
    out = req.output[idx]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(out > 1, (req.t_finish[idx] - arrival - ttft) / (out - 1), np.nan)


def latency_column(req: RequestTable, meas: np.ndarray, metric: str) -> np.ndarray:
    """One latency of the ``meas`` requests, computed chunk by chunk into one array (the only
    full-length float array alive at a time)."""
    col = np.empty(len(meas))
    for lo in range(0, len(meas), CHUNK):
        col[lo : lo + CHUNK] = _latency(req, meas[lo : lo + CHUNK], metric)
    return col


def measured_mask(req: RequestTable, warmup: int) -> np.ndarray:
    """Completed requests after the first ``warmup`` (arrival order)."""
    m = req.status == FINISHED
    m[:warmup] = False
    return m


FRAG_SIGNALS = (("internal_fragmentation", 4), ("reservation_waste", 5), ("external_fragmentation", 6))


Pools = Sequence[tuple[Recorder, int, int]]  # a fleet's engines: (recorder, blocks, block size)


def pool_slots(num_blocks: int, block_size: int, pools: Pools | None = None) -> int:
    """Token slots of the KV pool: ``num_blocks × block_size``, or, for a fleet (``pools``), each
    engine's blocks times its own block size (groups may set different ``engine.block_size``)."""
    if pools:
        return sum(int(nb) * int(bs) for _, nb, bs in pools)
    return num_blocks * block_size


def _allocated_slot_integral(blocks_integral, block_size: int, pools: Pools | None):
    """``∫ allocated slots dt``: the integral of the blocks in use times the block size, or, when
    a fleet's engines differ in block size (the summed blocks are of different sizes), each
    engine's own integral times its own block size. Engines of one block size keep the
    one-product form (bit for bit what a single block size gave before)."""
    sizes = {int(bs) for _, _, bs in pools} if pools else {block_size}
    if len(sizes) == 1:
        return blocks_integral * sizes.pop()
    total = 0.0
    for rec, _, bs in pools:
        rec.flush()
        total += float(rec.series.integral[0, : rec.series.nbins()].sum()) * int(bs)
    return total


def kv_summary(rec: Recorder, num_blocks: int, block_size: int, sim_time: float, pools: Pools | None = None) -> dict:
    """KV usage and fragmentation (servesim/kv/frag.py gives the definitions): time means over
    [0, sim_time] and peaks, as shares of the pool. ``pools``: a fleet's engines as (recorder,
    blocks, block size), ``rec`` their merged recorder; every engine's slots count with its own
    block size (usage stays a share of the fleet's blocks)."""
    rec.flush()
    s = rec.series
    nb = s.nbins()
    t = max(sim_time, 1e-300)
    integ = s.integral[:, :nb].sum(axis=1)
    peak = s.peak[:, :nb].max(axis=1) if nb else np.zeros(len(s.SIGNALS))
    slots = pool_slots(num_blocks, block_size, pools)
    out = {
        "blocks_total": int(num_blocks),
        "peak_usage": float(peak[0] / num_blocks),
        "mean_usage": float(integ[0] / t / num_blocks),
    }
    out["utilization"] = {"mean": out["mean_usage"], "peak": out["peak_usage"]}
    for name, i in FRAG_SIGNALS:
        out[name] = {"mean": float(integ[i] / t / slots), "peak": float(peak[i] / slots)}
    # waste as a share of *allocated* KV (what papers and engine dashboards call fragmentation):
    # time integrals of the waste over the time integral of the allocated slots
    allocated = _allocated_slot_integral(integ[0], block_size, pools)
    share = (lambda x: float(x / allocated)) if allocated > 0 else (lambda x: None)
    internal, reserved = share(integ[4]), share(integ[5])
    out["of_allocated"] = {"internal_fragmentation": internal, "reservation_waste": reserved,
                           "waste": None if internal is None else internal + reserved}
    return out


def build_summary(*, name: str, seed: int, req: RequestTable, rec: Recorder, num_blocks: int,
                  sim_time: float, wall_s: float, warmup: int, slo_ttft: float, slo_tpot: float,
                  block_size: int = 1, streams: tuple[StreamSpec, ...] | None = None,
                  named_streams: bool = False, pools: Pools | None = None) -> dict:
    """The summary dictionary, from the columns, one latency column alive at a time.

    ``pools``: a fleet's engines, (recorder, blocks, block size) each, ``rec`` their merged
    recorder (KV slots count with each engine's own block size: see :func:`kv_summary`).
    ``streams``: the workload's streams (default: one, without an SLO of its own); each request
    is good when it meets its stream's SLO (metrics/by_class.py). ``by_class`` is always added,
    ``by_stream`` when ``named_streams`` (the workload names its streams)."""
    specs = streams if streams is not None else (StreamSpec(0, "default", None, None),)
    default = GlobalSLO(slo_ttft, slo_tpot)
    rec.flush()
    status = req.status
    arrived = int(((status != 0) | (~np.isnan(req.arrival) & (req.arrival <= sim_time))).sum())
    completed = int((status == FINISHED).sum())
    rejected = int((status == REJECTED).sum())
    mask = measured_mask(req, warmup)
    meas = np.flatnonzero(mask).astype(np.int32 if req.n < 2**31 else np.int64)
    n_meas = len(meas)
    window = float(req.t_finish[meas].max() - req.arrival[meas].min()) if n_meas else 0.0
    by_class = GroupStats(class_groups(req.klass, req.stream, specs), meas)
    by_stream = GroupStats(stream_groups(req.stream, specs), meas) if named_streams else None
    stream_meas = req.stream[meas]
    good_mask = np.ones(n_meas, dtype=bool)
    lat = {}
    for metric in ("ttft", "tpot", "itl", "e2e", "queue"):
        if metric == "itl":
            lat["itl"] = rec.itl_describe()
            continue
        col = latency_column(req, meas, metric)
        lat[metric] = describe(col)
        update_good(good_mask, metric, col, stream_meas, specs, default)
        for stats in (by_class, by_stream):
            if stats is not None:
                stats.add(metric, col)
        del col
    good = int(good_mask.sum())
    # unfinished requests already past a target: certain misses (metrics/by_class.py: overdue)
    late = overdue(req, sim_time, warmup, specs, default)
    missed = late["ttft"] | late["e2e"]
    n_missed = int(missed.sum())
    out_sum = float(req.output[meas].sum(dtype=np.int64))
    per_s = (lambda x: x / window) if window > 0 else (lambda x: 0.0)
    reasons = {}
    for code, label in Reject.NAMES.items():
        cnt = int((req.reject_reason == code).sum())
        if cnt:
            reasons[label] = cnt
    total_time = max(sim_time, 1e-300)
    out = {
        "scenario": name,
        "seed": seed,
        "requests": {
            "arrived": arrived,
            "completed": completed,
            "rejected": rejected,
            "in_flight": arrived - completed - rejected,
            "measured": n_meas,
            "warmup": min(warmup, arrived),  # warm-up requests that actually arrived
            "rejected_by_reason": reasons,
            "preemptions": int(req.preemptions.sum()),
        },
        "throughput": {
            "req_per_s": per_s(n_meas),
            "output_tok_per_s": per_s(out_sum),
            "input_tok_per_s": per_s(float(req.prompt[meas].sum())),
            "goodput_req_per_s": per_s(good),
        },
        "slo": {"ttft_s": slo_ttft, "tpot_s": slo_tpot,
                "attainment": (good / (n_meas + n_missed)) if n_meas + n_missed else None, "overdue": n_missed},
        "latency_s": lat,
        "kv": kv_summary(rec, num_blocks, block_size, sim_time, pools),
        "engine": {
            "iterations": int(rec.iterations),
            "busy_fraction": float(rec.busy_s / total_time),
            "gpu_s": float(rec.busy_s - rec.cpu_s - rec.extra_s),
            "cpu_overhead_s": float(rec.cpu_s),
            "other_s": float(rec.extra_s),
            "swap_outs": int(rec.swap_outs),
            "mean_running": float(rec.batch_seqs_sum / rec.iterations) if rec.iterations else 0.0,
            "mean_batch_tokens": float(rec.batch_tokens_sum / rec.iterations) if rec.iterations else 0.0,
        },
        "blockage": _blockage(req, mask, by_class.groups),
        "sim_time_s": float(sim_time),
        "wall_s": float(wall_s),
    }
    cg = by_class.groups
    out["by_class"] = by_class.summaries(req, good_mask, window, sim_time, slo_per_group(cg, specs), default,
                                         "streams", [list(m) for m in cg.members], late, missed)
    if by_stream is not None:
        out["by_stream"] = by_stream.summaries(req, good_mask, window, sim_time, [sp.slo for sp in specs], default,
                                               "class", [sp.label for sp in specs], late, missed)
    return out


def timeseries_frame(rec: Recorder, num_blocks: int = 1, block_size: int = 1,
                     slots: int | None = None) -> "pd.DataFrame":
    """Per time bin: time-weighted mean and peak of every signal; KV fragmentation as pool shares."""
    import pandas as pd

    return pd.DataFrame(timeseries_columns(rec, num_blocks, block_size, slots))


def timeseries_columns(rec: Recorder, num_blocks: int = 1, block_size: int = 1,
                       slots: int | None = None) -> dict[str, np.ndarray]:
    """The columns of :func:`timeseries_frame`. ``slots``: the pool's token slots when they are
    not ``num_blocks × block_size`` (a fleet: :func:`pool_slots`)."""
    rec.flush()
    s = rec.series
    nb = s.nbins()
    t = np.arange(nb) * s.bin_s
    width = np.minimum(s.bin_s, np.maximum(s.t_end - t, 0.0))
    width = np.where(width > 0, width, np.nan)
    out = {"t_s": t}
    slots = num_blocks * block_size if slots is None else slots

    def mean(i: int) -> np.ndarray:
        # a time-weighted mean lies within [0, the bin's peak]; in a bin a few ulps wide (a run
        # that ends just past a bin edge: 3.0000000000000004 s) the rounding of integral and
        # width does not, and a 48-block pool showed a mean of 64 blocks
        return np.clip(s.integral[i, :nb] / width, 0.0, s.peak[i, :nb])

    for i, name in enumerate(s.SIGNALS[:4]):
        out[f"{name}_mean"] = mean(i)
        out[f"{name}_peak"] = s.peak[i, :nb]
    # batch composition: prefill tokens of the batch (prompts, chunks, recomputation), the rest decode
    out["prefill_tokens_mean"] = mean(7)
    out["prefill_tokens_peak"] = s.peak[7, :nb]
    out["decode_tokens_mean"] = np.maximum(out["batch_tokens_mean"] - out["prefill_tokens_mean"], 0.0)
    out["kv_utilization_mean"] = out["kv_blocks_mean"] / num_blocks
    out["kv_utilization_peak"] = out["kv_blocks_peak"] / num_blocks
    for name, i in FRAG_SIGNALS:
        out[f"kv_{name}_mean"] = mean(i) / slots
        out[f"kv_{name}_peak"] = s.peak[i, :nb] / slots
    return out


CHUNK_ROWS = 1 << 18  # rows per chunk of the request table's columns (sketches)
ROW_GROUP_ROWS = 1 << 16  # rows per row group of requests.parquet (each built whole in memory: ~360 B a row)

def latency_sketches(req: RequestTable, rec: Recorder, warmup: int, rel_err: float = 0.01) -> dict[str, LogSketch]:
    """Sketches of the measured requests' latencies, filled chunk by chunk (bounded memory)."""
    sk = {name: LogSketch(rel_err) for name in ("ttft", "tpot", "itl", "e2e", "queue")}
    for lo in range(0, req.n, CHUNK_ROWS):
        hi = min(lo + CHUNK_ROWS, req.n)
        cols = request_columns(req, lo, hi)
        m = cols["status"] == FINISHED
        m[: max(0, warmup - lo)] = False
        for name in ("ttft", "tpot", "e2e", "queue"):
            sk[name].add(cols[f"{name}_s"][m])
    rec.flush()
    for v, w in rec.itl.parts():  # (a part can hold millions of gaps: LogSketch.add's temporaries are
        for lo in range(0, len(v), CHUNK_ROWS):  # ~50 B each, 250 MB at 1M requests; its counts are integers)
            sk["itl"].add(np.asarray(v[lo:lo + CHUNK_ROWS]), np.asarray(w[lo:lo + CHUNK_ROWS]))
    return sk
