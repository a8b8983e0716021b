"""The predicted tables of docs/reference-experiments.md, as Markdown, from the runs' records.

Every number is read from a record (benchmarks/reference/execute.py) or a capacity search's JSON:
nothing here computes a latency. Missing runs (``--only``) leave their cells as "-".
"""

from __future__ import annotations

from typing import Any, Iterable

PCTS = ("p50", "p90", "p95", "p99", "p999")
PCT_NAMES = {"p50": "P50", "p90": "P90", "p95": "P95", "p99": "P99", "p999": "P99.9"}


# ------------------------------------------------------------------------------------ format
def sec(x: float | None) -> str:
    """A duration a reader compares at a glance: 3 significant digits, ms below a second."""
    if x is None:
        return "-"
    if x < 1.0:
        return f"{x * 1e3:.3g} ms"
    if x < 100:
        return f"{x:.3g} s"
    return f"{x:,.0f} s"


def pct(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def num(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def table(header: list[str], rows: Iterable[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def get(d: Any, *path, default=None):
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return default
        d = d[p]
    return d


def lat(rec: dict, metric: str, p: str, stream: str | None = None):
    s = rec["summary"]
    if stream is not None:
        s = get(s, "by_stream", stream) or get(s, "by_class", stream) or {}
    return get(s, "latency_s", metric, p)


def coverage(rec: dict, digits: int = 0) -> str:
    """Calibration coverage (issue 33): the share of the run's step time whose batch lay beyond
    the pack's measured grid, extrapolated (summary.json 'extrapolation'), or why there is no
    grid. One function for the ranges (``digits=0``) and the long tables (``digits=1``), so the
    two cannot drift apart."""
    ex = get(rec, "summary", "extrapolation") or {}
    if not ex.get("measured_grid"):
        return "roofline (no grid)"
    return pct(ex.get("step_time_share"), digits)


COVERAGE = "step time beyond the grid"  # the long tables' column


ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "spark": "Spark", "halo": "Halo"}


# ------------------------------------------------------------------------------------- A: fleet
STREAMS_A = (("chat", "ttft_p99", 0.8), ("summaries", "ttft_p99", 2.0), ("sql", "e2e_p99", 5.0))


def fleet_load(load: list[dict]) -> str:
    """Offered load against what one GPU prefills: the arithmetic behind 'does it fit'."""
    return table(
        ["stream", "rate", "prompt tokens (mean)", "prompt tokens/s", "per GPU (24)", "output tokens/s"],
        [[d["stream"], f"{d['rate']:g} req/s", num(d["prompt_mean"]), num(d["prompt_tok_s"]),
          num(d["prompt_tok_s"] / 24), num(d["output_tok_s"])] for d in load])


def prefill_speed(speeds: list[dict]) -> str:
    return table(["model", "GPUs (tp)", "8,192-token prefill", "prompt tokens/s per GPU",
                  "GPUs for the summaries' prefill alone"],
                 [[d["model"], d["tp"], sec(d["prefill_8k_s"]), num(d["tok_s_per_gpu"]), num(d["gpus_for_summaries"])]
                  for d in speeds])


def fleet_results(recs: dict[str, dict]) -> str:
    rows = []
    for label, r in recs.items():
        t = r["tags"]
        for stream, slo_name, bound in STREAMS_A:
            bs = get(r["summary"], "by_stream", stream) or {}
            req = bs.get("requests", {})
            metric = slo_name.split("_")[0]
            val = lat(r, metric, "p99", stream)
            left = get(r, "streams", stream, "in_flight") or 0
            miss = get(r, "streams", stream, "missed", slo_name) or {}
            n_late = miss.get("late", 0) + miss.get("unfinished_late", 0)
            n_all = miss.get("measured", 0) + miss.get("unfinished_late", 0)
            share = n_late / n_all if n_all else None
            if not n_all:
                verdict = "**missed**: none finished after the warm-up"
            else:
                verdict = ("met" if share <= 0.01 else "**missed**") + f" ({pct(share)} late"
                unfinished = miss.get("unfinished_late")
                verdict += f", {num(unfinished)} of them unfinished)" if unfinished else ")"
            rows.append([f"{ENGINE_NAMES[t['engine']]} {t['model']}", stream, num(req.get("arrived")),
                         num(req.get("completed")), num(left), sec(get(r, "streams", stream, "oldest_in_flight_s")),
                         sec(lat(r, "ttft", "p50", stream)), sec(lat(r, "ttft", "p99", stream)),
                         sec(lat(r, "ttft", "p999", stream)), sec(lat(r, "e2e", "p99", stream)),
                         f"{slo_name.replace('_p99', '')} P99 <= {bound:g} s: {verdict}", coverage(r, 1)])
    return table(["arm", "stream", "arrived", "completed", "unfinished at the end", "oldest unfinished waited",
                  "TTFT P50", "TTFT P99", "TTFT P99.9", "E2E P99", "SLO", f"{COVERAGE} (the run's)"], rows)


def fleet_kv(recs: dict[str, dict]) -> str:
    rows = []
    for label, r in recs.items():
        t, m, s = r["tags"], r["memory"], r["summary"]
        rows.append([f"{ENGINE_NAMES[t['engine']]} {t['model']}", s["cluster"]["replicas"], m["gpus_per_replica"],
                     f"{m['kv_gib_per_replica']:.1f} GiB", num(m["tokens_per_replica"]),
                     pct(m["peak_usage_max_replica"]), pct(m["mean_usage_mean_replica"]),
                     num(r.get("finished_per_s"), 1), pct(get(s, "engine", "busy_fraction")), coverage(r, 1)])
    return table(["arm", "replicas", "GPUs each", "KV per replica", "KV tokens per replica", "KV peak (busiest)",
                  "KV mean", "finished req/s (of 350 offered)", "busy", COVERAGE], rows)


def _bracket(d: dict, unit) -> tuple[str, str]:
    """A max-rate search's answer, or, when it refused, the verified bracket from its probes."""
    ff = d.get("first_failure")
    binding = [k for k, v in (ff or {}).get("slos", {}).items() if v.get("verdict") == "fail"]
    fail = "-" if not ff else f"{unit(ff)} ({', '.join(binding) or 'open'})"
    if d.get("answered"):
        return unit(d["answer"]), fail
    path = d.get("path", [])
    passes = [p for p in path if p["verdict"] == "pass"]
    fails = [p for p in path if p["verdict"] == "fail"]
    if not passes:
        return (d.get("refused") or "no answer")[:200], fail
    best = max(passes, key=lambda p: p["x"])
    above = [p for p in fails if p["x"] > best["x"]]
    ceiling = min((q["x"] for q in above), default=float("inf"))
    opens = [p for p in path if p["verdict"] == "open" and best["x"] < p["x"] < ceiling]
    first = min(above, key=lambda p: p["x"]) if above else None
    open_slos = sorted({k for p in opens for k, v in p["slos"].items() if v.get("verdict") == "open"})
    note = (f"; between, {', '.join(open_slos)} stays within the noise of {max(p['replications'] for p in opens)} "
            f"replications" if opens else "")
    fail = "-" if first is None else unit(first) + " (" + ", ".join(
        k for k, v in first["slos"].items() if v.get("verdict") == "fail") + ")"
    return f"at least {unit(best)}{note}", fail


def capacity(rates: list[dict], fleets: list[dict]) -> str:
    by = {}
    for d in rates:
        by.setdefault(d["label"], {})["rate"] = d
    for d in fleets:
        by.setdefault(d["label"], {})["fleet"] = d
    rows = []
    for label, d in by.items():
        r, f = d.get("rate"), d.get("fleet")
        tags = (r or f)["tags"]
        if r:
            rate, fail = _bracket(r, lambda p: f"x{p['x']:.3g} = {p['rate_req_per_s']:.3g} req/s")
        else:
            rate, fail = "not run", "-"
        if f and f.get("answer_replicas"):
            g = f["gpus_per_replica"]
            fleet = f"{f['answer_replicas']} replicas = {f['answer_gpus']} GPUs"
            if f.get("first_failure_replicas"):
                fleet += f"; {f['first_failure_replicas']} ({f['first_failure_replicas'] * g} GPUs) fail"
            if f.get("undecided_replicas"):
                fleet += f"; {', '.join(map(str, f['undecided_replicas']))} within the noise"
        else:
            fleet = "not run" if not f else "no answer: " + (f.get("refused") or "")[:200]
        rows.append([f"{ENGINE_NAMES[tags['engine']]} {tags['model']}", rate, fail, fleet])
    return table(["arm", "largest rate meeting every SLO on 24 GPUs (x the offered 350 req/s)",
                  "first failing scale (SLOs failed there)", "fleet for the full 350 req/s"], rows)


def mix_capacity(rates: list[dict]) -> str:
    models = {"qwen3-4b": 0, "qwen3-8b": 1, "qwen3-14b": 2}
    rows = []
    for d in sorted(rates, key=lambda d: (models.get(d["tags"]["model"], 9), d["tags"]["engine"])):
        t = d["tags"]
        ok, fail = _bracket(d, lambda p: f"{p['rate_req_per_s']:.3g} req/s")
        rows.append([t["model"], ENGINE_NAMES[t["engine"]], ok, fail])
    return table(["model", "engine", "largest rate meeting every stream's SLO",
                  "first failing rate (SLOs failed there)"], rows)


# --------------------------------------------------------------------------------- A: sessions
def sessions(recs: dict[str, dict]) -> str:
    rows = []
    for label, r in recs.items():
        s = r["summary"]
        kv = s["kv"]
        rows.append([label, num(s["requests"]["completed"]), sec(lat(r, "ttft", "p50")), sec(lat(r, "ttft", "p99")),
                     sec(lat(r, "ttft", "p999")), sec(lat(r, "e2e", "p99")), pct(get(kv, "prefix_hit_rate", "tokens")),
                     pct(kv["peak_usage"]), pct(get(kv, "of_allocated", "internal_fragmentation")),
                     pct(get(kv, "of_allocated", "reservation_waste")),
                     pct(get(kv, "external_fragmentation", "mean")), num(s["requests"].get("preemptions")),
                     coverage(r, 1)])
    return table(["arm", "completed", "TTFT P50", "TTFT P99", "TTFT P99.9", "E2E P99", "prompt tokens reused",
                  "KV peak", "internal frag. (of allocated)", "unused reservation (of allocated)",
                  "external frag. (of pool, mean)", "preemptions", COVERAGE], rows)


def rounds(recs: dict[str, dict]) -> str:
    arms = list(recs)
    by = {a: {d["round"]: d for d in recs[a].get("rounds", [])} for a in arms}
    n = max((max(b) for b in by.values() if b), default=0)
    header = ["round", "prompt (mean)"] + [f"{a}: TTFT P50 / P99" for a in arms] + \
        [f"{a}: reused" for a in arms if any("reuse_share" in d for d in by[a].values())] + \
        [f"{a}: KV waste" for a in arms]
    rows = []
    for k in range(1, n + 1):
        first = next((by[a][k] for a in arms if k in by[a]), None)
        row = [k, num(first["prompt_mean"]) if first else "-"]
        row += [f"{sec(by[a][k]['ttft_p50'])} / {sec(by[a][k]['ttft_p99'])}" if k in by[a] else "-" for a in arms]
        row += [pct(by[a][k].get("reuse_share"), 0) if k in by[a] else "-" for a in arms
                if any("reuse_share" in d for d in by[a].values())]
        row += [pct(by[a][k]["waste_share"]) if k in by[a] else "-" for a in arms]
        rows.append(row)
    return table(header, rows)


# ------------------------------------------------------------------------------------ A: tiers
def tiers(recs: dict[str, dict]) -> str:
    rows = []
    for label, r in recs.items():
        s = r["summary"]
        kv = s["kv"]
        tiers = kv.get("tiers", {})
        hit = {k: get(tiers, k, "hit_rate") for k in ("L1", "L2", "l3")}
        rows.append([label, r["tags"].get("prompts", "-"), sec(lat(r, "ttft", "p50")), sec(lat(r, "ttft", "p99")),
                     sec(lat(r, "ttft", "p999")), sec(lat(r, "e2e", "p99")), pct(get(kv, "prefix_hit_rate", "tokens")),
                     pct(hit["L1"]), pct(hit["L2"]), pct(hit["l3"]), sec(get(tiers, "fetch_wait_s", "mean")),
                     num(get(tiers, "L2", "preloaded", default=None)), num(s["requests"].get("preemptions")),
                     pct(kv["peak_usage"]), coverage(r, 1)])
    return table(["arm", "system prompts", "TTFT P50", "TTFT P99", "TTFT P99.9", "E2E P99", "prompt tokens reused",
                  "blocks hit in L1", "in L2", "in L3", "mean tier wait", "preloaded", "preemptions", "KV peak",
                  COVERAGE], rows)


# ------------------------------------------------------------------------------------------ B
def _order(recs: dict[str, dict], *keys) -> list[dict]:
    models = {"qwen3-4b": 0, "qwen3-8b": 1, "qwen3-14b": 2}
    return sorted(recs.values(), key=lambda r: tuple(models.get(r["tags"].get(k), r["tags"].get(k, 0))
                                                     if k == "model" else r["tags"].get(k, 0) for k in keys))


def closed_latency(recs: dict[str, dict]) -> str:
    rows = []
    for r in _order(recs, "model", "clients", "engine"):
        t = r["tags"]
        rows.append([t["model"], t["clients"], ENGINE_NAMES[t["engine"]]] +
                    [sec(lat(r, "ttft", p)) for p in ("p50", "p90", "p99")] +
                    [sec(lat(r, "e2e", p)) for p in ("p50", "p90", "p99")] +
                    [sec(lat(r, "tpot", "p50")), sec(lat(r, "itl", "p99")), coverage(r, 1)])
    return table(["model", "clients", "engine", "TTFT P50", "TTFT P90", "TTFT P99", "E2E P50", "E2E P90", "E2E P99",
                  "TPOT P50", "ITL P99", COVERAGE], rows)


def closed_throughput(recs: dict[str, dict]) -> str:
    rows = []
    for r in _order(recs, "model", "clients", "engine"):
        t, s = r["tags"], r["summary"]
        rows.append([t["model"], t["clients"], ENGINE_NAMES[t["engine"]], num(s["throughput"]["output_tok_per_s"]),
                     num(s["throughput"]["req_per_s"], 2), pct(s["kv"]["mean_usage"]), pct(s["kv"]["peak_usage"]),
                     pct(get(s, "kv", "of_allocated", "waste"), 2), num(s["requests"].get("preemptions")),
                     num(get(r, "jitter", "all", "e2e"), 3), num(get(r, "jitter", "all", "ttft"), 3), coverage(r, 1)])
    return table(["model", "clients", "engine", "output tok/s", "req/s", "KV mean", "KV peak",
                  "KV waste (of allocated)", "preemptions", "jitter E2E", "jitter TTFT",
                  COVERAGE], rows)


MIX_STREAMS = ("chat", "education", "code")


def mix_latency(recs: dict[str, dict], metric: str = "ttft") -> str:
    rows = []
    for r in _order(recs, "model", "engine"):
        t = r["tags"]
        for st in MIX_STREAMS:
            rows.append([t["model"], ENGINE_NAMES[t["engine"]], st] + [sec(lat(r, metric, p, st)) for p in PCTS] +
                        [num(get(r, "jitter", st, metric), 2), coverage(r, 1)])
    return table(["model", "engine", "stream"] + [f"{metric.upper()} {PCT_NAMES[p]}" for p in PCTS] +
                 ["jitter", f"{COVERAGE} (the run's)"], rows)


def mix_run(recs: dict[str, dict]) -> str:
    rows = []
    for r in _order(recs, "model", "engine"):
        t, s = r["tags"], r["summary"]
        rows.append([t["model"], ENGINE_NAMES[t["engine"]], num(s["requests"]["completed"]),
                     num(s["requests"]["in_flight"]),
                     num(s["throughput"]["req_per_s"], 2), num(s["throughput"]["output_tok_per_s"]),
                     pct(s["slo"]["attainment"]), pct(s["kv"]["peak_usage"]), pct(s["kv"]["mean_usage"]),
                     pct(get(s, "kv", "of_allocated", "waste"), 2), num(s["requests"].get("preemptions")),
                     num(get(r, "jitter", "all", "e2e"), 2), coverage(r, 1)])
    return table(["model", "engine", "completed", "in flight at 30 min", "req/s", "output tok/s", "SLO met",
                  "KV peak", "KV mean", "KV waste (of allocated)", "preemptions", "jitter E2E",
                  COVERAGE], rows)


def abnormal(recs: dict[str, dict], base: dict[str, dict]) -> str:
    rows = []
    for r in _order(recs, "model", "engine"):
        t, s = r["tags"], r["summary"]
        b = base.get(r["label"])
        ab = get(r, "streams", "abnormal") or {}
        rq = get(s, "by_stream", "abnormal", "requests") or {}
        cells = [t["model"], ENGINE_NAMES[t["engine"]], num(ab.get("arrived")), num(rq.get("completed")),
                 num(ab.get("rejected")), num(rq.get("in_flight")), num(s["requests"].get("preemptions")),
                 sec(lat(r, "ttft", "p50", "abnormal")), sec(lat(r, "ttft", "p99", "abnormal"))]
        for st in MIX_STREAMS:
            with_ = lat(r, "ttft", "p99", st)
            without = lat(b, "ttft", "p99", st) if b else None
            cells.append(f"{sec(without)} -> {sec(with_)}")
        base_rate = f" ({num(b['summary']['throughput']['req_per_s'], 2)})" if b else ""
        cells += [num(s["throughput"]["req_per_s"], 2) + base_rate,
                  pct(s["kv"]["peak_usage"]), coverage(r, 1)]
        rows.append(cells)
    return table(["model", "engine", "abnormal arrived", "completed", "rejected", "in flight at 30 min",
                  "preemptions (all)",
                  "abnormal TTFT P50", "abnormal TTFT P99", "chat TTFT P99 (without -> with)",
                  "education TTFT P99", "code TTFT P99", "req/s (without)", "KV peak", COVERAGE], rows)


def waits(recs: dict[str, dict]) -> str:
    """Why requests waited (the summary's blockage shares), per run."""
    causes = ("kv_blocks", "token_budget", "batch_slots", "iteration", "preempted")
    rows = []
    for r in _order(recs, "model", "engine"):
        t, b = r["tags"], get(r["summary"], "blockage", "all") or {}
        share = b.get("share", {})
        rows.append([t["model"], ENGINE_NAMES[t["engine"]], num(b.get("waiting_s"))] +
                    [pct(share.get(c), 0) for c in causes])
    return table(["model", "engine", "waiting s (all requests)", "no free KV", "token budget", "batch slots",
                  "iteration boundary", "preempted"], rows)


def knobs(recs: dict[str, dict]) -> str:
    rows = []
    order = {"off": 0, "128": 1, "256": 2, "512": 3}
    def key(r):
        return r["tags"]["engine"] != "vllm", r["tags"]["block"], order.get(r["tags"]["chunk"], 9)

    for r in sorted(recs.values(), key=key):
        t, s = r["tags"], r["summary"]
        rows.append([ENGINE_NAMES[t["engine"]], t["block"], t["chunk"], sec(lat(r, "ttft", "p50")),
                     sec(lat(r, "ttft", "p99")),
                     sec(lat(r, "ttft", "p999")), sec(lat(r, "tpot", "p99")), sec(lat(r, "itl", "p99")),
                     sec(lat(r, "e2e", "p99")), num(s["throughput"]["req_per_s"], 2), num(s["requests"]["in_flight"]),
                     pct(get(s, "kv", "of_allocated", "waste"), 2), num(s["requests"].get("preemptions")),
                     num(get(r, "jitter", "all", "ttft"), 2), coverage(r, 1)])
    return table(["engine", "block", "chunk", "TTFT P50", "TTFT P99", "TTFT P99.9", "TPOT P99", "ITL P99", "E2E P99",
                  "req/s", "in flight at 30 min", "KV waste (of allocated)", "preemptions", "jitter TTFT",
                  COVERAGE], rows)
