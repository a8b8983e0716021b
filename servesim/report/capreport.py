"""The capacity search's page: ``servesim report CAP.json`` (the JSON ``servesim capacity --out``
writes) draws, per SLO, the metric at every probe with its interval against the rate (or replica
count), the SLO line, each probe's verdict and, for a max-rate search, the crossing with its
interval: where the answer lies and how sure it is, at a glance.
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path

from servesim.errors import ReportError
from servesim.report.charts import Figure
from servesim.report.page import parse_formats, render, write_outputs


def read_capacity(path: Path) -> dict:
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ReportError(f"{path}: not a capacity search's JSON ({exc})") from None
    if not isinstance(d, dict) or "find" not in d or not isinstance(d.get("path"), list):
        raise ReportError(f"{path}: not a capacity search's JSON (servesim capacity --out FILE writes one)")
    return d


def is_capacity_json(path: Path) -> bool:
    p = Path(path)
    if not (p.is_file() and p.suffix == ".json"):
        return False
    try:
        d = json.loads(p.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(d, dict) and "find" in d and "path" in d


def _x(d: dict, probe: dict) -> float:
    if d["find"] == "max-rate":
        r = probe.get("rate_req_per_s") or probe.get("measured_req_per_s")
        return float(r) if r is not None else float(probe["x"])
    return float(probe["x"])


def slo_figures(d: dict) -> list[Figure]:
    import altair as alt

    xname = "rate (req/s)" if d["find"] == "max-rate" and d.get("base_rate_req_per_s") else (
        "rate scale" if d["find"] == "max-rate" else "replicas")
    figs = []
    for slo in d["slos"]:
        metric, op, bound = slo.split(" ", 2)
        rows = []
        for i, p in enumerate(d["path"], 1):
            c = p["slos"].get(slo)
            if c is None or c.get("estimate") is None:
                continue
            rows.append({"probe": i, "x": _x(d, p), "estimate": c["estimate"],
                         "lo": max(c["lo"], 0.0) if c.get("lo") is not None else c["estimate"],
                         "hi": c["hi"] if c.get("hi") is not None else c["estimate"],
                         "verdict": c["verdict"], "runs": p["replications"]})
        if not rows:
            continue
        data = alt.Data(values=rows)
        xs = alt.X("x:Q", title=xname, scale=alt.Scale(type="log" if d["find"] == "max-rate" else "linear",
                                                         zero=False))
        color = alt.Color("verdict:N", scale=alt.Scale(domain=["pass", "open", "fail"],
                                                       range=["#2ca02c", "#ff7f0e", "#d62728"]))
        bars = alt.Chart(data).mark_rule().encode(x=xs, y=alt.Y("lo:Q", title=metric), y2="hi:Q", color=color)
        pts = alt.Chart(data).mark_point(filled=True, size=70).encode(
            x="x:Q", y="estimate:Q", color=color, tooltip=["probe:Q", "x:Q", "estimate:Q", "lo:Q", "hi:Q",
                                                          "verdict:N", "runs:Q"])
        sl = alt.Data(values=[{"slo": float(bound), "label": f"SLO {slo}"}])
        rule = alt.Chart(sl).mark_rule(color="#d62728", strokeDash=[6, 4]).encode(y="slo:Q")
        layers = [bars, pts, rule]
        c = d.get("crossing")
        if c and c.get("slo") == slo and c.get("rate_req_per_s") is not None:
            cr = alt.Data(values=[{"x": c["rate_req_per_s"], "lo": c["rate_lo"], "hi": c["rate_hi"]}])
            layers.append(alt.Chart(cr).mark_rect(opacity=0.15, color="#1f77b4").encode(x="lo:Q", x2="hi:Q"))
            layers.append(alt.Chart(cr).mark_rule(color="#1f77b4").encode(x="x:Q"))
        figs.append(Figure(f"capacity-{metric}", f"{slo}: every probe", alt.layer(*layers).properties(
            width=560, height=300), "Each probe's estimate with its interval, coloured by verdict; dashed: the SLO; "
            "blue line and band: the crossing and its interval (the answer)."))
    return figs


def _summary_html(d: dict) -> str:
    if not d.get("answered"):
        return f"<p><b>No answer:</b> {escape(str(d.get('refused')))}</p>"
    c = d.get("crossing")
    a = d["answer"]
    parts = []
    if c and c.get("rate_req_per_s") is not None:
        parts.append(f"<p><b>Capacity:</b> {c['rate_req_per_s']:.4g} req/s ({c['confidence']:.0%} interval "
                     f"{c['rate_lo']:.4g} .. {c['rate_hi']:.4g}), where {escape(c['slo'])} crosses its bound.</p>")
    what = (f"{a['rate_req_per_s']:.4g} req/s" if a.get("rate_req_per_s") is not None else f"{a['x']:g}")
    parts.append(f"<p>Verified to meet every SLO: {escape(what)} after {a['replications']} replications.</p>")
    if d.get("precision_note"):
        parts.append(f"<p class=\"note\">{escape(d['precision_note'])}</p>")
    sm = d.get("step_model") or {}
    if sm.get("label"):
        parts.append(f"<p>Step time: {escape(sm['label'])}</p>")
    return "\n".join(parts)


def write_capacity_report(path: str | Path, formats=("html",), out: str | Path | None = None) -> list[Path]:
    """Into ``out`` (default: a folder ``<name>-report`` beside the JSON, so a run folder's own
    report.html is never overwritten)."""
    fmts = parse_formats(formats)
    d = read_capacity(Path(path))
    figs = slo_figures(d)
    sections = [("Probes", figs)] if figs else []
    target = Path(out) if out is not None else Path(path).with_name(Path(path).stem + "-report")
    sub = f"{d['find']} subject to {', '.join(d['slos'])}"
    return write_outputs(sections, target, fmts,
                         lambda: render(f"servesim capacity · {Path(path).name}", sub, _summary_html(d), sections))
