"""Run one reference run and keep what the tables need: its summary, the latency jitter, its KV
memory, and (for multi-turn sessions) figures per round.

A run's files go to ``OUT/runs/<experiment>/<label>/`` (what `servesim run --out` writes:
requests.parquet, summary.json, scenario.resolved.yaml, ...), its record to
``OUT/records/<experiment>/<label>.json``. A record names the configuration by its scenario key
(a hash of everything that can change a number), so a re-run skips what is already there.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from benchmarks.reference.plan import Run

GIB = 1 << 30


def record_path(out: Path, run: Run) -> Path:
    return out / "records" / run.exp / f"{run.label}.json"


def run_dir(out: Path, run: Run) -> Path:
    return out / "runs" / run.exp / run.label


def key_of(run: Run) -> str:
    from servesim.sweep.spec import scenario_key

    return scenario_key(run.scenario)


def cached(out: Path, run: Run) -> dict | None:
    p = record_path(out, run)
    if not p.is_file():
        return None
    rec = json.loads(p.read_text())
    return rec if rec.get("key") == key_of(run) else None


def execute(run: Run, out: Path) -> dict:
    """Simulate ``run``, write its folder and record, return the record."""
    from servesim.simulate import build, run_built

    t0 = time.perf_counter()
    b = build(run.scenario)
    res = run_built(b)
    wall = time.perf_counter() - t0
    res.write(run_dir(out, run))
    df = res.requests
    done = _measured(df, run.scenario.stop.warmup_requests)
    rec = {
        "exp": run.exp, "label": run.label, "source": run.source, "tags": run.tags, "key": key_of(run),
        "wall_s": wall, "summary": res.summary, "memory": kv_memory(run, res),
        "jitter": jitter(done), "streams": stream_extra(df, done, res.summary["sim_time_s"], _stream_slos(run),
                                                    run.scenario.stop.warmup_requests),
        "finished_per_s": float((df["status"] == "finished").sum() / max(res.summary["sim_time_s"], 1e-9)),
    }
    if run.per_round:
        rec["rounds"] = per_round(b, df, done)
    p = record_path(out, run)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.partial")
    tmp.write_text(json.dumps(_finite(rec), indent=1, sort_keys=True) + "\n")
    tmp.replace(p)
    return rec


def _finite(x):
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    if isinstance(x, np.generic):
        return _finite(x.item())
    return x


def _measured(df, warmup: int):
    """Finished requests after the warm-up (the summary's measured set: ids are arrival order)."""
    return df[(df["status"] == "finished") & (df["id"] >= warmup)]


def _cv(x) -> float | None:
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    if len(x) < 2 or x.mean() <= 0:
        return None
    return float(x.std(ddof=1) / x.mean())


def jitter(done) -> dict:
    """Jitter as the report defines it: std / mean of a latency, over the measured requests,
    overall and per stream."""
    out = {"all": {m: _cv(done[f"{m}_s"]) for m in ("ttft", "tpot", "e2e")}}
    for name, g in done.groupby("stream", observed=True):
        out[str(name)] = {m: _cv(g[f"{m}_s"]) for m in ("ttft", "tpot", "e2e")}
    return out


def _stream_slos(run: Run) -> dict[str, dict[str, float]]:
    """Each named stream's SLO targets (``{"ttft_p99": 0.8}``)."""
    out = {}
    for s in run.scenario.workload.streams or []:
        if s.slo is not None:
            out[s.name] = {k: v for k, v in s.slo.model_dump().items() if v is not None}
    return out


def stream_extra(df, done, end_s: float, slos: dict[str, dict[str, float]], warmup: int) -> dict:
    """Per stream: what happened to its requests (the summary's by_stream has latencies), how
    long its oldest unfinished request had waited when the run ended (an overloaded run's
    backlog: its finished requests alone would hide it), and how many of its measured requests
    missed each TTFT / E2E target -- counting the unfinished ones that had already missed it
    when the run ended (no first token yet after longer than a TTFT target; older than an E2E
    target), so a backlog is not a pass by survivorship."""
    out = {}
    for name, g in df.groupby("stream", observed=True):
        d = done[done["stream"] == name]
        left = g[~g["status"].isin(["finished", "rejected"]) & g["arrival_s"].notna()]  # arrived, unfinished
        age = end_s - left["arrival_s"]
        miss = {}
        for target, bound in slos.get(str(name), {}).items():
            metric = target.split("_")[0]
            if metric not in ("ttft", "e2e"):
                continue
            late = int((d[f"{metric}_s"] > bound).sum())
            stuck = age > bound if metric == "e2e" else (age > bound) & left["first_token_s"].isna()
            after = left["id"] >= warmup  # the measured set's rule: the first N arrivals are warm-up
            miss[target] = {"bound": bound, "measured": int(len(d)), "late": late,
                            "unfinished_late": int((stuck & after).sum())}
        out[str(name)] = {
            "in_flight": int(len(left)),
            "oldest_in_flight_s": float(age.max()) if len(left) else None,
            "missed": miss,
            "arrived": int(g["arrival_s"].notna().sum()),
            "finished": int((g["status"] == "finished").sum()),
            "rejected": int((g["status"] == "rejected").sum()),
            "preempted_requests": int((g["preemptions"] > 0).sum()),
            "preemptions": int(g["preemptions"].sum()),
            "prompt_mean": float(g["prompt_tokens"].mean()) if len(g) else None,
            "blocked_s_mean": {c[len("blocked_"):-2]: float(d[c].mean()) for c in d.columns
                               if c.startswith("blocked_")} if len(d) else {},
        }
    return out


def kv_memory(run: Run, res) -> dict:
    """KV pool of one replica: GiB over its GPUs, tokens, and the peak share it used."""
    from servesim.memory import plan_memory

    sc = run.scenario
    plan = plan_memory(sc)
    gpus = sc.tp * sc.pp
    cl = res.summary.get("cluster")
    if cl:
        per = cl["per_replica"]
        blocks = float(np.mean([r["kv_blocks"] for r in per]))
        peak = float(max(r["kv_peak"] for r in per))
        mean = float(np.mean([r["kv_mean"] for r in per]))
    else:
        blocks = float(res.memory.num_blocks)
        peak, mean = res.summary["kv"]["peak_usage"], res.summary["kv"]["mean_usage"]
    return {"gpus_per_replica": gpus, "kv_gib_per_gpu": plan.kv_bytes / GIB,
            "kv_gib_per_replica": gpus * plan.kv_bytes / GIB,
            "kv_bytes_per_token_per_gpu": plan.kv_bytes_per_token, "blocks_per_replica": blocks,
            "tokens_per_replica": blocks * sc.engine.block_size, "peak_usage_max_replica": peak,
            "mean_usage_mean_replica": mean}


def _held_blocks(kv, rid: np.ndarray, slots: np.ndarray, block_size: int) -> np.ndarray:
    """Blocks a request held when it finished: a static reservation, an elastic reservation at its
    final size, or ceil(slots / block_size) for paged blocks (and the prefix cache's)."""
    from servesim.jit import pure
    from servesim.kv.kernels import ELASTIC, STATIC, KVState, kv_blocks_needed

    if isinstance(kv, KVState) and kv.kind == STATIC:
        return kv.reserve[rid].astype(np.int64)
    if isinstance(kv, KVState) and kv.kind == ELASTIC:
        need = pure(kv_blocks_needed)
        return np.array([need(kv, int(s)) for s in slots], dtype=np.int64)
    return -(-slots // block_size)


def per_round(b, df, done) -> list[dict]:
    """Figures per round of the multi-turn sessions: a request's round is its place in its
    session (arrival order). KV reuse is the share of the prompt found in the prefix cache;
    waste is the share of the KV the request held at its end that held no token (block rounding
    and unused reservation), as the allocator held it."""
    wl = b.workload
    if wl.session is None:
        return []
    sess = np.asarray(wl.session)
    order = np.argsort(sess, kind="stable")  # rows are in arrival order; a session's turns stay ordered
    s = sess[order]
    starts = np.r_[0, np.flatnonzero(s[1:] != s[:-1]) + 1]
    turn = np.empty(len(s), dtype=np.int64)
    turn[order] = np.arange(len(s)) - np.repeat(starts, np.diff(np.r_[starts, len(s)]))
    ids = done["id"].to_numpy()
    rounds = turn[ids] + 1
    hit = getattr(b.kv, "hit_tokens_of", None)
    slots = (done["prompt_tokens"] + done["output_tokens"] - 1).to_numpy().astype(np.int64)
    bs = b.scenario.engine.block_size
    held = _held_blocks(b.kv, ids, slots, bs) * bs
    out = []
    for r in range(1, int(rounds.max(initial=0)) + 1):
        m = rounds == r
        if not m.any():
            continue
        d = done[m]
        row = {"round": r, "requests": int(m.sum()), "prompt_mean": float(d["prompt_tokens"].mean()),
               "ttft_p50": float(np.percentile(d["ttft_s"], 50)), "ttft_p99": float(np.percentile(d["ttft_s"], 99)),
               "e2e_p50": float(np.percentile(d["e2e_s"], 50)),
               "waste_share": float((held[m] - slots[m]).sum() / max(held[m].sum(), 1))}
        if hit is not None:
            row["reuse_share"] = float(np.asarray(hit)[ids[m]].sum() / d["prompt_tokens"].sum())
        out.append(row)
    return out
