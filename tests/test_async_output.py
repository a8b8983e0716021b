"""vLLM 0.6's asynchronous output processing (``engine.options.async_output``, the vllm-v0 preset's
rule): an iteration's tokens reach the clients when the engine's *next* call returns.

Derived by hand from vLLM v0.6.0's source: ``LLMEngine.step`` / ``_AsyncLLMEngine.step_async``
(vllm/engine/llm_engine.py, async_llm_engine.py) queue a step's outputs in ``ctx.output_queue``;
``_process_model_outputs`` turns them into RequestOutputs from the next step's model call (the
``async_callback``, run after compute_logits: vllm/worker/model_runner.py; multi-step:
vllm/worker/multi_step_model_runner.py ``_async_process_outputs``), in the executor thread, whose
``put_nowait`` into the request's asyncio queue wakes no event loop: the stream moves when that
call returns -- at its end for a single step (a prefill, or any step without multi-step), at its
start for a multi-step burst (its first call returns once launched). Nothing scheduled: the
outputs are processed at once. Constant 10 ms steps (tests/conftest.py); fast path on and off.
"""

from __future__ import annotations

import numpy as np
import pytest

import servesim
from servesim.errors import ScenarioError
from servesim.request import Request
from tests.conftest import scenario
from tests.test_golden_core import run_traced

FAST = [True, False]


def sim(fast_path, **engine):
    return scenario(engine=engine, sim={"fast_path": fast_path, "check_invariants": True})


@pytest.mark.parametrize("fast_path", FAST)
def test_two_prefill_steps_release_their_first_tokens_together(fast_path):
    """Multi-step (k = 4), V0's prefill-first order, a 32-token budget: r0 and r1 (24-token
    prompts, 6 tokens each) need two prefill steps. r0's first token, sampled at 10 ms, is
    processed inside r1's prefill call and leaves when it returns (20 ms); r1's leaves when the
    burst's first call returns (its start, 20 ms): both first tokens at 20 ms, as the published
    N = 20 run of vLLM 0.6.0 shows (benchmarks/RESULTS.md, lam060-h100-n20)::

        0       10       20                    60                    100 ms
        | r0 pf | r1 pf  | burst: r0 r1 x4     | burst: r0 r1 (1 each)|
                 ^ r0's first token leaves here (was 10 ms without the lag)
    """
    sc = sim(fast_path, num_scheduler_steps=4, max_num_batched_tokens=32, max_model_len=32,
             options={"mix": "prefill_first", "async_output": True})
    res, trace = run_traced(sc, [Request(0.0, 24, 6), Request(0.0, 24, 6)])
    assert trace == [
        (0.00, 0.01, {0: 24}), (0.01, 0.02, {1: 24}),
        (0.02, 0.03, {0: 1, 1: 1}), (0.03, 0.04, {0: 1, 1: 1}), (0.04, 0.05, {0: 1, 1: 1}),
        (0.05, 0.06, {0: 1, 1: 1}),
        (0.06, 0.07, {0: 1, 1: 1}), (0.07, 0.08, {0: 1, 1: 1}), (0.08, 0.09, {0: 1, 1: 1}),
        (0.09, 0.10, {0: 1, 1: 1}),
    ]
    df = res.requests.set_index("id")
    np.testing.assert_allclose(df.ttft_s, [0.02, 0.02], atol=1e-12)
    # burst 1's 4 tokens leave at burst 2's start (60 ms); each request's last token finishes
    # inside burst 2 (after 1 of its 4 steps) and leaves at its end, as without the lag
    np.testing.assert_allclose(df.finish_s, [0.10, 0.10], atol=1e-12)
    itl = res.summary["latency_s"]["itl"]
    assert itl["count"] == 10  # 5 gaps a request: 40 ms, 0, 0, 0, 40 ms
    assert itl["mean"] == pytest.approx(0.16 / 10, abs=1e-12)

    off = sim(fast_path, num_scheduler_steps=4, max_num_batched_tokens=32, max_model_len=32,
              options={"mix": "prefill_first", "async_output": False})
    res0, trace0 = run_traced(off, [Request(0.0, 24, 6), Request(0.0, 24, 6)])
    assert trace0 == trace  # the lag moves deliveries, never the schedule
    np.testing.assert_allclose(res0.requests.set_index("id").ttft_s, [0.01, 0.02], atol=1e-12)


@pytest.mark.parametrize("fast_path", FAST)
def test_a_burst_followed_by_a_prefill_step_waits_for_it(fast_path):
    """k = 4, prefill-first: r1's burst-1 tokens (not finished inside the burst) are processed in
    r2's prefill call and leave at its end (60 ms, was 50 ms); r0, which finished inside burst 1,
    leaves at the burst's end as before; r2's first token leaves at burst 2's start::

        0        10                        50       60                       100 ms
        | r0 r1 pf | burst 1: r0 r1 x4     | r2 pf  | burst 2: r1 r2 (1 each) |
    """
    sc = sim(fast_path, num_scheduler_steps=4, options={"mix": "prefill_first", "async_output": True})
    res, trace = run_traced(sc, [Request(0.0, 16, 3), Request(0.0, 16, 6), Request(0.02, 16, 2)])
    assert trace[5] == (0.05, 0.06, {2: 16})
    df = res.requests.set_index("id")
    np.testing.assert_allclose(df.ttft_s, [0.01, 0.01, 0.04], atol=1e-12)
    np.testing.assert_allclose(df.finish_s, [0.05, 0.10, 0.10], atol=1e-12)
    # r1: 10 ms -> 60 ms (50 ms gap, 3 zeros), -> 100 ms (40 ms); r0: 40 ms, 0; r2: 40 ms
    itl = res.summary["latency_s"]["itl"]
    assert itl["count"] == 8
    assert itl["mean"] == pytest.approx((0.05 + 0.04 + 0.04 + 0.04) / 8, abs=1e-12)
    assert itl["max"] == pytest.approx(0.05, abs=1e-12)


@pytest.mark.parametrize("fast_path", FAST)
def test_single_step_engine_delivers_every_token_one_call_late(fast_path):
    """Without multi-step every call returns with its samples: each iteration's tokens leave at the
    end of the next one; when nothing is scheduled the outputs are processed at once. r0 (4
    tokens) alone: sampled at 10, 20, 30, 40 ms; delivered at 20, 30, 40 and 40 ms (the last
    when the engine finds nothing to schedule: vLLM's extra decode call that would process it is
    not modelled). With r1 arriving at 25 ms (prefilled beside r0's last decode, 30-40 ms), the
    engine is busy at 40 ms: r0's last token and r1's first leave when the 40-50 ms call
    returns, and r1's second (sampled at 50 ms) when nothing more is scheduled."""
    sc = sim(fast_path, options={"async_output": True})
    res, trace = run_traced(sc, [Request(0.0, 8, 4)])
    assert trace == [(0.00, 0.01, {0: 8}), (0.01, 0.02, {0: 1}), (0.02, 0.03, {0: 1}), (0.03, 0.04, {0: 1})]
    df = res.requests.set_index("id")
    np.testing.assert_allclose(df.ttft_s, [0.02], atol=1e-12)
    np.testing.assert_allclose(df.finish_s, [0.04], atol=1e-12)
    itl = res.summary["latency_s"]["itl"]
    assert itl["count"] == 3 and itl["mean"] == pytest.approx(0.02 / 3, abs=1e-12)  # 10, 10, 0 ms

    res2, trace2 = run_traced(sc, [Request(0.0, 8, 4), Request(0.025, 8, 2)])
    assert trace2[3] == (0.03, 0.04, {0: 1, 1: 8})
    df2 = res2.requests.set_index("id")
    np.testing.assert_allclose(df2.finish_s, [0.05, 0.05], atol=1e-12)  # (r1: 2nd token at 50, drained)
    np.testing.assert_allclose(df2.loc[1, "ttft_s"], 0.05 - 0.025, atol=1e-12)


def test_the_vllm_v0_preset_turns_it_on_by_rule():
    base = ["model=llama-3-8b", "stop={requests: 10, warmup_requests: 0}"]
    sc = servesim.load_scenario("scenarios/engines/vllm-v0.yaml", base)
    assert sc.engine.options["async_output"] is True and sc.engine.options["mix"] == "prefill_first"
    assert any("asynchronous output processing on" in n for n in sc._engine_notes)
    eager = servesim.load_scenario("scenarios/engines/vllm-v0.yaml", base + ["step_time.cuda_graph=false"])
    assert eager.engine.options.get("async_output", False) is False  # --enforce-eager: vllm/config.py turns it off
    assert any("asynchronous output processing off (CUDA graphs off" in n for n in eager._engine_notes)
    given = servesim.load_scenario("scenarios/engines/vllm-v0.yaml", base + ["engine.options={async_output: false}"])
    assert given.engine.options["async_output"] is False
    old = servesim.load_scenario("scenarios/engines/vllm-v0.4.yaml", base)  # 0.4.2 had no such processor
    assert "async_output" not in old.engine.options


CLOSED = ["model=llama-3-8b", "stop={requests: 10, warmup_requests: 0}",
          "workload.arrival={process: closed, clients: 4, think_s: 0.0}"]


def test_the_rule_leaves_it_off_for_a_closed_loop():
    """A closed loop's client sends its next request at the engine's finish: with the lag that
    would come before its last token arrives, so the rule leaves the option off and says why."""
    sc = servesim.load_scenario("scenarios/engines/vllm-v0.yaml", CLOSED)
    assert sc.engine.options.get("async_output", False) is False
    assert any("asynchronous output processing off (a closed loop" in n for n in sc._engine_notes)


def test_async_output_with_a_closed_loop_is_refused_with_one_line():
    with pytest.raises(ScenarioError) as exc:
        servesim.load_scenario("scenarios/engines/vllm-v0.yaml", CLOSED + ["engine.options={async_output: true}"])
    msg = str(exc.value)
    assert "engine.options.async_output" in msg and "closed-loop" in msg and "\n" not in msg
