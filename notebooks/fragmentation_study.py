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
# # KV fragmentation: paged vs static vs elastic, across block sizes
#
# The same workload (prompts lognormal around 1,000 tokens, outputs lognormal around 300, a
# 4,096-token context limit) on one A100-80G with a deliberately small KV pool
# (`gpu_memory_utilization: 0.3`, about 58k tokens), so memory decides who runs. Four allocators
# (docs/kv.md):
#
# * **paged**: fixed blocks taken as the context grows; only the last block of a request is
#   partly empty (internal fragmentation, at most `block_size - 1` slots per request);
# * **static, reserve max_model_len**: each request reserves its whole maximum length up front
#   (the pre-paging engines), so most of the reservation is never written;
# * **static, reserve request**: reserves exactly prompt + output (a client that knows its
#   length): extents of different sizes leave holes (external fragmentation);
# * **elastic**: a base reservation that grows by chunks.
#
# Waste is measured as a share of *allocated* KV (time integrals; docs/metrics.md), external
# fragmentation as a share of the pool. `SERVESIM_NOTEBOOK_QUICK=1` shrinks the runs.

# %%
import os
from pathlib import Path

import altair as alt
import pandas as pd

import servesim
from servesim.report import charts
from servesim.report import from_result, offline_charts

offline_charts()  # Vega inlined from vl-convert: every chart draws offline (no CDN)

QUICK = os.environ.get("SERVESIM_NOTEBOOK_QUICK") == "1"
ROOT = Path.cwd() if (Path.cwd() / "scenarios").is_dir() else Path.cwd().parent
REQUESTS = 500 if QUICK else 3000
BLOCK_SIZES = (8, 16, 32, 64)
ALLOCATORS = {
    "paged": ["engine.kv_allocator=paged"],
    "static (reserve max_model_len)": ["engine.kv_allocator=static", "engine.kv={static: {reserve: max_model_len}}"],
    "static (reserve request)": ["engine.kv_allocator=static", "engine.kv={static: {reserve: request}}"],
    "elastic": ["engine.kv_allocator=elastic"],
}
BASE = [f"stop.requests={REQUESTS}", f"stop.warmup_requests={REQUESTS // 10}", "workload.arrival.rate=4",
        "workload.output={dist: lognormal, mean: 300, sigma: 0.8, min: 1, max: 2000}",
        "workload.prompt={dist: lognormal, mean: 1000, sigma: 0.8, min: 1, max: 2000}",
        "engine.max_model_len=4096", "engine.gpu_memory_utilization=0.25", "step_time={model: pack}"]

# %%
rows, results = [], {}
for name, overrides in ALLOCATORS.items():
    for bs in BLOCK_SIZES:
        sc = servesim.load_scenario(ROOT / "scenarios" / "quickstart.yaml",
                                    BASE + overrides + [f"engine.block_size={bs}"])
        res = servesim.simulate(sc)
        results[(name, bs)] = res
        s, kv = res.summary, res.summary["kv"]
        rows.append({"allocator": name, "block_size": bs,
                     "internal fragmentation": kv["of_allocated"]["internal_fragmentation"],
                     "reserved, unused": kv["of_allocated"]["reservation_waste"],
                     "external fragmentation (pool)": kv["external_fragmentation"]["mean"],
                     "KV used (pool, mean)": kv["mean_usage"], "mean running": s["engine"]["mean_running"],
                     "req/s": s["throughput"]["req_per_s"], "P99 TTFT (s)": s["latency_s"]["ttft"]["p99"],
                     "preemptions": s["requests"]["preemptions"]})
table = pd.DataFrame(rows)
table.round(4)

# %% [markdown]
# What to expect, and what the table shows: paged waste grows with the block size (a request's
# last block is on average half empty) but stays a few percent; a static reservation of the
# whole context wastes most of what it holds, so fewer requests run at once (mean running) and
# requests queue; reserving exactly the request's length removes that waste but leaves holes
# between extents; elastic sits in between.

# %%
paged = table[table["allocator"] == "paged"].set_index("block_size")["internal fragmentation"]
assert paged.is_monotonic_increasing, paged  # bigger blocks, more of the last one left empty
classic = table[table["allocator"] == "static (reserve max_model_len)"]
assert (classic["reserved, unused"] > table[table["allocator"] == "paged"]["internal fragmentation"].max()).all()

# %% [markdown]
# ## Charts
# Waste of allocated KV by allocator and block size (stacked: internal + reserved-unused), then
# what it costs: requests running at once and P99 TTFT, and the KV pool over time at block size 16.

# %%
waste = table.melt(id_vars=["allocator", "block_size"], value_vars=["internal fragmentation", "reserved, unused"],
                   var_name="kind", value_name="share")
alt.Chart(waste).mark_bar().encode(
    x=alt.X("block_size:O", title="block size (tokens)"), y=alt.Y("share:Q", title="share of allocated KV",
                                                                  axis=alt.Axis(format="%")),
    color=alt.Color("kind:N", title=None), column=alt.Column("allocator:N", title=None),
    tooltip=["allocator", "block_size", "kind", alt.Tooltip("share:Q", format=".2%")],
).properties(width=150, height=220, title="KV waste of allocated memory")

# %%
cost = table.melt(id_vars=["allocator", "block_size"], value_vars=["mean running", "P99 TTFT (s)"],
                  var_name="metric", value_name="value")
alt.Chart(cost).mark_line(point=True).encode(
    x=alt.X("block_size:O", title="block size (tokens)"), y=alt.Y("value:Q", title=None, scale=alt.Scale(type="log")),
    color=alt.Color("allocator:N"), tooltip=["allocator", "block_size", "metric", "value"],
).properties(width=300, height=220).facet(column=alt.Column("metric:N", title=None)).resolve_scale(y="independent")

# %%
at16 = [from_result(results[(name, 16)], name) for name in ALLOCATORS]
charts.timeline_figures(at16)[0].chart
