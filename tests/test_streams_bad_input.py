"""Bad input in the stream fields: one line naming the field, the value and what is allowed;
exit status 2 on the CLI, ScenarioError from Python."""

from __future__ import annotations

import copy

import pytest

from servesim import ServesimError, scenario_from_dict
from tests.conftest import BASE
from tests.test_bad_input import run_cli

A = {"name": "a", "arrival": {"process": "poisson", "rate": 1.0}, "prompt": {"dist": "fixed", "value": 8},
     "output": {"dist": "fixed", "value": 4}}
SESSIONS = {"turns": 2, "new_input": {"dist": "fixed", "value": 8}, "output": {"dist": "fixed", "value": 4}}
BIG = {"fraction": 0.1, "prompt": {"dist": "fixed", "value": 9}}


def wl(workload, **top):
    raw = copy.deepcopy(BASE)
    raw["workload"] = workload
    raw.update(top)
    return raw


def without(d, key):
    return {k: v for k, v in d.items() if k != key}


CASES = [
    ("duplicate-name", wl({"streams": [A, A]}), ["workload.streams", "'a' is used twice"]),
    ("no-arrival", wl({"streams": [without(A, "arrival")]}), ["workload.streams[0]", "needs arrival", "share"]),
    ("arrival-and-share", wl({"arrival": A["arrival"], "streams": [{**A, "share": 1}]}),
     ["workload.streams[0]", "one of arrival, share or trace"]),
    ("no-lengths", wl({"streams": [{"name": "a", "arrival": A["arrival"]}]}), ["stream 'a'", "give its lengths"]),
    ("prompt-without-output", wl({"streams": [without(A, "output")]}), ["stream 'a'", "both prompt and output"]),
    ("share-without-arrival", wl({"streams": [{**without(A, "arrival"), "share": 2}]}),
     ["'a' has a share of workload.arrival, which is not given"]),
    ("arrival-unused", wl({"arrival": A["arrival"], "streams": [A]}), ["workload.arrival is unused"]),
    ("single-stream-field", wl({"prompt": A["prompt"], "streams": [A]}),
     ["workload.prompt belongs to the single-stream form"]),
    ("label-without-priority", wl({"streams": [{**A, "class": "gold"}]}), ["class 'gold'", "give priority"]),
    ("class-priority-clash", wl({"streams": [{**A, "class": "P1", "priority": "P2"}]}), ["P1", "P2", "disagree"]),
    ("class-out-of-range", wl({"streams": [{**A, "class": "P7"}]}), ["workload.streams[0].class", "'P7'", "P0..P4"]),
    ("slo-unknown-target", wl({"streams": [{**A, "slo": {"ttft_p98": 1}}]}),
     ["workload.streams[0].slo.ttft_p98", "unknown field"]),
    ("slo-empty", wl({"streams": [{**A, "slo": {}}]}), ["workload.streams[0].slo", "at least one target", "e2e_p99"]),
    ("slo-negative", wl({"streams": [{**A, "slo": {"ttft_p99": -1}}]}),
     ["workload.streams[0].slo.ttft_p99", "-1", "greater than 0"]),
    ("slo-infinite", wl({"streams": [{**A, "slo": {"e2e_p99": ".inf"}}]}), ["slo.e2e_p99", "finite"]),
    ("slo-clash-in-class", wl({"streams": [{**A, "class": "P1", "slo": {"ttft_p99": 1}},
                                           {**A, "name": "b", "class": "P1", "slo": {"ttft_p99": 2}}]}),
     ["'a' and 'b' share class 'P1'", "different slo"]),
    ("contaminate-fraction", wl({"streams": [{**A, "contaminate": {**BIG, "fraction": 1.5}}]}),
     ["workload.streams[0].contaminate.fraction", "1.5", "less than or equal to 1"]),
    ("contaminate-sessions", wl({"streams": [{"name": "s", "arrival": A["arrival"], "sessions": SESSIONS,
                                              "contaminate": BIG}]}), ["stream 's'", "prefix chains"]),
    ("contaminate-name-clash", wl({"streams": [{**A, "contaminate": {**BIG, "stream": "a"}}]}),
     ["contaminate.stream 'a'", "configured stream"]),
    ("rate-scale-zero", wl({"streams": [A], "rate_scale": 0}), ["workload.rate_scale", "0", "greater than 0"]),
    ("rate-scale-infinite", wl({"streams": [A], "rate_scale": ".inf"}), ["workload.rate_scale", "finite"]),
    ("rate-scale-closed-loop", wl({"arrival": {"process": "closed", "clients": 2}, "rate_scale": 2}),
     ["rate_scale 2", "closed loop has no rate"]),
    ("ramp-negative", wl({"arrival": {"process": "closed", "clients": 2, "ramp_up_s": -1}}),
     ["workload.arrival.closed.ramp_up_s", "-1"]),
    ("clients-boolean", wl({"arrival": {"process": "closed", "clients": True}}),
     ["workload.arrival.closed.clients", "True", "integer"]),
    ("stream-name", wl({"streams": [{**A, "name": "a b"}]}), ["workload.streams[0].name", "'a b'"]),
    ("streams-empty", wl({"streams": []}), ["workload.streams", "at least 1 item"]),
    ("sessions-closed-loop", wl({"streams": [{"name": "s", "arrival": {"process": "closed", "clients": 2},
                                              "sessions": SESSIONS}]}), ["stream 's'", "open-loop arrival"]),
    ("warmup-with-mixed-loops", wl({"streams": [{**A, "arrival": {"process": "closed", "clients": 2}},
                                                {**A, "name": "b"}]}, stop={"requests": 50, "warmup_requests": 5}),
     ["stop.warmup_requests 5", "numbered per stream"]),
]


def _fix_inf(raw):
    """YAML's .inf, written as a string above, as the float a YAML file would give."""
    if isinstance(raw, dict):
        return {k: _fix_inf(v) for k, v in raw.items()}
    if isinstance(raw, list):
        return [_fix_inf(v) for v in raw]
    return float("inf") if raw == ".inf" else raw


@pytest.mark.parametrize("case_id,raw,needles", CASES, ids=[c[0] for c in CASES])
def test_bad_stream_field_one_line_exit_2(tmp_path, case_id, raw, needles):
    raw = _fix_inf(raw)
    res = run_cli(tmp_path, raw)
    assert res.exit_code == 2, (res.stdout, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), lines
    assert "Traceback" not in res.stderr + res.stdout
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    with pytest.raises(ServesimError):
        scenario_from_dict(raw, "python")
