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

import numpy as np
import pandas as pd

from servesim.engine.state import FINISHED, REJECTED, Reject, RequestTable
from servesim.metrics.collect import Recorder
from servesim.metrics.stats import describe, describe_weighted
from servesim.request import CLASS_NAMES, NUM_CLASSES
from servesim.sched.base import CAUSE_NAMES, NUM_CAUSES, Cause


def request_frame(req: RequestTable) -> pd.DataFrame:
    ttft = req.t_first_token - req.arrival
    e2e = req.t_finish - req.arrival
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(req.output > 1, (e2e - ttft) / (req.output - 1), np.nan)
    finished = req.status == FINISHED
    cols = {
        "id": np.arange(req.n, dtype=np.int64),
        "klass": req.klass.astype(np.int8),
        "arrival_s": req.arrival,
        "prompt_tokens": req.prompt,
        "output_tokens": req.output,
        "status": pd.Categorical.from_codes(req.status, ["pending", "waiting", "running", "finished", "rejected"]),
        "reject_reason": [Reject.NAMES.get(int(r), "") for r in req.reject_reason] if (req.reject_reason != 0).any() else "",
        "first_scheduled_s": req.t_first_sched,
        "first_token_s": req.t_first_token,
        "finish_s": np.where(finished, req.t_finish, np.nan),
        "ttft_s": np.where(finished, ttft, np.nan),
        "tpot_s": np.where(finished, tpot, np.nan),
        "e2e_s": np.where(finished, e2e, np.nan),
        "queue_s": req.t_first_sched - req.arrival,
        "preemptions": req.preemptions,
    }
    settled = ~np.isnan(req.t_first_sched)
    for c in range(NUM_CAUSES):
        col = np.where(settled, req.blocked[:, c], np.nan)
        if c == Cause.PREEMPTED:
            col = np.where(req.preemptions > 0, req.blocked[:, c], 0.0)
            col = np.where(req.status == 1, np.nan, col)  # still waiting after a preemption
        cols[f"blocked_{CAUSE_NAMES[c]}_s"] = col
    return pd.DataFrame(cols)


def _blockage(df: pd.DataFrame) -> dict:
    cause_cols = [f"blocked_{n}_s" for n in CAUSE_NAMES]
    out: dict = {}
    groups = [("all", df)] + [(CLASS_NAMES[g], df[df.klass == g]) for g in range(NUM_CLASSES)]
    for name, d in groups:
        if len(d) == 0:
            continue
        secs = d[cause_cols].fillna(0.0).sum().to_numpy()
        total = float(secs.sum())
        out[name] = {
            "waiting_s": total,
            "share": {CAUSE_NAMES[c]: (float(secs[c] / total) if total > 0 else 0.0) for c in range(NUM_CAUSES)},
        }
    return out


def build_summary(*, name: str, seed: int, req: RequestTable, rec: Recorder, num_blocks: int,
                  sim_time: float, wall_s: float, warmup: int, slo_ttft: float, slo_tpot: float,
                  frame: pd.DataFrame | None = None) -> dict:
    rec.flush()
    df = request_frame(req) if frame is None else frame
    arrived = int(((req.status != 0) | (~np.isnan(req.arrival) & (req.arrival <= sim_time))).sum())
    completed = int((req.status == FINISHED).sum())
    rejected = int((req.status == REJECTED).sum())
    measured = df[(df.id >= warmup) & (df.status == "finished")]
    n_meas = len(measured)
    if n_meas:
        window = float(measured.finish_s.max() - measured.arrival_s.min())
    else:
        window = 0.0
    good = measured[(measured.ttft_s <= slo_ttft) & ((measured.tpot_s <= slo_tpot) | measured.tpot_s.isna())]
    per_s = (lambda x: x / window) if window > 0 else (lambda x: 0.0)
    itl_v, itl_w = rec.itl_gap.array(), rec.itl_count.array()
    reasons = {}
    for code, label in Reject.NAMES.items():
        cnt = int((req.reject_reason == code).sum())
        if cnt:
            reasons[label] = cnt
    total_time = max(sim_time, 1e-300)
    nb = rec.series.nbins()
    kv_int = rec.series.integral[0, :nb].sum()
    kv_peak = rec.series.peak[0, :nb].max() if nb else 0.0
    return {
        "scenario": name,
        "seed": seed,
        "requests": {
            "arrived": arrived,
            "completed": completed,
            "rejected": rejected,
            "in_flight": arrived - completed - rejected,
            "measured": n_meas,
            "warmup": warmup,
            "rejected_by_reason": reasons,
            "preemptions": int(req.preemptions.sum()),
        },
        "throughput": {
            "req_per_s": per_s(n_meas),
            "output_tok_per_s": per_s(float(measured.output_tokens.sum())),
            "input_tok_per_s": per_s(float(measured.prompt_tokens.sum())),
            "goodput_req_per_s": per_s(len(good)),
        },
        "slo": {"ttft_s": slo_ttft, "tpot_s": slo_tpot,
                "attainment": (len(good) / n_meas) if n_meas else None},
        "latency_s": {
            "ttft": describe(measured.ttft_s.to_numpy()),
            "tpot": describe(measured.tpot_s.to_numpy()),
            "itl": describe_weighted(itl_v, itl_w),
            "e2e": describe(measured.e2e_s.to_numpy()),
            "queue": describe(measured.queue_s.to_numpy()),
        },
        "kv": {
            "blocks_total": int(num_blocks),
            "peak_usage": float(kv_peak / num_blocks),
            "mean_usage": float(kv_int / total_time / num_blocks),
        },
        "engine": {
            "iterations": int(rec.iterations),
            "busy_fraction": float(rec.busy_s / total_time),
            "gpu_s": float(rec.busy_s - rec.cpu_s - rec.extra_s),
            "cpu_overhead_s": float(rec.cpu_s),
            "other_s": float(rec.extra_s),
            "mean_running": float(rec.batch_seqs_sum / rec.iterations) if rec.iterations else 0.0,
            "mean_batch_tokens": float(rec.batch_tokens_sum / rec.iterations) if rec.iterations else 0.0,
        },
        "blockage": _blockage(measured),
        "sim_time_s": float(sim_time),
        "wall_s": float(wall_s),
    }


def timeseries_frame(rec: Recorder) -> pd.DataFrame:
    rec.flush()
    s = rec.series
    nb = s.nbins()
    t = np.arange(nb) * s.bin_s
    width = np.minimum(s.bin_s, np.maximum(s.t_end - t, 0.0))
    width = np.where(width > 0, width, np.nan)
    out = {"t_s": t}
    for i, name in enumerate(s.SIGNALS):
        out[f"{name}_mean"] = s.integral[i, :nb] / width
        out[f"{name}_peak"] = s.peak[i, :nb]
    return pd.DataFrame(out)
