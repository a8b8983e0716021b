"""Charts of a sweep: heatmaps over two axes, metric-vs-parameter lines with confidence
intervals, and the Pareto frontier of two metrics.

Every chart draws per-point statistics over the point's replications (seeds): the mean and a
95 % Student-t interval (docs/sweeps.md explains why a t interval over independent replications).
Axes other than the ones a chart is drawn over are not averaged away: each combination of their
values gets its own line or panel ("others"), so no chart mixes configurations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from servesim.report.charts import HEIGHT, NARROW, Figure, _data
from servesim.report.curves import pareto_front
from servesim.report.sweepdata import SweepData, derived_columns, direction, is_numeric_axis, point_stats, slo_line

if TYPE_CHECKING:
    import pandas as pd

MAX_CELLS = 16  # an axis with more distinct values is drawn on a continuous scale


def short(path: str, axes: list[str]) -> str:
    """``rate`` for ``workload.arrival.rate`` unless another axis ends the same way."""
    tail = path.rsplit(".", 1)[-1]
    return tail if sum(a.rsplit(".", 1)[-1] == tail for a in axes) == 1 else path


def fmt_value(v) -> str:
    if isinstance(v, (float, np.floating)):
        return f"{v:.6g}"
    return str(v)


def with_others(stats: "pd.DataFrame", sd: SweepData, shown: list[str]) -> "pd.DataFrame":
    """Add ``others``: the values of the axes a chart does not draw, as one label per point; the
    rows come sorted by those values (numbers as numbers: 256 before 1024), so the labels' first
    appearance is the order panels and legends use (:func:`others_order`)."""
    rest = [a for a in sd.axes if a not in shown]
    if not rest:
        return stats.assign(others="all points")
    keys = [stats[a] if is_numeric_axis(sd, a) else stats[a].astype(str) for a in rest]
    order = np.lexsort([k.to_numpy() for k in reversed(keys)])
    stats = stats.iloc[order].reset_index(drop=True)
    labels = stats[rest].apply(lambda r: ", ".join(f"{short(a, sd.axes)}={fmt_value(r[a])}" for a in rest), axis=1)
    return stats.assign(others=labels.to_numpy())


def others_order(st: "pd.DataFrame") -> list[str]:
    """Panel and legend order: as :func:`with_others` sorted them (never alphabetical text)."""
    return list(dict.fromkeys(st["others"]))


MAX_PANELS = 12  # more combinations of the other axes than this: a sampled design (no panels)


def slo_rule(sd: SweepData, metric: str, y_title: str | None = None):
    """A dashed horizontal line at the metric's SLO, labelled (None when it has none)."""
    import altair as alt

    line = slo_line(sd, metric)
    if line is None:
        return None
    value, label = line
    data = alt.Data(values=[{"slo": value, "label": label}])
    rule = alt.Chart(data).mark_rule(color="#d62728", strokeDash=[6, 4], size=1.5).encode(
        y=alt.Y("slo:Q", title=y_title or metric))
    text = alt.Chart(data).mark_text(align="left", dx=4, dy=-6, color="#d62728", fontSize=10).encode(
        y="slo:Q", x=alt.value(2), text="label:N")
    return alt.layer(rule, text)


def _axis_enc(sd: SweepData, axis: str, channel: str, many: bool):
    """Position encoding of an axis: continuous when there are too many values for cells,
    else ordered categories (numbers in numeric order)."""
    import altair as alt

    title = short(axis, sd.axes)
    numeric = is_numeric_axis(sd, axis)
    if numeric and many:
        return getattr(alt, channel)(f"{_field(axis)}:Q", title=title, scale=alt.Scale(zero=False))
    sort = sorted(sd.rows[axis].dropna().unique().tolist()) if numeric else None
    return getattr(alt, channel)(f"{_field(axis)}:O", title=title, sort=sort)


def _field(axis: str) -> str:
    """Vega-Lite reads dots in a field name as nesting: escape them."""
    return axis.replace(".", "\\.")


def heatmap_figures(sd: SweepData, metrics: list[str], x: str, y: str) -> list[Figure]:
    import altair as alt

    figs = []
    many = max(sd.rows[x].nunique(), sd.rows[y].nunique()) > MAX_CELLS
    for metric in metrics:
        st = with_others(point_stats(sd, metric), sd, [x, y])
        better = direction(metric)
        color = alt.Color("mean:Q", title=metric, scale=alt.Scale(scheme="viridis", reverse=better == "min"))
        tips = [alt.Tooltip(f"{_field(a)}:N", title=a) for a in sd.axes] + [
            alt.Tooltip("mean:Q", format=",.4~g", title=f"{metric} (mean)"), alt.Tooltip("lo:Q", format=",.4~g"),
            alt.Tooltip("hi:Q", format=",.4~g"), alt.Tooltip("n:Q", title="seeds")]
        xe, ye = _axis_enc(sd, x, "X", many), _axis_enc(sd, y, "Y", many)
        base = alt.Chart(_data(st))
        if many:
            chart = base.mark_circle(size=140).encode(x=xe, y=ye, color=color, tooltip=tips)
        else:
            rect = base.mark_rect().encode(x=xe, y=ye, color=color, tooltip=tips)
            text = base.mark_text(fontSize=10).encode(
                x=xe, y=ye, text=alt.Text("mean:Q", format=",.3~g"),
                color=alt.condition("datum.mean == null", alt.value("black"), alt.value("white")))
            chart = alt.layer(rect, text)
        chart = chart.properties(width=min(NARROW, 60 * max(3, sd.rows[x].nunique())) if not many else NARROW,
                                 height=min(HEIGHT, 36 * max(3, sd.rows[y].nunique())) if not many else HEIGHT)
        sampled = st["others"].nunique() > MAX_PANELS
        if sampled:  # every point its own combination (a sampled design): one panel of all points
            chart = base.mark_circle(size=110).encode(
                x=_axis_enc(sd, x, "X", True), y=_axis_enc(sd, y, "Y", True), color=color, tooltip=tips).properties(
                width=NARROW, height=HEIGHT)
        elif st["others"].nunique() > 1:
            chart = chart.facet(facet=alt.Facet("others:N", title=None, sort=others_order(st)), columns=3)
        figs.append(Figure(f"heatmap-{metric}", f"{metric} over {short(x, sd.axes)} x {short(y, sd.axes)}", chart,
                           f"Mean of {metric} over each point's seeds (tooltip: 95% t interval); "
                           f"{'brighter is better (lower)' if better == 'min' else 'brighter is better (higher)'}; "
                           + ("the other axes vary from point to point (a sampled design): all points in one "
                              "panel." if sampled else "one panel per value of the other axes."),
                           wide=1 < st["others"].nunique() <= MAX_PANELS))
    return figs


def line_figures(sd: SweepData, metrics: list[str], axes: list[str]) -> list[Figure]:
    import altair as alt

    figs = []
    for metric in metrics:
        for x in axes:
            if sd.rows[x].nunique() < 2:
                continue
            st = with_others(point_stats(sd, metric), sd, [x])
            numeric = is_numeric_axis(sd, x)
            xe = alt.X(f"{_field(x)}:{'Q' if numeric else 'O'}", title=short(x, sd.axes),
                       scale=alt.Scale(zero=False) if numeric else alt.Undefined)
            groups = st["others"].nunique()
            if groups > MAX_PANELS:
                figs.append(_partial_dependence(sd, st, metric, x, numeric))
                continue
            color = alt.Color("others:N", title=None, sort=others_order(st),
                              legend=alt.Legend(orient="bottom", columns=1, labelLimit=600))
            tips = [alt.Tooltip(f"{_field(a)}:N", title=a) for a in sd.axes] + [
                alt.Tooltip("mean:Q", format=",.4~g", title=f"{metric} (mean)"), alt.Tooltip("lo:Q", format=",.4~g"),
                alt.Tooltip("hi:Q", format=",.4~g"), alt.Tooltip("n:Q", title="seeds")]
            base = alt.Chart(_data(st)).encode(x=xe, color=color)
            band = base.mark_errorband(opacity=0.18).encode(y=alt.Y("lo:Q", title=metric), y2="hi:Q")
            bars = base.mark_rule().encode(y="lo:Q", y2="hi:Q")
            line = base.mark_line(point=True).encode(y=alt.Y("mean:Q", title=metric), tooltip=tips)
            layers = [band, bars, line]
            rule = slo_rule(sd, metric)
            if rule is not None:
                layers.append(rule)
            chart = alt.layer(*layers).properties(width=NARROW, height=HEIGHT)
            figs.append(Figure(f"line-{metric}-{short(x, sd.axes)}", f"{metric} vs {short(x, sd.axes)}", chart,
                               f"Mean over seeds with its 95% t interval (band and bars; none with one seed); "
                               f"{'one line per combination of the other axes' if groups > 1 else 'one line'}.",
                               wide=False))
    return figs


def _partial_dependence(sd: SweepData, st: "pd.DataFrame", metric: str, x: str, numeric: bool) -> Figure:
    """A sampled design: every point, and the mean of the metric over bins of ``x`` (the other
    axes averaged over their random values: a partial-dependence curve), with the SLO line."""
    import altair as alt

    d = st.copy()
    if numeric:
        edges = np.unique(np.quantile(d[x].astype(float), np.linspace(0, 1, 9)))
        b = np.clip(np.searchsorted(edges, d[x].astype(float), side="right") - 1, 0, max(len(edges) - 2, 0))
        d["bin_x"] = [float(d[x][b == i].mean()) for i in b]
    else:
        d["bin_x"] = d[x]
    pd_curve = d.groupby("bin_x", as_index=False)["mean"].mean().sort_values("bin_x")
    xe = alt.X(f"{_field(x)}:{'Q' if numeric else 'O'}", title=short(x, sd.axes),
               scale=alt.Scale(zero=False) if numeric else alt.Undefined)
    tips = [alt.Tooltip(f"{_field(a)}:N", title=a) for a in sd.axes] + [
        alt.Tooltip("mean:Q", format=",.4~g", title=f"{metric} (mean)"), alt.Tooltip("n:Q", title="seeds")]
    pts = alt.Chart(_data(d)).mark_circle(size=40, opacity=0.55, color="#4c78a8").encode(
        x=xe, y=alt.Y("mean:Q", title=metric), tooltip=tips)
    curve = alt.Chart(_data(pd_curve)).mark_line(point=True, color="#222").encode(
        x=alt.X(f"bin_x:{'Q' if numeric else 'O'}", title=short(x, sd.axes)), y="mean:Q")
    layers = [pts, curve]
    rule = slo_rule(sd, metric)
    if rule is not None:
        layers.append(rule)
    return Figure(f"line-{metric}-{short(x, sd.axes)}", f"{metric} vs {short(x, sd.axes)}",
                  alt.layer(*layers).properties(width=NARROW, height=HEIGHT),
                  "A sampled design: each dot is a point (mean over its seeds); the line is the mean over bins of "
                  "this axis, the other axes averaged over their sampled values (partial dependence).", wide=False)


def pareto_frame(sd: SweepData, xm: str, ym: str) -> "pd.DataFrame":
    """Per point: both metrics' means and intervals, and whether the point is on the front."""
    a, b = point_stats(sd, xm), point_stats(sd, ym)
    st = a.rename(columns={"mean": "x", "lo": "x_lo", "hi": "x_hi"}).drop(columns=["n"])
    for src, dst in (("mean", "y"), ("lo", "y_lo"), ("hi", "y_hi"), ("n", "n")):
        st[dst] = b[src].to_numpy()
    st["front"] = pareto_front(st["x"], st["y"], direction(xm), direction(ym))
    return st


def pareto_figure(sd: SweepData, xm: str, ym: str) -> tuple[Figure, "pd.DataFrame"]:
    import altair as alt

    st = pareto_frame(sd, xm, ym)
    data = st.assign(
        on=np.where(st["front"], "on the front", "dominated"))
    tips = [alt.Tooltip(f"{_field(a)}:N", title=a) for a in sd.axes] + [
        alt.Tooltip("x:Q", format=",.4~g", title=xm), alt.Tooltip("y:Q", format=",.4~g", title=ym),
        alt.Tooltip("n:Q", title="seeds")]
    x_scale = alt.Scale(type="log") if xm != "gpus" and (st["x"] > 0).all() and st["x"].max() > 20 * st["x"].min() \
        else alt.Scale(zero=False)
    base = alt.Chart(_data(data))
    pts = base.mark_point(filled=True).encode(
        x=alt.X("x:Q", title=f"{xm} ({'lower' if direction(xm) == 'min' else 'higher'} is better)", scale=x_scale),
        y=alt.Y("y:Q", title=f"{ym} ({'lower' if direction(ym) == 'min' else 'higher'} is better)",
                scale=alt.Scale(zero=False)),
        color=alt.Color("on:N", title=None,
                        scale=alt.Scale(domain=["on the front", "dominated"], range=["#d62728", "#9aa3b5"])),
        size=alt.condition("datum.front", alt.value(90), alt.value(40)), tooltip=tips)
    front = alt.Chart(_data(data[st["front"].to_numpy()].sort_values("x"))).mark_line(color="#d62728").encode(
        x="x:Q", y="y:Q", order="x:Q")
    xbar = base.mark_rule(opacity=0.35).encode(x="x_lo:Q", x2="x_hi:Q", y="y:Q")
    ybar = base.mark_rule(opacity=0.35).encode(x="x:Q", y="y_lo:Q", y2="y_hi:Q")
    chart = alt.layer(xbar, ybar, front, pts).properties(width=560, height=320)
    fig = Figure(f"pareto-{xm}-{ym}", f"Pareto frontier: {ym} vs {xm}", chart,
                 "Every point of the sweep (means over its seeds, 95% t intervals as whiskers); red: no other point "
                 "is at least as good on both and better on one. Each point is decided on its means; points "
                 "whose intervals overlap a front point's may be as good within the noise.")
    return fig, st


def metric_exists(sd: SweepData, name: str) -> bool:
    return name in sd.metrics or name in derived_columns(sd)
