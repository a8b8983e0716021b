# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Calibration quality: predicted vs measured iteration times, per pack
#
# A calibration pack holds per-op kernel timings; the pack model (servesim/perf/packmodel.py)
# turns a batch composition into an iteration time. How good is that? The files in
# `calibration/validation/<gpu>/` hold **whole forwards measured separately** on the GPU
# (`calibration/profile_gpu.py iterations`): prefill-only, prefill-with-context, decode-only and
# mixed batches, eager and CUDA-graph. The pack model never reads them; here each row is
# predicted from its pack and compared (error = predicted / measured - 1), the same computation
# as `servesim calibrate validate` and `calibration/VALIDATION.md`.
#
# Only the H200 packs have whole-iteration validation data so far (the A100 packs are imported
# from Vidur's op profiles; no whole forwards were measured on an A100).

# %%
from pathlib import Path

import altair as alt
import numpy as np

from servesim.tools import error_table, read_validation, validate_frame
from servesim.report import offline_charts

offline_charts()  # Vega inlined from vl-convert: every chart draws offline (no CDN)

ROOT = Path.cwd() if (Path.cwd() / "calibration").is_dir() else Path.cwd().parent
GPU = "h200"

rows = read_validation(ROOT / "calibration" / "validation" / GPU)  # 708 rows: a few seconds, no quick mode
res = validate_frame(GPU, rows)
res["mode"] = np.where(res["cuda_graph"], "CUDA graph", "eager")
res["abs_error"] = res["error"].abs()
print(f"{len(res)} measured iterations, {res['model'].nunique()} packs ({', '.join(sorted(res['model'].unique()))})")

# %% [markdown]
# ## Error per pack, mode and batch kind
# Median and worst |error|; the target of VALIDATION.md is a median within 5 % and every row
# within 15 % (CUDA graph). Eager rows carry the host CPU's launch noise.

# %%
table = error_table(res)
table[table["kind"] == "all"].round(1)

# %%
assert (res["predicted_ms"] > 0).all() and res["error"].notna().all()
graph = res[res["mode"] == "CUDA graph"]
print(f"CUDA graph: median |error| {graph['abs_error'].median():.1%}, "
      f"P90 {graph['abs_error'].quantile(0.9):.1%}, max {graph['abs_error'].max():.1%}")

# %% [markdown]
# ## Charts
# Predicted against measured (log-log; on the diagonal is exact, the band is +-15 %), one panel
# per pack and mode; then the distribution of |error| per pack.

# %%
data = res[["model", "mode", "kind", "measured_ms", "predicted_ms", "error"]]
x = alt.X("measured_ms:Q", title="measured (ms)", scale=alt.Scale(type="log"))
base = alt.Chart().transform_calculate(lo="datum.measured_ms * 0.85", hi="datum.measured_ms * 1.15")
band = base.mark_area(opacity=0.15, color="#888").encode(x=x, y="lo:Q", y2="hi:Q")
diagonal = base.mark_line(color="#555", strokeDash=[4, 3]).encode(x=x, y="measured_ms:Q")
pts = alt.Chart().mark_point(filled=True, size=25, opacity=0.7).encode(
    x=x, y=alt.Y("predicted_ms:Q", title="predicted (ms)", scale=alt.Scale(type="log")),
    color=alt.Color("kind:N", title="batch"),
    tooltip=["model", "mode", "kind", "measured_ms", "predicted_ms", alt.Tooltip("error:Q", format="+.1%")])
alt.layer(band, diagonal, pts, data=data).properties(width=230, height=230).facet(
    row=alt.Row("mode:N", title=None), column=alt.Column("model:N", title=None))

# %%
alt.Chart(res).transform_window(
    cdf="cume_dist()", sort=[{"field": "abs_error"}], groupby=["model", "mode"]
).mark_line(interpolate="step-after").encode(
    x=alt.X("abs_error:Q", title="|predicted / measured - 1|", axis=alt.Axis(format="%"),
            scale=alt.Scale(type="symlog", constant=0.01)),
    y=alt.Y("cdf:Q", title="share of iterations", axis=alt.Axis(format="%")),
    color=alt.Color("model:N"), strokeDash=alt.StrokeDash("mode:N"),
).properties(width=480, height=260, title="distribution of the iteration-time error per pack")
