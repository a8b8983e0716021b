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
# # Capacity planning: how many A100s for 350 req/s at P99 TTFT < 0.8 s?
#
# The workload is the quickstart's (Llama-3-8B; prompts lognormal around 1,000 tokens, up to
# 7,000; 256 output tokens; Poisson arrivals), on A100-80G GPUs with step times from the
# measured A100 calibration pack, one GPU per replica, vLLM's scheduler.
#
# **What this notebook can answer today.** servesim simulates one replica per run (fleets of
# replicas behind a router are the cluster work, still to come). So we answer in two steps:
#
# 1. the **largest arrival rate one replica sustains** with P99 TTFT below 0.8 s, decided with
#    replications: a rate passes when the 95 % confidence interval of P99 TTFT over seeds lies
#    wholly below 0.8 s;
# 2. the **replica count that rate implies**: `ceil(350 / max rate per replica)`, which assumes
#    the 350 req/s are split perfectly evenly over independent replicas (no router imbalance, no
#    router delay). A real router is less even, so treat the count as a lower bound; once
#    clusters land, simulate the fleet itself.
#
# `SERVESIM_NOTEBOOK_QUICK=1` (set by the test suite) shortens runs and replications: the answer
# is then rough.

# %%
import math
import os
from pathlib import Path

import altair as alt
import numpy as np
import pandas as pd

import servesim
from servesim.report.curves import t_interval

QUICK = os.environ.get("SERVESIM_NOTEBOOK_QUICK") == "1"
ROOT = Path.cwd() if (Path.cwd() / "scenarios").is_dir() else Path.cwd().parent
TARGET_RATE, SLO_S = 350.0, 0.8
REQUESTS, SEEDS, REFINE = (1000, 3, 2) if QUICK else (4000, 5, 5)


def p99_ttft(rate: float) -> np.ndarray:
    """P99 TTFT (s) of one replica at ``rate`` req/s, one value per seed (common seeds at every rate)."""
    sc = servesim.load_scenario(ROOT / "scenarios" / "quickstart.yaml", [
        f"workload.arrival.rate={rate}", f"stop.requests={REQUESTS}", f"stop.warmup_requests={REQUESTS // 10}",
        "step_time={model: pack}"])
    return np.array([servesim.simulate(sc, seed=s).summary["latency_s"]["ttft"]["p99"] for s in range(1, SEEDS + 1)])


probes = {}


def probe(rate: float) -> dict:
    if rate not in probes:
        mean, lo, hi, n = t_interval(p99_ttft(rate))
        probes[rate] = {"rate": rate, "p99_ttft": mean, "lo": lo, "hi": hi, "seeds": n,
                        "verdict": "pass" if hi < SLO_S else ("fail" if lo > SLO_S else "open")}
    return probes[rate]


# %% [markdown]
# ## Step 1: the largest rate one replica sustains
# A coarse grid first, then bisection between the highest passing and the lowest non-passing
# rate (an *open* probe, whose interval straddles 0.8 s, counts as not passing: it is not
# verified).

# %%
for rate in (1.0, 2.0, 3.0, 4.0, 6.0, 8.0):
    probe(rate)
lo = max((r for r, p in probes.items() if p["verdict"] == "pass"), default=None)
if lo is None:
    raise SystemExit("even 1 req/s misses the SLO on one replica: the answer is not a replica count")
hi = min(r for r, p in probes.items() if r > lo and p["verdict"] != "pass")
for _ in range(REFINE):
    mid = round((lo + hi) / 2, 3)
    if probe(mid)["verdict"] == "pass":
        lo = mid
    else:
        hi = mid
max_rate = lo
table = pd.DataFrame(sorted(probes.values(), key=lambda p: p["rate"]))
table

# %% [markdown]
# ## Step 2: the replica count it implies

# %%
replicas = math.ceil(TARGET_RATE / max_rate)
print(f"one A100-80G replica sustains {max_rate:g} req/s at P99 TTFT < {SLO_S} s "
      f"(verified over {SEEDS} seeds; {hi:g} req/s is not verified)")
print(f"-> {TARGET_RATE:g} req/s needs at least {replicas} A100-80G replicas of 1 GPU = {replicas} GPUs, "
      f"assuming perfectly even load over independent replicas (a lower bound; clusters come later)")
assert probes[max_rate]["hi"] < SLO_S and replicas * max_rate >= TARGET_RATE

# %% [markdown]
# The same probes answer other targets: for each SLO, the highest probed rate whose interval is
# wholly below it, and the replicas that rate implies for 350 req/s.

# %%
rows = []
for slo in (0.6, 0.8, 1.0, 1.5):
    ok = [p["rate"] for p in probes.values() if p["hi"] < slo]
    if ok:
        rows.append({"P99 TTFT SLO (s)": slo, "max rate per replica": max(ok),
                     "replicas for 350 req/s": math.ceil(TARGET_RATE / max(ok))})
answers = pd.DataFrame(rows)
answers

# %% [markdown]
# ## Charts
# P99 TTFT of one replica against its arrival rate (mean over seeds with the 95 % interval), the
# SLO, and the answer; then the replica count each SLO implies.

# %%
band = alt.Chart(table).mark_errorbar().encode(x=alt.X("rate:Q", title="arrival rate per replica (req/s)"),
                                               y=alt.Y("lo:Q", title="P99 TTFT (s)", scale=alt.Scale(type="log")),
                                               y2="hi:Q")
points = alt.Chart(table).mark_point(filled=True, size=60).encode(
    x="rate:Q", y=alt.Y("p99_ttft:Q", scale=alt.Scale(type="log")), color=alt.Color("verdict:N"),
    tooltip=["rate", "p99_ttft", "lo", "hi", "seeds", "verdict"])
slo_rule = alt.Chart(pd.DataFrame({"y": [SLO_S]})).mark_rule(strokeDash=[4, 3], color="#b3261e").encode(y="y:Q")
answer = alt.Chart(pd.DataFrame({"x": [max_rate]})).mark_rule(color="#137333").encode(x="x:Q")
(band + points + slo_rule + answer).properties(
    width=520, height=300, title=f"one replica: {max_rate:g} req/s meets P99 TTFT < {SLO_S} s -> {replicas} replicas")

# %%
alt.Chart(answers).mark_bar().encode(
    x=alt.X("P99 TTFT SLO (s):O"), y=alt.Y("replicas for 350 req/s:Q"),
    tooltip=list(answers.columns)).properties(
    width=300, height=240, title="replicas for 350 req/s (even load over independent replicas)")
