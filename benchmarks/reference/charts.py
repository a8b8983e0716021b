"""The charts of docs/reference-experiments.md: altair specs from the runs' records, rendered to
PNG without a browser by vl-convert (as `servesim report --format png` does).

One function per chart; each returns an altair chart, or None when its runs are missing.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from benchmarks.reference.tables import ENGINE_NAMES, MIX_STREAMS, PCT_NAMES, get, lat

WIDTH = 220
HEIGHT = 160


def _alt():
    import altair as alt

    return alt


def save_png(chart, path: Path, scale: float = 1.5) -> Path:
    import vl_convert as vlc

    from servesim.report.page import vl_version

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_bytes(vlc.vegalite_to_png(chart.to_dict(), vl_version=vl_version(), scale=scale))
    tmp.replace(path)
    return path


def _log_y(title: str):
    alt = _alt()
    return alt.Y("seconds:Q", title=title, scale=alt.Scale(type="log"))


def _floor():
    """Bars on a log axis start from 1 ms (a bar from 0 has no length there)."""
    return _alt().datum(1e-3)


def fleet(recs: dict[str, dict]):
    """TTFT percentiles per stream and arm, on a log axis, with each stream's SLO."""
    alt = _alt()
    rows = []
    for r in recs.values():
        arm = f"{ENGINE_NAMES[r['tags']['engine']]} {r['tags']['model']}"
        for st, metric, bound in (("chat", "ttft", 0.8), ("summaries", "ttft", 2.0), ("sql", "e2e", 5.0)):
            for p in ("p50", "p99", "p999"):
                v = lat(r, metric, p, st)
                if v is not None:
                    rows.append({"arm": arm, "stream": f"{st} ({metric.upper()})", "percentile": PCT_NAMES[p],
                                 "seconds": v, "slo": bound})
    if not rows:
        return None
    d = pd.DataFrame(rows)
    base = alt.Chart().encode(x=alt.X("arm:N", title=None))
    bars = base.mark_bar().encode(
        xOffset=alt.XOffset("percentile:N", sort=["P50", "P99", "P99.9"]),
        y=_log_y("latency (s, log)"), y2=_floor(), color=alt.Color("percentile:N", sort=["P50", "P99", "P99.9"]),
        tooltip=["arm", "stream", "percentile", alt.Tooltip("seconds:Q", format=".3f")])
    rule = alt.Chart().mark_rule(color="red", strokeDash=[4, 3]).encode(y="slo:Q")
    return alt.layer(bars, rule, data=d).properties(width=WIDTH, height=HEIGHT).facet(
        column=alt.Column("stream:N", title="stream (its SLO dashed)")).properties(
        title="Experiment A: latency per stream at the offered load")


def sessions(recs: dict[str, dict]):
    alt = _alt()
    rows = []
    for arm, r in recs.items():
        for d in r.get("rounds", []):
            rows.append({"arm": arm, "round": d["round"], "what": "TTFT P50", "seconds": d["ttft_p50"]})
            rows.append({"arm": arm, "round": d["round"], "what": "TTFT P99", "seconds": d["ttft_p99"]})
    if not rows:
        return None
    d = pd.DataFrame(rows)
    return alt.Chart(d).mark_line(point=True).encode(
        x=alt.X("round:O"), y=_log_y("TTFT (s, log)"), color="arm:N",
        tooltip=["arm", "round", "what", alt.Tooltip("seconds:Q", format=".3f")]).properties(
        width=WIDTH, height=HEIGHT).facet(column=alt.Column("what:N", title=None)).properties(
        title="10-round sessions: TTFT per round, by KV manager")


def tiers(recs: dict[str, dict]):
    alt = _alt()
    rows = []
    for arm, r in recs.items():
        for p in ("p50", "p99", "p999"):
            v = lat(r, "ttft", p)
            if v is not None:
                rows.append({"arm": arm, "percentile": PCT_NAMES[p], "seconds": v})
    if not rows:
        return None
    d = pd.DataFrame(rows)
    order = list(recs)
    return alt.Chart(d).mark_bar().encode(
        x=alt.X("arm:N", sort=order, title=None), xOffset=alt.XOffset("percentile:N", sort=["P50", "P99", "P99.9"]),
        y=_log_y("TTFT (s, log)"), y2=_floor(), color=alt.Color("percentile:N", sort=["P50", "P99", "P99.9"]),
        tooltip=["arm", "percentile", alt.Tooltip("seconds:Q", format=".3f")]).properties(
        width=480, height=HEIGHT, title="KV tiers under a 2,048-block GPU pool: TTFT")


def closed(recs: dict[str, dict]):
    alt = _alt()
    rows = []
    for r in recs.values():
        t, s = r["tags"], r["summary"]
        e = ENGINE_NAMES[t["engine"]]
        rows.append({"model": t["model"], "engine": e, "clients": t["clients"], "what": "output tokens/s",
                     "value": s["throughput"]["output_tok_per_s"]})
        rows.append({"model": t["model"], "engine": e, "clients": t["clients"], "what": "E2E P99 (s)",
                     "value": lat(r, "e2e", "p99")})
        rows.append({"model": t["model"], "engine": e, "clients": t["clients"], "what": "TTFT P99 (s)",
                     "value": lat(r, "ttft", "p99")})
    if not rows:
        return None
    d = pd.DataFrame(rows)
    return alt.Chart(d).mark_line(point=True).encode(
        x=alt.X("clients:Q", scale=alt.Scale(type="log", base=2), axis=alt.Axis(values=[8, 16, 32, 64])),
        y=alt.Y("value:Q", title=None), color="engine:N", strokeDash="model:N", shape="model:N",
        tooltip=["model", "engine", "clients", "what", alt.Tooltip("value:Q", format=".3f")]).properties(
        width=WIDTH, height=HEIGHT).facet(column=alt.Column("what:N", title=None)).resolve_scale(
        y="independent").properties(title="B1: closed loop, 2,048 in / 512 out, one A100-80GB")


def mix(recs: dict[str, dict], abnormal: dict[str, dict] | None = None):
    alt = _alt()
    rows = []
    for kind, rs in (("mix", recs), ("mix + 10% abnormal", abnormal or {})):
        for r in rs.values():
            t = r["tags"]
            for st in MIX_STREAMS:
                v = lat(r, "ttft", "p99", st)
                if v is not None:
                    rows.append({"model": t["model"], "engine": ENGINE_NAMES[t["engine"]], "stream": st,
                                 "workload": kind, "seconds": v})
    if not rows:
        return None
    d = pd.DataFrame(rows)
    return alt.Chart(d).mark_bar().encode(
        x=alt.X("stream:N", title=None, sort=list(MIX_STREAMS)), xOffset="engine:N",
        y=_log_y("TTFT P99 (s, log)"), y2=_floor(), color="engine:N",
        tooltip=["model", "engine", "stream", "workload", alt.Tooltip("seconds:Q", format=".3f")]).properties(
        width=160, height=HEIGHT).facet(row=alt.Row("workload:N", title=None), column=alt.Column(
            "model:N", sort=["qwen3-4b", "qwen3-8b", "qwen3-14b"], title=None)).properties(
        title="B2/B3: TTFT P99 per stream, 30 simulated minutes at 1.5 req/s")


def knobs(recs: dict[str, dict]):
    alt = _alt()
    rows = []
    for r in recs.values():
        t = r["tags"]
        for metric, p, what in (("ttft", "p99", "TTFT P99"), ("itl", "p99", "ITL P99"), ("e2e", "p99", "E2E P99")):
            v = lat(r, metric, p)
            if v is not None:
                rows.append({"engine": ENGINE_NAMES[t["engine"]], "block": f"block {t['block']}", "chunk": t["chunk"],
                             "what": what, "seconds": v})
    if not rows:
        return None
    d = pd.DataFrame(rows)
    return alt.Chart(d).mark_line(point=True).encode(
        x=alt.X("chunk:N", sort=["128", "256", "512", "off"], title="prefill chunk (tokens)"),
        y=_log_y("seconds (log)"), color="engine:N", strokeDash="block:N",
        tooltip=["engine", "block", "chunk", "what", alt.Tooltip("seconds:Q", format=".3f")]).properties(
        width=WIDTH, height=HEIGHT).facet(column=alt.Column("what:N", title=None)).resolve_scale(
        y="independent").properties(title="B4: knobs on the 3:5:2 mix, Qwen3-8B")
