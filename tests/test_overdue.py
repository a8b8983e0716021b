"""Unfinished requests past their deadline are misses; a class with arrivals and nothing
completed misses its targets (issue 32: capacity answers a planner can trust)."""

from __future__ import annotations

import numpy as np
import pytest

from servesim import scenario_from_dict, simulate
from tests.conftest import BASE, merge


def overloaded(duration: float, streams: bool = False):
    """One slot, 5 s per request (50 tokens x 100 ms), 2 req/s: the queue grows without bound."""
    wl = {"arrival": {"process": "poisson", "rate": 2.0}, "prompt": {"dist": "fixed", "value": 1},
          "output": {"dist": "fixed", "value": 50}}
    if streams:
        wl = {"streams": [{"name": "chat", "class": "gold", "priority": "P0", **wl, "slo": {"ttft_p99": 1.0}}]}
    raw = merge({k: v for k, v in BASE.items() if k != "workload"},
                {"stop": {"duration_s": duration, "warmup_requests": 0}, "engine": {"max_num_seqs": 1},
                 "step_time": {"model": "constant", "seconds": 0.1}, "slo": {"ttft_s": 1.0, "tpot_s": 1.0}})
    return scenario_from_dict({**raw, "workload": wl}, "test")


def test_unfinished_requests_past_their_ttft_count_as_misses():
    res = simulate(overloaded(30.0))
    t = res.requests
    s = res.summary
    end = s["sim_time_s"]
    unfinished = t[(t.status != "finished") & (t.status != "rejected")]
    first = unfinished.first_token_s - unfinished.arrival_s
    late = np.where(first.isna(), end - unfinished.arrival_s > 1.0, first > 1.0)
    assert late.sum() > 10  # most of the backlog waited far past 1 s
    done = t[t.status == "finished"]
    good = int(((done.ttft_s <= 1.0) & (done.tpot_s.fillna(0) <= 1.0)).sum())
    assert s["slo"]["overdue"] == int(late.sum())
    assert s["slo"]["attainment"] == pytest.approx(good / (len(done) + late.sum()))
    # before: good / completed only (a cut run judged only the requests that got through)
    assert s["slo"]["attainment"] < good / len(done)


def test_a_class_with_arrivals_and_nothing_completed_misses_its_target():
    res = simulate(overloaded(3.0, streams=True))  # the first request needs 5 s: nothing completes
    g = res.summary["by_class"]["gold"]
    assert g["requests"]["completed"] == 0 and g["requests"]["arrived"] > 0
    m = g["slo"]["met"]["ttft_p99"]
    assert m["met"] is False and m["value"] is None and "no request" in m["why"]
    assert g["slo"]["all_met"] is False and g["slo"]["attainment"] == 0.0


def test_a_percentile_target_is_missed_when_overdue_requests_exceed_its_tail():
    res = simulate(overloaded(30.0, streams=True))
    m = res.summary["by_class"]["gold"]["slo"]["met"]["ttft_p99"]
    assert m["overdue"] > 0 and m["met"] is False
