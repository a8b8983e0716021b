"""The plan's page: the cost of every answered option against its binding SLO's headroom (the
Pareto front marked), and the ranked table. ``servesim plan --out DIR`` writes it as
``DIR/report.html`` (offline, servesim/report/page.py) and, with --format png, static charts.

Why this chart: each option's answer is the fewest replicas meeting every SLO, so its tail sits
just under the bound; what separates options is what they cost and how much room they leave. An
option is on the front when no other is both cheaper (or as cheap) and roomier.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

import pandas as pd

from servesim.report.charts import Figure, records
from servesim.report.page import render, write_outputs


def option_frame(result: dict) -> pd.DataFrame:
    """One row per answered option: cost, headroom, replicas, the choices as text."""
    rows = []
    for o in result["options"]:
        if o.get("replicas") is None or o.get("refused"):
            continue
        rows.append({"option": ", ".join(f"{k.split('.')[-1]}={v}" for k, v in o["values"].items()) or "(base)",
                     "cost_per_hour": float(o["cost_per_hour"]), "headroom": float(o["headroom"]),
                     "replicas": int(o["replicas"]), "gpus": int(o["replicas"]) * int(o["gpus_per_replica"]),
                     "gpu": o["gpu"], "binding": o["binding"]})
    df = pd.DataFrame(rows)
    if len(df):
        df = df.sort_values(["cost_per_hour", "headroom"], ascending=[True, False]).reset_index(drop=True)
        best_room = -float("inf")
        front = []
        for room in df["headroom"]:  # cheapest first: on the front when roomier than every cheaper one
            front.append(room > best_room)
            best_room = max(best_room, room)
        df["pareto"] = front
    return df


def pareto_figure(result: dict) -> Figure | None:
    import altair as alt

    df = option_frame(result)
    if df.empty:
        return None
    cur = result.get("currency", "USD")
    base = alt.Chart(alt.Data(values=records(df)))
    points = base.mark_point(filled=True, size=90).encode(
        x=alt.X("cost_per_hour:Q", title=f"cost ({cur} per hour)", scale=alt.Scale(zero=False)),
        y=alt.Y("headroom:Q", title="headroom of the binding SLO at the answer", axis=alt.Axis(format="%")),
        color=alt.Color("gpu:N", title="GPU"),
        shape=alt.Shape("pareto:N", title="on the front"),
        tooltip=["option:N", "cost_per_hour:Q", "replicas:Q", "gpus:Q", "binding:N",
                 alt.Tooltip("headroom:Q", format=".1%")])
    front = base.transform_filter("datum.pareto").mark_line(color="#444", strokeDash=[4, 3]).encode(
        x="cost_per_hour:Q", y="headroom:Q")
    return Figure("pareto", "Cost against headroom (every answered option)", (front + points).properties(
        width=640, height=360), caption="Each point is an option at its fewest replicas meeting every SLO; the "
        "dashed line joins the options no other beats on both cost and headroom.")


def _table_html(result: dict, top: int) -> str:
    cur = escape(result.get("currency", "USD"))
    rows = []
    for i, o in enumerate(result["options"][:max(top, 1) * 4], 1):
        choice = escape(", ".join(f"{k}={v}" for k, v in o["values"].items()) or "(base)")
        if o.get("replicas") is not None and not o.get("refused"):
            cells = (f"<td>{o['cost_per_hour']:,.2f}</td><td>{o['replicas']} x {o['gpus_per_replica']} "
                     f"{escape(str(o['gpu']))}</td><td>{escape(o['binding'])}</td><td>{o['headroom']:.1%}</td>")
        else:
            cells = f"<td colspan=4>{escape(str(o.get('refused')))}</td>"
        rows.append(f"<tr><td>{i}</td><td>{choice}</td>{cells}</tr>")
    return (f"<table><tr><th>#</th><th>option</th><th>{cur}/h</th><th>fleet</th><th>binding SLO</th>"
            f"<th>headroom</th></tr>{''.join(rows)}</table>")


def write_plan_report(result: dict, folder: Path, formats: tuple[str, ...] = ("html",)) -> list[Path]:
    fig = pareto_figure(result)
    sections = [("Options", [fig])] if fig is not None else []
    sub = (f"{result['method']} over {result['space_size']} options; SLOs: {', '.join(result['slos'])}; "
           f"prices in {result.get('currency', 'USD')} per GPU-hour (the plan's price file)")
    return write_outputs(sections, folder, formats,
                         lambda: render(f"plan: {result['name']}", sub, _table_html(result, 5), sections))
