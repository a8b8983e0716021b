"""Long and hostile runs: requests that can never fit are rejected and counted (never a hang),
at the exact boundary, under every policy and KV manager; an overloaded run stops at its stop
condition and reports what it left unfinished."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from typer.testing import CliRunner

from servesim import scenario_from_dict
from servesim.cli import app
from servesim.request import FINISHED, REJECTED, Reject, Request, Workload
from servesim.simulate import build, run_built
from servesim.testing import Checker
from tests.conftest import BASE, merge

POLICIES = ["vllm", "chunked", "priority", "static-fifo"]
KV = {
    "paged": {},
    "static-request": {"kv_allocator": "static", "kv": {"static": {"reserve": "request"}}},
    "static-max_model_len": {"kv_allocator": "static"},
    "elastic": {"kv_allocator": "elastic", "kv": {"elastic": {"base_tokens": 8, "growth_tokens": 4}}},
    "prefix": {"enable_prefix_caching": True},
}
MML = 96
TINY = {"block_size": 4, "num_gpu_blocks_override": 5, "max_model_len": MML, "max_num_batched_tokens": MML,
        "max_num_seqs": 4}  # a pool of 20 token slots


def _engine(policy: str, kv: str) -> dict:
    eng = {"scheduler": policy, **TINY, **KV[kv]}
    if policy == "static-fifo":  # a static batch larger than the slots is refused (issue 26)
        eng["max_batch_size"] = eng["max_num_seqs"]
    if policy == "chunked":
        eng["max_num_batched_tokens"] = 8
    return eng


@pytest.mark.parametrize("kv", list(KV))
@pytest.mark.parametrize("policy", POLICIES)
def test_requests_that_can_never_fit_are_rejected_at_the_boundary(policy, kv):
    sc = scenario_from_dict(merge(BASE, {"engine": _engine(policy, kv), "stop": {"requests": 8}}))
    probe = build(sc)  # the engine's bound: the most token slots one request can ever hold
    slots = probe.replica.engines[0].cfg.max_slots

    def req(t, total):  # a request needing ``total - 1`` slots (its last token is never stored)
        prompt = max(1, total // 2)
        return Request(arrival_s=t, prompt_tokens=prompt, output_tokens=total - prompt)

    reqs = [req(0.00, 6), req(0.01, MML + 1), req(0.02, 5000), req(0.03, 7)]
    fits, over = slots + 1, slots + 2  # slots + 1 tokens need exactly ``slots`` slots
    if 2 <= fits <= MML:
        reqs += [req(0.04, fits), req(0.05, over)]
    reqs += [req(0.06, 4), req(0.07, 3)]
    wl = Workload.from_requests(reqs)
    checker = Checker()
    t0 = time.perf_counter()
    b = checker.build(sc, workload=wl)
    res = run_built(b)
    wall = time.perf_counter() - t0
    checker.finish(res)
    t = res.table
    assert wall < 30
    reasons = {i: int(t.reject_reason[i]) for i in range(t.n) if t.status[i] == REJECTED}
    expect = {1: Reject.MAX_MODEL_LEN, 2: Reject.MAX_MODEL_LEN}
    if 2 <= fits <= MML:
        expect[5] = Reject.KV_CAPACITY if over <= MML else Reject.MAX_MODEL_LEN
    if slots < 5:  # nothing fits a pool reserved per max_model_len (static): every request is too long
        expect = {i: reasons.get(i) for i in range(t.n)}
        assert set(reasons.values()) <= {Reject.KV_CAPACITY, Reject.MAX_MODEL_LEN} and len(reasons) == t.n
    assert reasons == expect
    assert ((t.status == FINISHED) | (t.status == REJECTED)).all()  # nothing left hanging
    s = res.summary["requests"]
    assert s["rejected"] == len(expect) and s["completed"] == t.n - len(expect) and s["in_flight"] == 0
    by_reason = {Reject.NAMES[v]: list(reasons.values()).count(v) for v in set(reasons.values())}
    assert s["rejected_by_reason"] == by_reason


@pytest.mark.parametrize("policy", POLICIES)
def test_an_overloaded_run_stops_at_its_duration_and_reports_the_unfinished(policy):
    raw = merge(BASE, {"stop": {"requests": 100_000, "duration_s": 3.0},
                       "engine": {"scheduler": policy, "max_num_seqs": 4,
                                  **({"max_batch_size": 4} if policy == "static-fifo" else {})},
                       "workload": {"arrival": {"process": "poisson", "rate": 400.0},
                                    "output": {"dist": "fixed", "value": 50}}})
    checker = Checker()
    b = checker.build(scenario_from_dict(raw))
    res = run_built(b)
    checker.finish(res)
    s = res.summary
    r = s["requests"]
    # the iteration under way at duration_s completes: the run ends at the next boundary
    assert 3.0 <= s["sim_time_s"] < 3.0 + 0.0101  # (one constant 10 ms step)
    assert r["in_flight"] > 500 and r["completed"] > 0
    assert r["arrived"] == r["completed"] + r["rejected"] + r["in_flight"]
    assert r["arrived"] < 100_000


def test_the_console_reports_what_an_overloaded_run_left_unfinished(tmp_path):
    raw = merge(BASE, {"engine": {"max_num_seqs": 2},
                       "workload": {"arrival": {"process": "poisson", "rate": 300.0},
                                    "output": {"dist": "fixed", "value": 50}}})
    raw["stop"] = {"duration_s": 2.0}
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(raw))
    res = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    flight = summary["requests"]["in_flight"]
    assert flight > 100
    assert f"{flight:,} in flight" in res.output.replace("\n", " ")


def test_an_overloaded_request_limit_drains_every_request():
    """stop.requests alone: every request arrives, and the run goes on until each has ended."""
    raw = merge(BASE, {"stop": {"requests": 300}, "engine": {"max_num_seqs": 2},
                       "workload": {"arrival": {"process": "poisson", "rate": 500.0},
                                    "output": {"dist": "fixed", "value": 20}}})
    res = run_built(build(scenario_from_dict(raw)))
    r = res.summary["requests"]
    assert r["completed"] == 300 and r["in_flight"] == 0
    assert res.summary["sim_time_s"] > float(np.nanmax(res.table.arrival)) + 20 * 0.01


@pytest.fixture
def memory_cap():
    """A blow-up becomes a MemoryError in this process instead of the machine's OOM killer."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = 8 << 30 if hard == resource.RLIM_INFINITY else min(8 << 30, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    yield
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


ENDLESS_SESSIONS = {"arrival": {"process": "poisson", "rate": 5.0},
                    "sessions": {"turns": {"dist": "fixed", "value": 1_000_000_000}, "think_s": 0.0,
                                 "think_dist": "fixed", "new_input": {"dist": "fixed", "value": 8},
                                 "output": {"dist": "fixed", "value": 4}}}


def test_a_session_of_a_billion_turns_draws_only_what_the_run_needs(memory_cap):
    """Found by the fuzzer: three requests from sessions of 10^9 turns took 22 GB (every turn was
    drawn) and the OOM killer ended the run. A session's turns past stop.requests can never be
    among the first stop.requests to arrive, so they are not drawn."""
    raw = merge(BASE, {"stop": {"requests": 3}})
    raw["workload"] = ENDLESS_SESSIONS
    t0 = time.perf_counter()
    res = run_built(build(scenario_from_dict(raw)))
    assert time.perf_counter() - t0 < 30
    assert res.summary["requests"]["completed"] == 3


def test_sessions_that_would_draw_too_many_requests_fail_in_one_line(tmp_path, memory_cap):
    raw = merge(BASE, {})
    raw["stop"] = {"duration_s": 1.0}
    raw["workload"] = ENDLESS_SESSIONS
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(raw))
    res = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "out")])
    assert res.exit_code == 2, res.output
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "workload.sessions.turns" in lines[0] and "100,000,000" in lines[0]
