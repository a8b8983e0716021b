"""Workload defects found by a hunt (2026-12-04), each a wrong workload with exit 0 before its fix:
a class mix ignored by a trace replay, a sessions stream that ran dry inside the run, and trace
rows without a session chained into one pseudo-session."""

from __future__ import annotations

import numpy as np
import pytest

from servesim.config.streams import WorkloadConfig
from servesim.workload.generate import generate_workload

def test_a_class_mix_applies_to_a_trace_replay(tmp_path):
    """``classes: {weights: [1, 1]}`` on a trace made every request P0 (the mix was never drawn)."""
    rows = "\n".join(f"2023-11-16 18:00:{i // 10:02d}.{i % 10}000000,100,10" for i in range(400))
    f = tmp_path / "t.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows + "\n")
    wc = WorkloadConfig.model_validate({"trace": {"file": str(f), "format": "azure"}, "classes": {"weights": [1, 1]}})
    w = generate_workload(wc, seed=1)
    counts = np.bincount(w.klass, minlength=2)
    assert len(w) == 400 and counts[1] > 150 and counts[0] > 150, counts  # about 200 each (binomial)


def test_a_sessions_stream_is_topped_up_like_a_single_stream():
    """A stream with its own arrivals and sessions drew exactly stop.requests session starts; with
    max_context_tokens dropping most first turns it ran dry long before the other stream (rate
    0.26/s instead of 10 x P(keep) = 1.06/s)."""
    sessions = {"turns": 1, "think_s": 1, "new_input": {"dist": "uniform", "min": 100, "max": 2000},
                "output": {"dist": "fixed", "value": 100}, "max_context_tokens": 400}  # keeps 201 of 1,901
    wc = WorkloadConfig.model_validate({"streams": [
        {"name": "a", "class": "P0", "arrival": {"process": "poisson", "rate": 10}, "sessions": sessions},
        {"name": "b", "class": "P1", "arrival": {"process": "poisson", "rate": 2},
         "prompt": {"dist": "fixed", "value": 10}, "output": {"dist": "fixed", "value": 10}}]})
    w = generate_workload(wc, seed=1, max_requests=3000)
    a = w.stream == 0
    span = float(w.arrival_s[-1])
    expected = 10 * 201 / 1901
    assert abs(a.sum() / span - expected) < 0.15 * expected, (a.sum() / span, expected)
    assert w.arrival_s[a].max() > 0.9 * span  # stream a lasts the whole run


def test_trace_rows_without_a_session_keep_their_own_prompt(tmp_path):
    """``trace.sessions {prompt: new}``: rows without a session id were one pseudo-session, each
    prompt growing by every earlier such row's prompt + output (500, 1100, 1700, 2300)."""
    f = tmp_path / "nosess.csv"
    f.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type,Session ID\n"
                 "0,ChatGPT,40,20,60,Conversation log,s1\n"
                 "10,GPT-4,500,100,600,API log,\n"
                 "20,ChatGPT,100,12,112,Conversation log,s1\n"
                 "30,GPT-4,500,100,600,API log,\n"
                 "40,GPT-4,500,100,600,API log,\n")
    wc = WorkloadConfig.model_validate({"trace": {"file": str(f), "format": "burstgpt",
                                                  "sessions": {"column": "Session ID", "prompt": "new"}}})
    w = generate_workload(wc, seed=1)
    assert w.prompt_tokens.tolist() == [40, 500, 160, 500, 500]
    assert w.session.tolist() == [0, -1, 0, -1, -1]


def test_a_closed_loop_stopped_by_duration_never_runs_dry():
    """Its pre-drawn requests assumed nothing serves one in under 5 ms: with a 1 ms step time, 4
    clients and no think time the loop ran out after 2,001 requests, leaving the engine idle for
    most of the 10 s (busy 20 %). It now draws for the step-time model's fastest request."""
    from servesim import scenario_from_dict, simulate
    from tests.conftest import BASE, merge

    raw = merge(BASE, {"stop": {"requests": None, "duration_s": 10.0}, "step_time": {"model": "constant", "seconds": 0.001},
                       "workload": {"arrival": {"process": "closed", "clients": 4, "think_s": 0.0},
                                    "output": {"dist": "fixed", "value": 1}}})
    res = simulate(scenario_from_dict(raw))
    assert res.summary["engine"]["busy_fraction"] > 0.99
    assert res.requests.arrival_s.max() > 9.99
    # it ran out after 2,001 requests before; never-sent requests are not rows since 2026-12-05
    # (issue 26 item 6), so the count itself says the loop never ran dry
    assert len(res.requests) > 20_000 and (res.requests.status != "pending").all()


def test_a_closed_loop_too_large_to_draw_is_refused_in_one_line():
    from servesim import scenario_from_dict
    from servesim.errors import ScenarioError
    from servesim.simulate import build
    from tests.conftest import BASE, merge

    raw = merge(BASE, {"stop": {"requests": None, "duration_s": 86400.0}, "step_time": {"model": "constant", "seconds": 0.001},
                       "workload": {"arrival": {"process": "closed", "clients": 1000, "think_s": 0.0}}})
    with pytest.raises(ScenarioError, match=r"closed loop of 1,000 clients .* set stop.requests"):
        build(scenario_from_dict(raw))
