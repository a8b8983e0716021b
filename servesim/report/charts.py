"""Altair charts of one run, or of several overlaid (``servesim compare``).

Every function takes a list of :class:`~servesim.report.rundata.RunData` and returns
:class:`Figure` objects (an altair chart with a title and a caption saying what is drawn and
from what), or nothing when the runs hold no data for it (tiers off, a single replica). One run
is coloured by class or signal; several runs are coloured by run, so the same function draws
the report and the comparison. The numbers come from :mod:`servesim.report.curves`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from servesim.report import curves
from servesim.report.rundata import finite

if TYPE_CHECKING:
    import pandas as pd

    from servesim.report.rundata import RunData

WIDE, NARROW, HEIGHT = 760, 360, 240
PCT_LABEL = "datum.value < 0.001 ? '0%' : format(100 - 100 * pow(10, -datum.value), '.6~r') + '%'"


@dataclass
class Figure:
    """One chart of a report: ``slug`` names its static file, ``wide`` its layout."""

    slug: str
    title: str
    chart: Any  # altair.Chart (or a layer / facet / concat of charts)
    caption: str = ""
    wide: bool = True

    def spec(self) -> dict:
        return self.chart.to_dict()


def records(df: "pd.DataFrame") -> list[dict]:
    """Rows as plain JSON values (NaN and inf as null: JSON has neither)."""
    out = []
    cols = list(df.columns)
    for row in df.itertuples(index=False, name=None):
        rec = {}
        for c, v in zip(cols, row):
            if isinstance(v, (np.floating, float)):
                v = float(v) if np.isfinite(v) else None
            elif isinstance(v, np.integer):
                v = int(v)
            elif isinstance(v, np.bool_):
                v = bool(v)
            rec[c] = v
        out.append(rec)
    return out


def _data(df: "pd.DataFrame"):
    import altair as alt

    return alt.Data(values=records(df))


# ---------------------------------------------------------------------------------- latency
def latency_figures(runs: list["RunData"]) -> list[Figure]:
    """One CDF per latency metric (TTFT, TPOT, ITL, E2E) on the tail axis, P99 and P99.9 ruled."""
    cv = curves.latency_curves(runs)
    marks = curves.latency_marks(cv)
    figs = []
    for metric in curves.LATENCIES:
        d = cv[cv["metric"] == metric]
        if d.empty:
            continue
        note = "measured requests (completed, after the warm-up)"
        if metric == "itl":
            note = ("every gap between two tokens of a request, all classes together (kept per run, not per "
                    "request), from the run's sketch: within 1% of the exact values")
            zero = d.groupby("series")["zero_share"].first()
            if (zero > 0).any():
                note += "; gaps of 0 (tokens of a multi-step burst delivered together) cannot sit on the " \
                        "log axis: " + ", ".join(f"{s} {z:.1%}" for s, z in zero.items() if z > 0)
        figs.append(Figure(f"latency-{metric}", curves.LATENCY_TITLES[metric],
                           _cdf_chart(d, marks[marks["metric"] == metric]),
                           f"CDF on a tail axis (each decade of the tail gets the same height): {note}. "
                           f"Dots mark P50, P90, P99 and P99.9 (the summary's values); a hollow dot is a "
                           f"percentile of a sample too small to reach it (fewer than 100 values for P99, "
                           f"1,000 for P99.9).", wide=False))
    return figs


def _cdf_chart(d: "pd.DataFrame", marks: "pd.DataFrame"):
    """One metric's curves. Colour tells the classes apart (and the runs, when only runs vary);
    with several runs and several classes the runs are dashed differently. A click on a legend
    entry highlights its curves."""
    import altair as alt

    many_runs, many_classes = d["run"].nunique() > 1, d["class"].nunique() > 1
    key = "class" if many_classes else ("run" if many_runs else "series")
    order = list(dict.fromkeys(d[key]))  # runs in the order given, classes in the run's order
    top = max(3.3, float(d["nines"].max()) + 0.15)
    y = alt.Y("nines:Q", title="percentile (tail axis)", scale=alt.Scale(domain=[0, top], nice=False),
              axis=alt.Axis(values=[0, float(curves.nines(0.5)), 1, 2, 3, 4, 5, 6], labelExpr=PCT_LABEL,
                            labelOverlap=False))
    x = alt.X("latency_s:Q", title="seconds (log scale)", scale=alt.Scale(type="log"))
    pick = alt.selection_point(name="pick", fields=[key], bind="legend")
    enc = dict(x=x, y=y, color=alt.Color(f"{key}:N", title=None, sort=order,
                                         legend=alt.Legend(orient="bottom", columns=2)),
               opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
               tooltip=[alt.Tooltip("run:N"), alt.Tooltip("class:N"),
                        alt.Tooltip("latency_s:Q", format=".4~s", title="seconds")])
    if many_runs and many_classes:
        enc["strokeDash"] = alt.StrokeDash("run:N", title=None, sort=list(dict.fromkeys(d["run"])),
                                           legend=alt.Legend(orient="bottom"))
    line = alt.Chart(_data(d[["run", "class", "series", "nines", "latency_s"]])).mark_line().encode(
        **enc).add_params(pick)
    rules = alt.Chart(alt.Data(values=[{"nines": 2.0, "mark": "P99"}, {"nines": 3.0, "mark": "P99.9"}]))
    rule = rules.mark_rule(strokeDash=[4, 3], color="#888").encode(y="nines:Q")
    text = rules.mark_text(align="left", dx=3, dy=-6, color="#555").encode(
        y="nines:Q", text="mark:N", x=alt.value(2))
    layers = [line, rule, text]
    if not marks.empty:
        m = marks.assign(sample=np.where(marks["reached"], "enough values",
                                         "fewer than 1/(1-q) values: the largest ones, not a tail estimate"))
        layers.append(alt.Chart(_data(m)).mark_point(size=45, strokeWidth=1.5).encode(
            x=alt.X("latency_s:Q"), y=alt.Y("nines:Q"), color=enc["color"],
            fill=alt.condition("datum.reached", alt.Fill(f"{key}:N", sort=order, legend=None), alt.value("white")),
            opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
            tooltip=[alt.Tooltip("run:N"), alt.Tooltip("class:N"), alt.Tooltip("mark:N"),
                     alt.Tooltip("latency_s:Q", format=".4~s", title="seconds"),
                     alt.Tooltip("n:Q", title="values"), alt.Tooltip("sample:N")]))
    return alt.layer(*layers).properties(width=NARROW, height=HEIGHT)


# ------------------------------------------------------------------------------ time series
KV_SIGNALS = {"kv_utilization_mean": "KV used", "kv_internal_fragmentation_mean": "internal fragmentation",
              "kv_reservation_waste_mean": "reserved, unused",
              "kv_external_fragmentation_mean": "external fragmentation"}
QUEUE_SIGNALS = {"waiting_mean": "waiting requests", "running_mean": "running requests (batch)"}
BATCH_SIGNALS = {"prefill_tokens_mean": "prefill tokens", "decode_tokens_mean": "decode tokens"}


def _timeline(d: "pd.DataFrame", many: bool, y_title: str, fmt: str | None = None, stack: bool = False,
              symlog: bool = False):
    import altair as alt

    axis = alt.Axis(format=fmt) if fmt else alt.Axis()
    if symlog:
        axis = alt.Axis(values=[0, 1, 10, 100, 1000, 10_000, 100_000, 1_000_000], format=",.0f", labelOverlap=False)
    y = alt.Y("value:Q", title=y_title, axis=axis, stack="zero" if stack else None,
              scale=alt.Scale(type="symlog") if symlog else alt.Scale())
    x = alt.X("t_s:Q", title="simulated time (s)")
    tips = [alt.Tooltip("run:N"), alt.Tooltip("signal:N"), alt.Tooltip("t_s:Q", format=",.1f", title="t (s)"),
            alt.Tooltip("value:Q", format=fmt or ",.4~g")]
    base = alt.Chart(_data(d))
    if many:
        enc = {"color": alt.Color("run:N", title="run", sort=list(dict.fromkeys(d["run"])))}
        if d["signal"].nunique() > 1:
            enc["strokeDash"] = alt.StrokeDash("signal:N", title=None)
        chart = base.mark_line().encode(x=x, y=y, tooltip=tips, **enc)
    elif stack:
        chart = base.mark_area(opacity=0.85).encode(x=x, y=y, color=alt.Color("signal:N", title=None), tooltip=tips)
    else:
        chart = base.mark_line().encode(x=x, y=y, color=alt.Color("signal:N", title=None), tooltip=tips)
    return chart.properties(width=WIDE, height=HEIGHT - 40)


def _nonzero(d: "pd.DataFrame") -> "pd.DataFrame":
    """Signals that are zero throughout (fragmentation a paged pool cannot have) left out."""
    alive = d.groupby("signal")["value"].apply(lambda v: bool(np.nanmax(np.abs(v.to_numpy())) > 0) if len(v) else False)
    keep = set(alive[alive].index) | {"KV used"}
    return d[d["signal"].isin(keep)]


def timeline_figures(runs: list["RunData"]) -> list[Figure]:
    many = len(runs) > 1
    bin_note = ("time-weighted means per time bin (metrics.timeseries_bin_s; long runs have merged bins, "
                "and bins are merged further to at most 1,200 points per chart)")
    figs = []
    kv = curves.long_series(runs, KV_SIGNALS)
    if not kv.empty:
        shown = _nonzero(kv)
        left = sorted(set(kv["signal"]) - set(shown["signal"]))
        figs.append(Figure("kv-usage", "KV cache usage and fragmentation",
                           _timeline(shown, many, "share of the KV pool", ".2~%"),
                           f"Share of the GPU KV pool in use and wasted over time; {bin_note}. Fragmentation "
                           f"definitions: docs/metrics.md."
                           + (f" Zero throughout, not drawn: {', '.join(left)}." if left else "")))
    q = curves.long_series(runs, QUEUE_SIGNALS)
    if not q.empty:
        figs.append(Figure("queue-batch", "Waiting queue and running batch", _timeline(q, many, "requests"),
                           f"Requests waiting to be admitted and requests in the running batch; {bin_note}."))
    b = curves.long_series(runs, BATCH_SIGNALS)
    if not b.empty:
        figs.append(Figure("batch-composition", "Batch composition: prefill vs decode tokens per iteration",
                           _timeline(b, many, "tokens per iteration (symlog scale)", symlog=True),
                           f"Tokens computed per iteration, split into prefill work (prompts, chunks and "
                           f"recomputation after a preemption) and decode tokens (one per running request "
                           f"that decodes); {bin_note}, so long prefill iterations weigh more. The scale is "
                           f"logarithmic above 1 token so that a few decode tokens stay visible beside "
                           f"thousands of prompt tokens."))
    elif not (tot := curves.long_series(runs, {"batch_tokens_mean": "tokens per iteration"})).empty:
        figs.append(Figure("batch-composition", "Batch size in tokens per iteration", _timeline(tot, many, "tokens"),
                           f"This run was written before the recorder split prefill from decode tokens; {bin_note}."))
    return figs


# ------------------------------------------------------------------------------ wait causes
def wait_figures(runs: list["RunData"]) -> list[Figure]:
    import altair as alt

    w = curves.wait_attribution(runs)
    if w.empty or not (w["mean_s"] > 0).any():
        return []
    causes = w.groupby("cause")["mean_s"].sum()
    w = w[w["cause"].isin(causes[causes > 0].index)]
    tips = [alt.Tooltip("run:N"), alt.Tooltip("class:N"), alt.Tooltip("cause:N"),
            alt.Tooltip("mean_s:Q", format=".4~s", title="mean seconds per request"),
            alt.Tooltip("share:Q", format=".1%", title="share of the waiting")]
    color = alt.Color("cause:N", title="waited because", legend=alt.Legend(orient="right"))
    y = alt.Y("mean_s:Q", title="mean seconds waiting per request", stack="zero")
    if len(runs) > 1:
        chart = alt.Chart(_data(w)).mark_bar().encode(
            x=alt.X("run:N", title=None, sort=[r.label for r in runs]), y=y, color=color, tooltip=tips,
        ).properties(width=max(60, 48 * len(runs)), height=HEIGHT).facet(
            column=alt.Column("class:N", title="class", sort=list(dict.fromkeys(w["class"]))))
    else:
        chart = alt.Chart(_data(w)).mark_bar().encode(
            x=alt.X("class:N", title="class", sort=None), y=y, color=color, tooltip=tips,
        ).properties(width=max(120, 70 * w["class"].nunique()), height=HEIGHT)
    return [Figure("wait-attribution", "Why requests waited, per class", chart,
                   "Every second a measured request spent waiting is charged to one cause (docs/metrics.md); "
                   "bars stack the mean seconds per request of each cause, 'all' first.")]


# ------------------------------------------------------------------------------------ tiers
def tier_figures(runs: list["RunData"]) -> list[Figure]:
    import altair as alt
    import pandas as pd

    hits, traffic = [], []
    for run in runs:
        tiers = run.summary.get("kv", {}).get("tiers") or {}
        for name, t in tiers.items():
            if not isinstance(t, dict) or "hit_rate" not in t:
                continue
            rate = finite(t.get("hit_rate"))
            hits.append({"run": run.label, "tier": name, "class": "all", "hit_rate": rate})
            per_class = t.get("by_class") or {}
            for klass, r in (per_class.items() if len(per_class) > 1 else ()):
                hits.append({"run": run.label, "tier": name, "class": klass, "hit_rate": finite(r)})
            for key, label in (("bytes_fetched", "fetched (up to L1)"), ("bytes_stored", "stored (down)")):
                if key in t:
                    traffic.append({"run": run.label, "tier": name, "direction": label, "GB": t[key] / 1e9,
                                    "busy_s": finite(t.get("busy_s")), "queue_s": finite(t.get("queue_s"))})
    figs = []
    if hits:
        h = pd.DataFrame(hits)
        many = len(runs) > 1
        tips = [alt.Tooltip("run:N"), alt.Tooltip("tier:N"), alt.Tooltip("class:N"),
                alt.Tooltip("hit_rate:Q", format=".1%", title="hit rate")]
        enc = dict(x=alt.X("class:N", title="class", sort=None),
                   y=alt.Y("hit_rate:Q", title="share of looked-up blocks", axis=alt.Axis(format=".0%"), stack="zero"),
                   color=alt.Color("tier:N", title="found in"), tooltip=tips)
        chart = alt.Chart(_data(h)).mark_bar().encode(**enc).properties(width=max(120, 60 * h["class"].nunique()),
                                                                        height=HEIGHT)
        if many:
            chart = chart.facet(column=alt.Column("run:N", title=None, sort=[r.label for r in runs]))
        figs.append(Figure("tier-hits", "Prefix-cache hits by tier", chart,
                           "Blocks found when a request was admitted, as a share of the blocks looked up, by the tier "
                           "that held them (L1 = GPU); the stack is the block hit rate (summary.json kv.tiers)."))
    if traffic:
        t = pd.DataFrame(traffic)
        chart = alt.Chart(_data(t)).mark_bar().encode(
            x=alt.X("tier:N", title="tier link"), xOffset=alt.XOffset("direction:N"),
            y=alt.Y("GB:Q", title="GB moved"), color=alt.Color("direction:N", title=None),
            tooltip=[alt.Tooltip("run:N"), alt.Tooltip("tier:N"), alt.Tooltip("direction:N"),
                     alt.Tooltip("GB:Q", format=",.3f"), alt.Tooltip("busy_s:Q", format=",.3f", title="link busy (s)"),
                     alt.Tooltip("queue_s:Q", format=",.3f", title="queued on the link (s)")],
        ).properties(width=max(120, 90 * t["tier"].nunique()), height=HEIGHT)
        if len(runs) > 1:
            chart = chart.facet(column=alt.Column("run:N", title=None, sort=[r.label for r in runs]))
        figs.append(Figure("tier-traffic", "KV tier link traffic", chart,
                           "Bytes each lower tier's link carried: fetched up to the GPU on hits, stored down on "
                           "evictions; link busy and queueing seconds in the tooltip."))
    return figs


# --------------------------------------------------------------------------------- replicas
def replica_rows(summary: dict) -> list[dict]:
    """Per-replica numbers of ``summary.cluster`` (written by multi-replica runs): the entries of
    ``cluster.replicas`` (a list, or a mapping by replica name), every numeric field kept."""
    cl = summary.get("cluster")
    if not isinstance(cl, dict):
        return []
    reps = cl.get("replicas")
    items = list(reps.items()) if isinstance(reps, dict) else list(enumerate(reps or []))
    rows = []
    for name, rep in items:
        if not isinstance(rep, dict):
            continue
        label = str(rep.get("name", rep.get("id", name)))
        for key, v in _flat_numbers(rep).items():
            if key not in ("id",):
                rows.append({"replica": label, "field": key, "value": v})
    return rows


def _flat_numbers(d: dict, prefix: str = "") -> dict[str, float]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat_numbers(v, key + "."))
        elif finite(v) is not None:
            out[key] = float(v)
    return out


def replica_figures(runs: list["RunData"]) -> list[Figure]:
    import altair as alt
    import pandas as pd

    rows = [{"run": r.label, **x} for r in runs for x in replica_rows(r.summary)]
    if not rows:
        return []
    d = pd.DataFrame(rows)
    enc = dict(x=alt.X("replica:N", title="replica", sort=None), y=alt.Y("value:Q", title=None),
               tooltip=[alt.Tooltip("run:N"), alt.Tooltip("replica:N"), alt.Tooltip("field:N"),
                        alt.Tooltip("value:Q", format=",.4~g")])
    if len(runs) > 1:
        enc["color"] = alt.Color("run:N", sort=[r.label for r in runs])
        enc["xOffset"] = alt.XOffset("run:N")
    chart = alt.Chart(_data(d)).mark_bar().encode(**enc).properties(
        width=max(160, 22 * d["replica"].nunique() * max(1, len(runs))), height=110,
    ).facet(row=alt.Row("field:N", title=None, header=alt.Header(labelAngle=0, labelAlign="left"))
            ).resolve_scale(y="independent")
    return [Figure("replicas", "Load per replica", chart,
                   "Each replica's figures from summary.json's cluster block (requests, busy share, batch, KV peak, "
                   "...): an even fleet has even bars.")]


# --------------------------------------------------------------------------- extrapolation
def extrapolation_figures(runs: list["RunData"]) -> list[Figure]:
    """Per op kind, the share of iterations and of step time beyond the pack's measured grid
    (summary.json ``extrapolation``; runs without a pack have no grid and no bars)."""
    import altair as alt
    import pandas as pd

    rows, notes = [], []
    for r in runs:
        ex = r.summary.get("extrapolation") or {}
        if not ex.get("measured_grid") or not ex.get("iterations"):  # no grid, or nothing ran
            continue
        for key, v in ex["by_op"].items():
            end = v["grid_end"] if not isinstance(v["grid_end"], list) else max(v["grid_end"])
            what = f"{v['what']} > {end:,.0f}"
            for measure, share in (("iterations", v["iterations_share"]), ("step time", v["step_time_share"])):
                rows.append({"run": r.label, "op": what, "measure": measure, "share": share or 0.0})
        if ex.get("warning"):
            notes.append(f"{r.label}: {ex['warning']}" if len(runs) > 1 else ex["warning"])
    if not rows:
        return []
    d = pd.DataFrame(rows)
    enc = dict(x=alt.X("share:Q", title="share outside the measured grid", axis=alt.Axis(format="%")),
               y=alt.Y("op:N", title=None, sort=None), color=alt.Color("measure:N", title=None),
               yOffset="measure:N", tooltip=[alt.Tooltip("run:N"), alt.Tooltip("op:N"), alt.Tooltip("measure:N"),
                                            alt.Tooltip("share:Q", format=".2%")])
    chart = alt.Chart(_data(d)).mark_bar().encode(**enc).properties(width=WIDE // 2, height=HEIGHT - 60)
    if len(runs) > 1:
        chart = chart.facet(row=alt.Row("run:N", title=None, sort=[r.label for r in runs]))
    return [Figure("extrapolation", "Iterations beyond the calibration pack's measured grid", chart,
                   "Per op kind, the share of iterations (and of step time) whose batch lay beyond the largest "
                   "size the pack measured on that op's axis, where the step time is extrapolated "
                   "(docs/calibration.md). " + (" ".join(notes) if notes else "Below the warning threshold."))]


def run_figures(runs: list["RunData"]) -> list[tuple[str, list[Figure]]]:
    """Every figure of a run report (or a comparison), by section."""
    sections = [("Latency", latency_figures(runs)), ("Over time", timeline_figures(runs)),
                ("Why requests waited", wait_figures(runs)), ("Prefix cache and KV tiers", tier_figures(runs)),
                ("Replicas", replica_figures(runs)), ("Calibration coverage", extrapolation_figures(runs))]
    return [(name, figs) for name, figs in sections if figs]
