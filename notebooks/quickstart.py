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
# # servesim quickstart
#
# One A100-80G running Llama-3-8B behind a vLLM-style scheduler, Poisson arrivals: run it, read
# the summary, look at the latency tails and the KV cache over time, and write the HTML report.
#
# Open this file in Jupyter with jupytext (`pip install jupytext`), or run it as a script.
# `SERVESIM_NOTEBOOK_QUICK=1` (what the test suite sets) shrinks every run so the notebook
# executes in seconds; the numbers are then indicative only.

# %%
import os
from pathlib import Path

import servesim
from servesim.report import charts
from servesim.report import from_result, offline_charts

offline_charts()  # Vega inlined from vl-convert: every chart draws offline (no CDN)

QUICK = os.environ.get("SERVESIM_NOTEBOOK_QUICK") == "1"
ROOT = Path.cwd() if (Path.cwd() / "scenarios").is_dir() else Path.cwd().parent
OUT = Path(os.environ.get("SERVESIM_NOTEBOOK_OUT", ROOT / "out"))  # where files are written
REQUESTS = 600 if QUICK else 5000

# %% [markdown]
# ## Run the default scenario
# `load_scenario` takes the same dotted overrides as `servesim run --set`.

# %%
sc = servesim.load_scenario(ROOT / "scenarios" / "quickstart.yaml",
                            [f"stop.requests={REQUESTS}", f"stop.warmup_requests={REQUESTS // 10}"])
res = servesim.simulate(sc)
s = res.summary
print(f"{s['requests']['completed']:,} requests completed, {s['throughput']['req_per_s']:.2f} req/s, "
      f"goodput {s['throughput']['goodput_req_per_s']:.2f} req/s, SLO attainment {s['slo']['attainment']:.1%}")
for metric in ("ttft", "tpot", "e2e"):
    lat = s["latency_s"][metric]
    print(f"{metric.upper():5s} P50 {lat['p50'] * 1e3:8.1f} ms   P99 {lat['p99'] * 1e3:8.1f} ms   "
          f"P99.9 {lat['p999'] * 1e3:8.1f} ms")

# %% [markdown]
# The per-request table has one row per request (timestamps, latencies, the seconds each one
# waited by cause); the time series has KV usage, queue and batch per time bin.

# %%
res.requests[["arrival_s", "prompt_tokens", "output_tokens", "ttft_s", "tpot_s", "e2e_s", "queue_s"]].describe()

# %%
res.timeseries[["t_s", "kv_utilization_mean", "running_mean", "waiting_mean",
                "prefill_tokens_mean", "decode_tokens_mean"]].head()

# %% [markdown]
# ## A second configuration to compare
# Cut the batch slots from 256 to 16: fewer requests run at once, so the queue grows and the
# tails move.

# %%
small = servesim.simulate(servesim.load_scenario(
    ROOT / "scenarios" / "quickstart.yaml",
    [f"stop.requests={REQUESTS}", f"stop.warmup_requests={REQUESTS // 10}", "engine.max_num_seqs=16"]))
runs = [from_result(res, "max_num_seqs 256"), from_result(small, "max_num_seqs 16")]
print({r.label: round(r.summary["latency_s"]["ttft"]["p99"], 3) for r in runs})

# %% [markdown]
# ## Charts
# The report's own charts, drawn in the notebook: latency CDFs on the tail axis (each decade of
# the tail gets the same height, so P99 and P99.9 are visible), and the KV cache over time. The
# same charts, for one run, are in `report.html` written by `servesim run ... --report` or below.

# %%
out = OUT / "notebook-quickstart"
res.write(out)
from servesim.report import write_run_report

print(write_run_report(out))

# %%
figs = charts.latency_figures(runs)
figs[0].chart

# %%
charts.timeline_figures(runs)[0].chart
