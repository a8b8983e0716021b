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
# **How.** Three steps:
#
# 1. the **largest arrival rate one replica sustains** with P99 TTFT below 0.8 s, decided with
#    replications: a rate passes when the 95 % confidence interval of P99 TTFT over seeds lies
#    wholly below 0.8 s;
# 2. the **replica count that rate implies**: `ceil(350 / max rate per replica)`. That is exact
#    for a router that splits arrivals at random (each replica then sees Poisson arrivals at
#    350 / N req/s: step 1's single replica); a router that looks at load does better, so it is
#    the most a load-aware fleet needs;
# 3. the **fleet itself**: N replicas behind a least-outstanding-tokens router at 350 req/s,
#    searched with `find_min_replicas` (what `servesim capacity --find min-replicas` runs) from
#    step 2's count downwards: the fewest N whose fleet-wide P99 TTFT interval lies below 0.8 s,
#    with N - 1 shown to fail (or left open within the seed budget, which the search says).
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
from servesim.report import offline_charts, t_interval

offline_charts()  # Vega inlined from vl-convert: every chart draws offline (no CDN)

QUICK = os.environ.get("SERVESIM_NOTEBOOK_QUICK") == "1"
ROOT = Path.cwd() if (Path.cwd() / "scenarios").is_dir() else Path.cwd().parent
TARGET_RATE, SLO_S = 350.0, 0.8
REQUESTS, SEEDS, REFINE = (1000, 3, 2) if QUICK else (4000, 5, 5)
FLEET_SECONDS = 6.0 if QUICK else 60.0  # simulated seconds of arrivals at 350 req/s per fleet run


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
      f"with a random router (each replica: Poisson at {TARGET_RATE / replicas:.3g} req/s); step 3 checks a "
      f"load-aware one")
assert probes[max_rate]["hi"] < SLO_S and replicas * max_rate >= TARGET_RATE

# %% [markdown]
# ## Step 3: the fleet, behind a router
# The same scenario as a fleet (`hardware.replicas: N`, `cluster.router: least-tokens`), at the
# full 350 req/s, the same number of requests at every count (`FLEET_SECONDS` of arrivals, each
# run drained, so an overloaded fleet's late requests count too), P99 TTFT over the whole fleet. The search starts at step 2's bound; a count passes
# or fails by its interval over seeds, like the probes above.

# %%
from servesim.sweep import SLO, Budget, find_min_replicas

fleet = servesim.load_scenario(ROOT / "scenarios" / "quickstart.yaml", [
    f"workload.arrival.rate={TARGET_RATE}", f"stop.requests={int(TARGET_RATE * FLEET_SECONDS)}",
    f"stop.warmup_requests={int(TARGET_RATE * FLEET_SECONDS) // 10}", "step_time={model: pack}",
    "cluster={router: least-tokens}"])
search = find_min_replicas(fleet, [SLO("ttft_p99", SLO_S)], Budget(seeds=SEEDS, max_seeds=2 * SEEDS),
                           start=replicas)
fleet_table = pd.DataFrame([{"replicas": int(p.x), "runs": p.n, "p99_ttft": iv.estimate, "lo": iv.lo,
                             "hi": iv.hi, "verdict": p.verdict} for p in search.path for _, iv, _ in p.checks])
print(search.refused or f"the fleet: {int(search.best.x)} replicas meet P99 TTFT < {SLO_S} s at "
      f"{TARGET_RATE:g} req/s; {int(search.bound.x)} do not (step 2's random-router count: {replicas})")
if QUICK:
    print(f"(quick mode: {FLEET_SECONDS:g} s of arrivals is too short for the replicas' queues to settle, "
          f"so this answer only shows the notebook runs; the full run uses 60 s)")
fleet_table

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
    width=300, height=240, title="replicas for 350 req/s (random router: each replica sees Poisson at 350/N)")

# %% [markdown]
# The fleet search of step 3: fleet-wide P99 TTFT at each replica count it probed (95 % interval
# over seeds), against the SLO.

# %%
fleet_band = alt.Chart(fleet_table).mark_errorbar().encode(
    x=alt.X("replicas:Q", title="replicas (least-outstanding-tokens router, 350 req/s)"),
    y=alt.Y("lo:Q", title="fleet P99 TTFT (s)", scale=alt.Scale(type="log")), y2="hi:Q")
fleet_points = alt.Chart(fleet_table).mark_point(filled=True, size=60).encode(
    x="replicas:Q", y=alt.Y("p99_ttft:Q", scale=alt.Scale(type="log")), color=alt.Color("verdict:N"),
    tooltip=list(fleet_table.columns))
(fleet_band + fleet_points + slo_rule).properties(width=520, height=300, title="the fleet behind a router")
