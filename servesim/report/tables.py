"""HTML tables and header blocks of the reports: summary, per class, deltas, provenance.

Everything a user wrote (scenario names, class labels, notes, YAML) is escaped; the figures are
those of summary.json, formatted as the console prints them.
"""

from __future__ import annotations

import hashlib
import math
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from servesim.metrics.stats import PCT_KEYS
from servesim.report.rundata import finite

if TYPE_CHECKING:
    from servesim.report.rundata import RunData

PCT_TITLES = {"p50": "P50", "p90": "P90", "p95": "P95", "p99": "P99", "p999": "P99.9"}


def table(head: Iterable[str], rows: Iterable[Iterable[str]], cls: str = "") -> str:
    """A table of already-escaped cells (numbers right-aligned by the stylesheet)."""
    h = "".join(f"<th>{c}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>'


def ms(x) -> str:
    v = finite(x)
    return "–" if v is None else f"{v * 1e3:,.1f}"


def num(x, fmt: str = ",.3g") -> str:
    v = finite(x)
    return "–" if v is None else format(v, fmt)


def pct(x, digits: int = 1) -> str:
    v = finite(x)
    return "–" if v is None else f"{v:.{digits}%}"


def dig(d: dict, path: tuple[str, ...]):
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


# ---------------------------------------------------------------------------------- one run
def summary_block(run: "RunData") -> str:
    s = run.summary
    r, t, slo = s["requests"], s["throughput"], s["slo"]
    lines = [
        f"<b>requests</b> {r['arrived']:,} arrived, {r['completed']:,} completed, {r['rejected']:,} rejected, "
        f"{r['in_flight']:,} in flight; {r['measured']:,} measured (after {r.get('warmup', 0):,} warm-up); "
        f"{r['preemptions']:,} preemptions"
        + (f"; rejected by reason: {escape(str(r['rejected_by_reason']))}" if r.get("rejected_by_reason") else ""),
        f"<b>throughput</b> {num(t['req_per_s'], ',.3f')} req/s, {num(t['output_tok_per_s'], ',.0f')} output tok/s, "
        f"{num(t['input_tok_per_s'], ',.0f')} input tok/s; <b>goodput</b> {num(t['goodput_req_per_s'], ',.3f')} req/s "
        f"(SLO TTFT &le; {num(slo['ttft_s'], 'g')} s, TPOT &le; {num(slo['tpot_s'], 'g')} s: "
        f"{pct(slo['attainment'])} met)",
    ]
    kv, e = s.get("kv", {}), s.get("engine", {})
    if kv:
        line = (f"<b>KV</b> {kv['blocks_total']:,} blocks; peak {pct(kv['peak_usage'])}, time-mean "
                f"{pct(kv['mean_usage'])}")
        alloc = kv.get("of_allocated") or {}
        if finite(alloc.get("internal_fragmentation")) is not None:
            line += (f"; of allocated KV: internal fragmentation {pct(alloc['internal_fragmentation'])}, "
                     f"reserved-unused {pct(alloc['reservation_waste'])}")
        ext = finite(dig(kv, ("external_fragmentation", "mean")))
        if ext:
            line += f"; external fragmentation {pct(ext)} of the pool"
        hit = finite(dig(kv, ("prefix_hit_rate", "tokens")))
        if hit is not None:
            line += f"; prefix-cache hits {pct(hit)} of looked-up tokens"
        lines.append(line)
    if e:
        lines.append(f"<b>engine</b> {e['iterations']:,} iterations, busy {pct(e['busy_fraction'])}, mean "
                     f"{num(e['mean_running'], ',.1f')} running, {num(e['mean_batch_tokens'], ',.0f')} "
                     f"tokens/iteration; "
                     f"simulated {num(s.get('sim_time_s'), ',.1f')} s in {num(s.get('wall_s'), ',.2f')} s wall")
    return "".join(f"<p>{x}</p>" for x in lines)


def latency_table(summary: dict) -> str:
    rows = []
    for name in ("ttft", "tpot", "itl", "e2e", "queue"):
        d = summary["latency_s"].get(name) or {}
        rows.append([name.upper() if name != "queue" else "queue"] + [ms(d.get(k)) for k in ("mean",) + PCT_KEYS]
                    + [ms(d.get("max")), f"{d.get('count', 0):,}"])
    return table(["latency (ms)", "mean"] + [PCT_TITLES[k] for k in PCT_KEYS] + ["max", "n"], rows, "num")


def class_table(summary: dict) -> str:
    """One row per class: counts, P99 tails (ms), goodput share, SLO verdicts."""
    by = summary.get("by_class") or {}
    if len(by) < 2 and "by_stream" not in summary:
        return ""
    rows = []
    for name, c in by.items():
        r, lat, slo = c["requests"], c["latency_s"], c.get("slo") or {}
        met = slo.get("met") or {}
        verdict = ", ".join(f"{escape(k)} " + ("–" if m.get("met") is None else ("ok" if m["met"] else "MISS"))
                            for k, m in met.items()) if met else "–"
        rows.append([escape(name), escape(", ".join(c.get("streams", []))), f"{r['completed']:,}", f"{r['rejected']:,}",
                     ms(lat["ttft"]["p99"]), ms(lat["tpot"]["p99"]), ms(lat["e2e"]["p99"]),
                     num(c["throughput"]["goodput_req_per_s"], ",.3f"), pct(slo.get("attainment")), verdict])
    return table(["class", "streams", "done", "rejected", "TTFT P99 (ms)", "TPOT P99 (ms)", "E2E P99 (ms)",
                  "goodput (req/s)", "good", "SLO"], rows, "num")


def replica_table(summary: dict) -> str:
    """The scalar load-balance figures of ``summary.cluster`` (per-replica figures are charted)."""
    cl = summary.get("cluster")
    if not isinstance(cl, dict):
        return ""
    rows = [[escape(k), escape(num(v, ",.4g") if finite(v) is not None else str(v))]
            for k, v in cl.items() if k != "replicas" and not isinstance(v, (dict, list))]
    return table(["cluster", "value"], rows) if rows else ""


def pack_provenance(summary: dict) -> str:
    """The calibration pack a run used, with the provenance its YAML records, and whether the
    pack installed here is still the one the run used (same digest)."""
    pid = dig(summary, ("resolved_scenario", "calibration_pack"))
    label = dig(summary, ("step_model", "label"))  # servesim/perf/select.py (runs since issue 28)
    step = f"<p><b>step time</b> {escape(str(label))}</p>" if label else ""
    if not pid:
        return step + "<p><b>calibration pack</b> none: the step-time model is analytical (roofline or constant)</p>"
    name, _, digest = str(pid).partition(" sha256:")
    out = step + f"<p><b>calibration pack</b> <code>{escape(str(pid))}</code></p>"
    from servesim.perf.pack import pack_root

    csv_path = pack_root() / f"{name}.csv"
    yaml_path = csv_path.with_suffix(".yaml")
    if not yaml_path.is_file():
        return out + f"<p>(its files are not installed here: {escape(str(csv_path))})</p>"
    import yaml

    try:
        meta = yaml.safe_load(yaml_path.read_text()) or {}
    except yaml.YAMLError:
        meta = {}
    now = hashlib.sha256()
    for p in (csv_path, yaml_path):
        if p.is_file():
            now.update(hashlib.sha256(p.read_bytes()).hexdigest().encode())
    same = now.hexdigest()[:16] == digest
    rows = [[escape(k), escape(str(meta[k]))] for k in
            ("gpu", "model", "tp", "dtype", "source", "origin", "device", "method", "date", "license", "command")
            if k in meta]
    state = ("the pack installed here is the one the run used" if same else
             "<b>the pack installed here differs from the one the run used</b> (the provenance below is today's)")
    return out + f"<p>{state}</p>" + table(["field", "value"], rows, "kv")


def scenario_glance(resolved_yaml: str, limit: int = 320) -> str:
    """Each top-level block of the resolved scenario on one line (YAML flow style, long blocks
    cut at ``limit`` characters; the whole file follows in a collapsed block)."""
    import yaml

    try:
        data = yaml.safe_load(resolved_yaml) if resolved_yaml else None
    except yaml.YAMLError:
        data = None
    if not isinstance(data, dict):
        return ""
    rows = []
    for key, value in data.items():
        text = yaml.safe_dump(value, default_flow_style=True, width=1 << 16, sort_keys=False).strip()
        text = text.removesuffix("...").strip()
        if len(text) > limit:
            text = text[: limit - 1] + "…"
        rows.append([escape(str(key)), f"<code>{escape(text)}</code>"])
    return table(["scenario", "as simulated"], rows, "kv")


# ------------------------------------------------------------------------------ comparisons
# (label, summary path, format, lower is better?) of the comparison table
DELTA_METRICS: list[tuple[str, tuple[str, ...], Callable, bool | None]] = [
    ("TTFT P50 (ms)", ("latency_s", "ttft", "p50"), ms, True),
    ("TTFT P99 (ms)", ("latency_s", "ttft", "p99"), ms, True),
    ("TTFT P99.9 (ms)", ("latency_s", "ttft", "p999"), ms, True),
    ("TPOT P50 (ms)", ("latency_s", "tpot", "p50"), ms, True),
    ("TPOT P99 (ms)", ("latency_s", "tpot", "p99"), ms, True),
    ("ITL P99 (ms)", ("latency_s", "itl", "p99"), ms, True),
    ("E2E P50 (ms)", ("latency_s", "e2e", "p50"), ms, True),
    ("E2E P99 (ms)", ("latency_s", "e2e", "p99"), ms, True),
    ("queue mean (ms)", ("latency_s", "queue", "mean"), ms, True),
    ("throughput (req/s)", ("throughput", "req_per_s"), lambda x: num(x, ",.3f"), False),
    ("output tokens/s", ("throughput", "output_tok_per_s"), lambda x: num(x, ",.0f"), False),
    ("goodput (req/s)", ("throughput", "goodput_req_per_s"), lambda x: num(x, ",.3f"), False),
    ("SLO attainment", ("slo", "attainment"), pct, False),
    ("completed", ("requests", "completed"), lambda x: num(x, ",.0f"), False),
    ("rejected", ("requests", "rejected"), lambda x: num(x, ",.0f"), True),
    ("preemptions", ("requests", "preemptions"), lambda x: num(x, ",.0f"), True),
    ("KV peak usage", ("kv", "peak_usage"), pct, None),
    ("KV mean usage", ("kv", "mean_usage"), pct, None),
    ("KV waste of allocated", ("kv", "of_allocated", "waste"), pct, True),
    ("busy share", ("engine", "busy_fraction"), pct, None),
    ("mean running", ("engine", "mean_running"), lambda x: num(x, ",.1f"), None),
    ("waiting (s, all)", ("blockage", "all", "waiting_s"), lambda x: num(x, ",.1f"), True),
]


def delta(base, other) -> float | None:
    """Relative change ``other / base - 1``; None when undefined (a missing value, base 0)."""
    b, o = finite(base), finite(other)
    if b is None or o is None or b == 0:
        return None
    return o / b - 1


def delta_rows(runs: list["RunData"]) -> list[dict]:
    """Rows of the comparison table: each metric for every run, and each run's change against
    the first (the baseline). Per-class P99 TTFT rows for classes every run has."""
    metrics = list(DELTA_METRICS)
    common = [c for c in runs[0].classes if all(c in r.classes for r in runs[1:])]
    if len(common) > 1:
        for c in common:
            metrics.append((f"TTFT P99 (ms) @{c}", ("by_class", c, "latency_s", "ttft", "p99"), ms, True))
            metrics.append((f"goodput (req/s) @{c}", ("by_class", c, "throughput", "goodput_req_per_s"),
                            lambda x: num(x, ",.3f"), False))
    out = []
    for label, path, fmt, lower in metrics:
        vals = [dig(r.summary, path) for r in runs]
        if all(finite(v) is None for v in vals):
            continue
        out.append({"metric": label, "values": vals, "text": [fmt(v) for v in vals],
                    "delta": [None] + [delta(vals[0], v) for v in vals[1:]], "lower_is_better": lower})
    return out


def delta_table(runs: list["RunData"]) -> str:
    head = ["metric", f"{escape(runs[0].label)} (baseline)"]
    for r in runs[1:]:
        head += [escape(r.label), "Δ"]
    rows = []
    for row in delta_rows(runs):
        cells = [escape(row["metric"]), row["text"][0]]
        for text, d in zip(row["text"][1:], row["delta"][1:]):
            cells.append(text)
            if d is None:
                cells.append("–")
                continue
            better = row["lower_is_better"]
            cls = "" if better is None or abs(d) < 1e-12 else ("better" if (d < 0) == better else "worse")
            cells.append(f'<span class="{cls}">{d:+.1%}</span>' if math.isfinite(d) else "–")
        rows.append(cells)
    return table(head, rows, "num delta")


def same_scenario_note(runs: list["RunData"]) -> str:
    """Runs from the same resolved scenario (same hash) differ only by seed or by nothing."""
    hashes = [dig(r.summary, ("resolved_scenario", "sha256")) for r in runs]
    if all(hashes) and len(set(hashes)) == 1:
        return "<p>All runs share one resolved scenario (same SHA-256): they differ by nothing but wall time.</p>"
    return ""


def folder_text(folder: Path | None) -> str:
    return escape(str(folder)) if folder is not None else "(in memory)"
