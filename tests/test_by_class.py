"""Per-class results: summary.json by_class / by_stream against a pandas recomputation from
requests.parquet, per-class goodput against each class's own SLO, KV waste of allocated KV."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from servesim.scenario import scenario_from_dict
from servesim.simulate import simulate
from tests.conftest import BASE, merge, scenario

PCTS = {"p50": 50, "p90": 90, "p95": 95, "p99": 99, "p999": 99.9}
STREAMS = [
    {"name": "chat", "class": "P0", "arrival": {"process": "poisson", "rate": 10.0},
     "prompt": {"dist": "uniform", "min": 16, "max": 200}, "output": {"dist": "uniform", "min": 1, "max": 40},
     "slo": {"ttft_p99": 0.15}},
    {"name": "docs", "class": "P2", "arrival": {"process": "poisson", "rate": 1.5},
     "prompt": {"dist": "uniform", "min": 800, "max": 2000}, "output": {"dist": "fixed", "value": 30},
     "slo": {"ttft_p90": 0.5, "e2e_p99": 1.0}},
    {"name": "sql", "class": "batch", "priority": "P3", "arrival": {"process": "gamma", "rate": 3.0, "cv": 2.0},
     "prompt": {"dist": "uniform", "min": 20, "max": 60}, "output": {"dist": "uniform", "min": 10, "max": 80},
     "contaminate": {"fraction": 0.1, "prompt": {"dist": "fixed", "value": 3000}, "stream": "huge"}},
]


def streams_scenario(**patch):
    raw = merge(BASE, {"engine": {"scheduler": "priority", "max_num_seqs": 32},
                       "step_time": {"model": "roofline"}, "slo": {"ttft_s": 0.3, "tpot_s": 0.05}})
    raw["stop"] = {"duration_s": 60, "warmup_requests": 30}
    raw["workload"] = {"streams": STREAMS}
    return scenario_from_dict(merge(raw, patch), "test")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("streams")
    res = simulate(streams_scenario())
    res.write(out)
    return res, json.loads((out / "summary.json").read_text()), pd.read_parquet(out / "requests.parquet")


def _good(df: pd.DataFrame, slo: dict) -> pd.Series:
    good = pd.Series(True, index=df.index)
    for key, target in slo.items():
        metric = key.split("_")[0]
        x = df[f"{metric}_s"]
        good &= (x <= target) | (x.isna() if metric == "tpot" else False)
    return good


def _expected(df: pd.DataFrame, meas: pd.DataFrame, window: float, slo: dict) -> dict:
    out = {"requests": {"arrived": int(df["arrival_s"].notna().sum()),
                        "completed": int((df["status"] == "finished").sum()),
                        "rejected": int((df["status"] == "rejected").sum()),
                        "measured": len(meas)}}
    for metric in ("ttft", "tpot", "e2e", "queue"):
        x = meas[f"{metric}_s"].dropna().to_numpy()
        out[metric] = {k: float(np.percentile(x, q)) for k, q in PCTS.items()} | {"mean": float(x.mean()),
                                                                                  "count": len(x)}
    multi = meas[meas["output_tokens"] > 1]
    out["itl_mean"] = float((multi["finish_s"] - multi["first_token_s"]).sum() / (multi["output_tokens"] - 1).sum())
    good = int(_good(meas, slo).sum())
    out["throughput"] = {"req_per_s": len(meas) / window, "goodput_req_per_s": good / window,
                         "output_tok_per_s": float(meas["output_tokens"].sum()) / window}
    out["attainment"] = good / len(meas)
    return out


def _check(entry: dict, exp: dict) -> None:
    r = entry["requests"]
    for k, v in exp["requests"].items():
        assert r[k] == v, k
    for metric in ("ttft", "tpot", "e2e", "queue"):
        got = entry["latency_s"][metric]
        for k, v in exp[metric].items():
            assert got[k] == pytest.approx(v, rel=1e-12, abs=0), (metric, k)
    assert entry["latency_s"]["itl"]["mean"] == pytest.approx(exp["itl_mean"], rel=1e-12)
    for k, v in exp["throughput"].items():
        assert entry["throughput"][k] == pytest.approx(v, rel=1e-12), k
    assert entry["slo"]["attainment"] == pytest.approx(exp["attainment"], rel=1e-12)


def test_per_class_metrics_equal_a_pandas_recomputation(run):
    res, summary, df = run
    assert list(summary["by_class"]) == ["P0", "P2", "batch", "huge"]
    assert list(df["stream"].cat.categories) == ["chat", "docs", "sql", "huge"]
    measured = df[(df["status"] == "finished") & (df["id"] >= 30)]
    window = float(measured["finish_s"].max() - measured["arrival_s"].min())
    global_slo = {"ttft_s": 0.3, "tpot_s": 0.05}
    slo_of = {"P0": {"ttft_p99": 0.15}, "P2": {"ttft_p90": 0.5, "e2e_p99": 1.0}, "batch": global_slo,
              "huge": global_slo}
    for label, entry in summary["by_class"].items():
        rows = df[df["class_label"] == label]
        exp = _expected(rows, measured[measured["class_label"] == label], window, slo_of[label])
        _check(entry, exp)
    # streams: the same numbers keyed by stream name, with their class label
    for name, label in (("chat", "P0"), ("docs", "P2"), ("sql", "batch"), ("huge", "huge")):
        assert summary["by_stream"][name]["class"] == label
        assert summary["by_stream"][name]["latency_s"] == summary["by_class"][label]["latency_s"]
    # the run's goodput counts each request against its own class's SLO: the classes add up
    total = sum(e["throughput"]["goodput_req_per_s"] for e in summary["by_class"].values())
    assert summary["throughput"]["goodput_req_per_s"] == pytest.approx(total, rel=1e-12)
    assert sum(e["requests"]["measured"] for e in summary["by_class"].values()) == summary["requests"]["measured"]


def test_percentile_targets_are_checked_against_the_class_percentiles(run):
    _, summary, df = run
    docs = summary["by_class"]["P2"]["slo"]
    assert docs["targets"] == {"ttft_p90": 0.5, "e2e_p99": 1.0}
    lat = summary["by_class"]["P2"]["latency_s"]
    assert docs["met"]["ttft_p90"] == {"target": 0.5, "value": lat["ttft"]["p90"], "met": lat["ttft"]["p90"] <= 0.5}
    assert docs["met"]["e2e_p99"]["value"] == lat["e2e"]["p99"]
    assert docs["all_met"] == all(m["met"] for m in docs["met"].values())
    assert summary["by_class"]["batch"]["slo"]["targets"] == {"ttft_s": 0.3, "tpot_s": 0.05}
    assert summary["by_class"]["batch"]["slo"]["all_met"] is None  # thresholds only, no percentile target


def test_goodput_uses_each_class_slo():
    """Two streams with the same traffic and different SLOs: the lax one is all good, the strict
    one none, whatever the scenario's own slo says."""
    twin = {"arrival": {"process": "poisson", "rate": 5.0}, "prompt": {"dist": "fixed", "value": 64},
            "output": {"dist": "fixed", "value": 8}}
    raw = merge(BASE, {"stop": {"requests": 400}, "slo": {"ttft_s": 0.015, "tpot_s": 1.0}})
    raw["workload"] = {"streams": [{"name": "lax", "class": "P1", **twin, "slo": {"ttft_p99": 10.0}},
                                   {"name": "strict", "class": "P1x", "priority": "P1", **twin,
                                    "slo": {"ttft_p50": 0.001}},
                                   {"name": "plain", "class": "P2", **twin}]}
    s = simulate(scenario_from_dict(raw, "t")).summary
    lax, strict, plain = (s["by_class"][k] for k in ("P1", "P1x", "P2"))
    assert lax["slo"]["attainment"] == 1.0 and lax["slo"]["all_met"] is True
    assert strict["slo"]["attainment"] == 0.0 and strict["slo"]["all_met"] is False
    assert lax["throughput"]["goodput_req_per_s"] == lax["throughput"]["req_per_s"] > 0
    assert strict["throughput"]["goodput_req_per_s"] == 0.0
    # the stream without an slo: the scenario's thresholds (TTFT <= 15 ms: some, not all)
    ttft = s["by_class"]["P2"]["latency_s"]["ttft"]
    assert ttft["p50"] <= 0.015 < ttft["max"]
    assert 0 < plain["slo"]["attainment"] < 1


def test_single_stream_form_reports_sla_classes():
    sc = scenario(stop={"requests": 600, "warmup_requests": 50},
                  engine={"scheduler": "priority", "max_num_seqs": 4},
                  workload={"arrival": {"process": "poisson", "rate": 60.0}, "classes": {"weights": [1, 0, 2, 1]}})
    res = simulate(sc)
    s, df = res.summary, res.requests
    assert "by_stream" not in s
    assert list(s["by_class"]) == ["P0", "P2", "P3"]
    measured = df[(df["status"] == "finished") & (df["id"] >= 50)]
    window = float(measured["finish_s"].max() - measured["arrival_s"].min())
    for k, label in ((0, "P0"), (2, "P2"), (3, "P3")):
        assert (df[df["klass"] == k]["class_label"] == label).all()
        assert s["by_class"][label]["streams"] == ["default"]
        exp = _expected(df[df["klass"] == k], measured[measured["klass"] == k], window,
                        {"ttft_s": 1.0, "tpot_s": 0.1})
        _check(s["by_class"][label], exp)
    # the P0 tail is better than P3's under the priority scheduler
    assert s["by_class"]["P0"]["latency_s"]["queue"]["p99"] < s["by_class"]["P3"]["latency_s"]["queue"]["p99"]


# ------------------------------------------------------------------------------ fragmentation
KV_CASES = [
    {}, {"engine": {"enable_chunked_prefill": True}}, {"engine": {"scheduler": "chunked", "chunked_prefill_size": 64}},
    {"engine": {"scheduler": "priority"}}, {"engine": {"scheduler": "static-fifo"}},
    {"engine": {"kv_allocator": "static"}}, {"engine": {"kv_allocator": "elastic"}},
    {"engine": {"enable_prefix_caching": True}}, {"engine": {"preemption": "swap"}},
]


@pytest.mark.parametrize("patch", KV_CASES, ids=lambda p: json.dumps(p.get("engine", {})))
def test_block_size_one_has_no_internal_fragmentation(patch):
    sc = scenario(**merge({"stop": {"requests": 150}, "engine": {"block_size": 1, "max_num_seqs": 16, "max_model_len": 2048,
                                                                   "num_gpu_blocks_override": 9000},
                           "workload": {"arrival": {"process": "poisson", "rate": 200.0},
                                        "prompt": {"dist": "uniform", "min": 1, "max": 700},
                                        "output": {"dist": "uniform", "min": 1, "max": 60}}}, patch))
    kv = simulate(sc).summary["kv"]
    assert kv["internal_fragmentation"] == {"mean": 0.0, "peak": 0.0}
    assert kv["of_allocated"]["internal_fragmentation"] == 0.0


@pytest.mark.parametrize("patch", KV_CASES[:3] + KV_CASES[5:7], ids=lambda p: json.dumps(p.get("engine", {})))
def test_waste_of_allocated_and_of_pool_agree(patch):
    sc = scenario(**merge({"stop": {"requests": 150}, "engine": {"block_size": 16, "max_num_seqs": 16},
                           "workload": {"arrival": {"process": "poisson", "rate": 200.0},
                                        "prompt": {"dist": "uniform", "min": 1, "max": 700},
                                        "output": {"dist": "uniform", "min": 1, "max": 60}}}, patch))
    kv = simulate(sc).summary["kv"]
    alloc = kv["of_allocated"]
    # both are time integrals: share of pool = share of allocated x allocated share of pool
    for key in ("internal_fragmentation", "reservation_waste"):
        assert kv[key]["mean"] == pytest.approx(alloc[key] * kv["mean_usage"], rel=1e-9, abs=1e-15)
    assert 0 <= alloc["waste"] <= 1
    assert alloc["waste"] == pytest.approx(alloc["internal_fragmentation"] + alloc["reservation_waste"])
    if patch == {}:
        assert alloc["internal_fragmentation"] > 0 and alloc["reservation_waste"] == 0
    if patch.get("engine", {}).get("kv_allocator") == "static":
        assert alloc["reservation_waste"] > 0.5
