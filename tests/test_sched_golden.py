"""Golden traces per policy: tiny workloads whose exact iterations are written out by hand.

Constant step model (10 ms), so every timestamp is a sum of steps, arrival times and (for swaps)
PCIe transfer times. Each trace runs with the engine's fast path on and off.
"""

from __future__ import annotations

import numpy as np
import pytest

from servesim.hardware import GPUS
from servesim.models import MODELS
from servesim.request import Request
from tests.conftest import scenario
from tests.test_golden_core import run_traced

FAST = [True, False]


def sim(fast_path, **engine):
    return scenario(engine=engine, sim={"fast_path": fast_path, "check_invariants": True})


# ------------------------------------------------------------------------------- static-fifo
@pytest.mark.parametrize("fast_path", FAST)
def test_static_fifo_holds_short_request_behind_long_one(fast_path):
    """Batch {r0 long, r1 short}: r1 finishes after one iteration, but r2 (arrived at 5 ms) waits
    for r0 to finish although a slot is free."""
    sc = sim(fast_path, scheduler="static-fifo", max_batch_size=2)
    reqs = [Request(0.0, 4, 4), Request(0.0, 2, 1), Request(0.005, 3, 2)]
    res, trace = run_traced(sc, reqs)
    assert trace == [
        (0.00, 0.01, {0: 4, 1: 2}),  # the batch prefills together; r1 (1 output token) is done
        (0.01, 0.02, {0: 1}),  # r1's slot stays empty: no joining mid-batch
        (0.02, 0.03, {0: 1}),
        (0.03, 0.04, {0: 1}),  # r0's 4th token: the batch is over
        (0.04, 0.05, {2: 3}),  # the next batch
        (0.05, 0.06, {2: 1}),
    ]
    df = res.requests.set_index("id")
    np.testing.assert_allclose(df.finish_s, [0.04, 0.01, 0.06], atol=1e-12)
    np.testing.assert_allclose(df.loc[2, "blocked_static_batch_s"], 0.035, atol=1e-12)
    np.testing.assert_allclose(df.loc[2, "queue_s"], 0.035, atol=1e-12)


@pytest.mark.parametrize("fast_path", FAST)
def test_static_fifo_batch_size_and_micro_batches(fast_path):
    """max_batch_size 3 takes r0..r2 and leaves r3 queued; micro-batches of 2 prefill r0, r1 then
    r2; decoding starts when all three have prefilled."""
    sc = scenario(engine={"scheduler": "static-fifo", "max_batch_size": 3, "options": {"micro_batch_size": 2}},
                  sim={"fast_path": fast_path, "check_invariants": True})
    reqs = [Request(0.0, 5, 2), Request(0.0, 6, 2), Request(0.0, 7, 3), Request(0.0, 2, 1)]
    res, trace = run_traced(sc, reqs)
    assert trace == [
        (0.00, 0.01, {0: 5, 1: 6}),  # micro-batch 1
        (0.01, 0.02, {2: 7}),  # micro-batch 2; r0 and r1 hold their first token meanwhile
        (0.02, 0.03, {0: 1, 1: 1, 2: 1}),  # r0, r1 done
        (0.03, 0.04, {2: 1}),  # r2 done: batch over
        (0.04, 0.05, {3: 2}),
    ]
    df = res.requests.set_index("id")
    np.testing.assert_allclose(df.first_scheduled_s, [0.0, 0.0, 0.01, 0.04], atol=1e-12)
    np.testing.assert_allclose(df.blocked_static_batch_s, [0.0, 0.0, 0.01, 0.04], atol=1e-12)


@pytest.mark.parametrize("fast_path", FAST)
def test_static_fifo_batch_stops_at_kv_reservation(fast_path):
    """A 4-block pool of 4-token blocks (16 slots): r0 reserves 3 blocks (10 + 3 - 1 = 12 slots),
    r1 needs 2 more, so the first batch is r0 alone."""
    sc = sim(fast_path, scheduler="static-fifo", max_batch_size=8, block_size=4, num_gpu_blocks_override=4,
             max_model_len=16)  # a batch of up to 8: the KV reservation, not the batch size, binds
    reqs = [Request(0.0, 10, 3), Request(0.0, 3, 3)]
    _, trace = run_traced(sc, reqs)
    assert trace == [
        (0.00, 0.01, {0: 10}),
        (0.01, 0.02, {0: 1}),
        (0.02, 0.03, {0: 1}),
        (0.03, 0.04, {1: 3}),
        (0.04, 0.05, {1: 1}),
        (0.05, 0.06, {1: 1}),
    ]


# ---------------------------------------------------------------------------------- chunked
CHUNK_REQS = [Request(0.0, 10, 8), Request(0.005, 1000, 2)]


def chunked(fast_path, mix):
    return sim(fast_path, scheduler="chunked", enable_chunked_prefill=True, chunked_prefill_size=256,
               max_num_batched_tokens=2048, options={"mix": mix})


@pytest.mark.parametrize("fast_path", FAST)
def test_chunked_stall_free_splits_prompt_around_decodes(fast_path):
    """The 1,000-token prompt is split into chunks that fill the 256-token budget beside r0's decode."""
    res, trace = run_traced(chunked(fast_path, "stall_free"), CHUNK_REQS)
    assert trace == [
        (0.00, 0.01, {0: 10}),
        (0.01, 0.02, {0: 1, 1: 255}),
        (0.02, 0.03, {0: 1, 1: 255}),
        (0.03, 0.04, {0: 1, 1: 255}),
        (0.04, 0.05, {0: 1, 1: 235}),  # r1's last chunk: its first token
        (0.05, 0.06, {0: 1, 1: 1}),  # r1 done
        (0.06, 0.07, {0: 1}),
        (0.07, 0.08, {0: 1}),
    ]
    df = res.requests.set_index("id")
    np.testing.assert_allclose(df.first_token_s, [0.01, 0.05], atol=1e-12)
    # r0 never stalls: a token every iteration
    np.testing.assert_allclose(df.loc[0, "tpot_s"], 0.01, atol=1e-12)


@pytest.mark.parametrize("fast_path", FAST)
def test_chunked_chunk_only_alternates_256_token_chunks_with_decodes(fast_path):
    res, trace = run_traced(chunked(fast_path, "chunk_only"), CHUNK_REQS)
    assert trace == [
        (0.00, 0.01, {0: 10}),
        (0.01, 0.02, {0: 1}),  # decode turn; r1 waits
        (0.02, 0.03, {1: 256}),
        (0.03, 0.04, {0: 1}),
        (0.04, 0.05, {1: 256}),
        (0.05, 0.06, {0: 1}),
        (0.06, 0.07, {1: 256}),
        (0.07, 0.08, {0: 1}),
        (0.08, 0.09, {1: 232}),
        (0.09, 0.10, {0: 1, 1: 1}),
        (0.10, 0.11, {0: 1}),
        (0.11, 0.12, {0: 1}),
    ]
    df = res.requests.set_index("id")
    np.testing.assert_allclose(df.loc[1, "blocked_token_budget_s"], 0.01, atol=1e-12)  # the decode turn
    np.testing.assert_allclose(df.loc[1, "blocked_iteration_s"], 0.005, atol=1e-12)


@pytest.mark.parametrize("fast_path", FAST)
def test_chunked_hybrid_only_runs_the_whole_prompt_with_decodes(fast_path):
    _, trace = run_traced(chunked(fast_path, "hybrid_only"), CHUNK_REQS)
    assert trace[:3] == [
        (0.00, 0.01, {0: 10}),
        (0.01, 0.02, {0: 1, 1: 1000}),
        (0.02, 0.03, {0: 1, 1: 1}),
    ]
    assert len(trace) == 8


@pytest.mark.parametrize("fast_path", FAST)
def test_chunked_prefill_first_stalls_decodes(fast_path):
    _, trace = run_traced(chunked(fast_path, "prefill_first"), CHUNK_REQS)
    assert trace[:6] == [
        (0.00, 0.01, {0: 10}),
        (0.01, 0.02, {1: 256}),  # SGLang's default: prefill first, r0's decode waits
        (0.02, 0.03, {1: 256}),
        (0.03, 0.04, {1: 256}),
        (0.04, 0.05, {1: 232}),
        (0.05, 0.06, {0: 1, 1: 1}),
    ]


@pytest.mark.parametrize("fast_path", FAST)
def test_chunked_max_running_requests(fast_path):
    sc = sim(fast_path, scheduler="chunked", max_running_requests=1)
    reqs = [Request(0.0, 4, 2), Request(0.0, 4, 1)]
    res, trace = run_traced(sc, reqs)
    assert trace == [(0.00, 0.01, {0: 4}), (0.01, 0.02, {0: 1}), (0.02, 0.03, {1: 4})]
    np.testing.assert_allclose(res.requests.set_index("id").loc[1, "blocked_batch_slots_s"], 0.02, atol=1e-12)


# -------------------------------------------------------------------------------------- vllm
@pytest.mark.parametrize("fast_path", FAST)
def test_vllm_swap_preemption_trace(fast_path):
    """The recompute trace of test_golden_core, by swap: r1 keeps its 2 computed tokens, resumes
    with 1 token instead of 3, and both transfers (one block of 2 tokens each way) stall their
    iterations by 2 * kv_bytes_per_token / PCIe bandwidth."""
    sc = sim(fast_path, block_size=2, num_gpu_blocks_override=4, max_num_batched_tokens=16, max_model_len=16,
             preemption="swap")
    swap = 2 * MODELS["llama-3-8b"].kv_bytes_per_token(1, 1) / GPUS["a100-80g"].pcie_bytes_per_s
    reqs = [Request(0.0, 3, 4), Request(0.001, 2, 3)]
    res, trace = run_traced(sc, reqs)
    t = [0.0, 0.01, 0.02, 0.03 + swap, 0.04 + swap, 0.05 + 2 * swap, 0.06 + 2 * swap]
    assert trace == [(round(t[i], 9), round(t[i + 1], 9), b) for i, b in
                     enumerate([{0: 3}, {0: 1, 1: 2}, {0: 1}, {0: 1}, {1: 1}, {1: 1}])]
    df = res.requests.set_index("id")
    assert df.preemptions.tolist() == [0, 1]
    np.testing.assert_allclose(df.loc[1, "blocked_preempted_s"], 0.02 + swap, atol=1e-12)
    assert res.summary["engine"]["other_s"] == pytest.approx(2 * swap)
    assert res.summary["engine"]["swap_outs"] == 1 == res.summary["requests"]["preemptions"]


@pytest.mark.parametrize("fast_path", FAST)
def test_vllm_swap_space_exhausted_falls_back_to_recompute(fast_path):
    sc = scenario(engine={"block_size": 2, "num_gpu_blocks_override": 4, "max_num_batched_tokens": 16,
                          "max_model_len": 16, "preemption": "swap", "options": {"swap_space_gib": 0}},
                  sim={"fast_path": fast_path, "check_invariants": True})
    res, trace = run_traced(sc, [Request(0.0, 3, 4), Request(0.001, 2, 3)])
    assert trace[4] == (0.04, 0.05, {1: 3})  # recomputed, as in the recompute trace
    assert res.summary["engine"]["other_s"] == 0.0
    assert res.summary["engine"]["swap_outs"] == 0 and res.summary["requests"]["preemptions"] == 1


@pytest.mark.parametrize("fast_path", FAST)
def test_vllm_multi_step_bursts(fast_path):
    """num_scheduler_steps 4: r1 arrives at 15 ms but joins only at the burst boundary (50 ms);
    r0's four burst tokens reach the client together. r1's last burst runs its 4 steps for the
    one token it needs (vLLM 0.6's fixed bursts: the 3 after its finish are discarded)."""
    sc = sim(fast_path, num_scheduler_steps=4)
    res, trace = run_traced(sc, [Request(0.0, 4, 6), Request(0.015, 4, 2)])
    assert trace == [
        (0.00, 0.01, {0: 4}),
        (0.01, 0.02, {0: 1}), (0.02, 0.03, {0: 1}), (0.03, 0.04, {0: 1}), (0.04, 0.05, {0: 1}),
        (0.05, 0.06, {0: 1, 1: 4}),
        (0.06, 0.07, {1: 1}), (0.07, 0.08, {1: 1}), (0.08, 0.09, {1: 1}), (0.09, 0.10, {1: 1}),
    ]
    df = res.requests.set_index("id")
    np.testing.assert_allclose(df.loc[1, "blocked_iteration_s"], 0.035, atol=1e-12)
    np.testing.assert_allclose(df.finish_s, [0.06, 0.10], atol=1e-12)
    itl = res.summary["latency_s"]["itl"]
    assert itl["p999"] == pytest.approx(0.04, rel=0.01)  # the burst's tokens arrive 40 ms after the previous


@pytest.mark.parametrize("fast_path", FAST)
def test_vllm_0_6_multi_step_golden_timeline(fast_path):
    """vLLM 0.6 multi-step, derived by hand from its source (v0.6.x):

    * LLMEngine.step (vllm/engine/llm_engine.py) calls the scheduler only when the batch has no
      remaining steps: a decode burst runs all ``num_scheduler_steps`` steps with the batch it
      started with; a prefill batch runs one step (Scheduler: num_lookahead_slots 0 for prompts).
    * Outputs are returned only at a burst's last step (the "Multi-step case" returns no request
      outputs before; worker/multi_step_model_runner.py pythonizes the steps' tokens then): a
      streaming client receives a burst's tokens together at its end.
    * MultiStepOutputProcessor._process_seq_outputs (engine/output_processor/multi_step.py)
      truncates a burst's tokens at max_tokens and frees the finished sequence after the burst:
      a request that finishes inside it keeps its slot and KV (the lookahead slots the scheduler
      reserved) to the end, and the tokens past its finish are discarded.

    k = 4, 10 ms steps. r0 (3 tokens) and r1 (6) prefill together; r2 (2 tokens) arrives at 20 ms::

        0   10        20   30   40   50        60   70   80   90  100 ms
        |r0 r1 pf|r0 r1|r0 r1|r0 r1|r0 r1|r1 + r2 pf|r2  |r2  |r2  |r2  |
                  └ burst 1: r0 done after 2 ┘            └ burst 2: r2 done after 1 ┘
                    steps, kept to the end               (3 tokens discarded)
    """
    sc = sim(fast_path, num_scheduler_steps=4)
    res, trace = run_traced(sc, [Request(0.0, 16, 3), Request(0.0, 16, 6), Request(0.02, 16, 2)])
    assert trace == [
        (0.00, 0.01, {0: 16, 1: 16}),  # prefill: one step; both first tokens at 10 ms
        (0.01, 0.02, {0: 1, 1: 1}), (0.02, 0.03, {0: 1, 1: 1}),  # burst 1: r0's last token at step 2,
        (0.03, 0.04, {0: 1, 1: 1}), (0.04, 0.05, {0: 1, 1: 1}),  # but it runs all 4 (2 discarded)
        (0.05, 0.06, {1: 1, 2: 16}),  # r2 (waiting since 20 ms) joins at the boundary; r1's 6th token
        (0.06, 0.07, {2: 1}), (0.07, 0.08, {2: 1}), (0.08, 0.09, {2: 1}), (0.09, 0.10, {2: 1}),
    ]
    df = res.requests.set_index("id")
    np.testing.assert_allclose(df.ttft_s, [0.01, 0.01, 0.04], atol=1e-12)
    # a request ends (and its client gets its last tokens) when its burst ends
    np.testing.assert_allclose(df.finish_s, [0.05, 0.06, 0.10], atol=1e-12)
    np.testing.assert_allclose(df.tpot_s, [0.02, 0.01, 0.04], atol=1e-12)
    np.testing.assert_allclose(df.loc[2, "blocked_iteration_s"], 0.03, atol=1e-12)
    assert df.output_tokens.tolist() == [3, 6, 2]
    # the gaps a streaming client sees: r0 40 ms then 0 (its 2 burst tokens together); r1 40 ms,
    # 0, 0, 0, then 10 ms; r2 40 ms: 8 gaps summing to 130 ms
    itl = res.summary["latency_s"]["itl"]
    assert itl["count"] == 8
    assert itl["mean"] == pytest.approx(0.13 / 8, abs=1e-12)
    assert itl["max"] == pytest.approx(0.04, abs=1e-12)


@pytest.mark.parametrize("fast_path", FAST)
def test_vllm_0_6_default_scheduler_never_mixes_decodes_into_a_prefill_step(fast_path):
    """The same requests under vLLM 0.6's default scheduler with chunked prefill off
    (vllm/core/scheduler.py ``_schedule_default``, v0.6.x and v0.4.2: prompts that fit are
    scheduled first and "Don't schedule decodes if prefills are scheduled"), which the vllm-v0
    preset selects by rule (``engine.options.mix: prefill_first``). At the 50 ms boundary r2 is
    prefilled alone -- r1 gets no token in that step -- and the next burst carries both::

        0   10        20   30   40   50     60   70   80   90  100 ms
        |r0 r1 pf|r0 r1|r0 r1|r0 r1|r0 r1|r2 pf|r1 r2|r1 r2|r1 r2|r1 r2|
                  └ burst 1 ─────────────┘      └ burst 2: r1 and r2 done after 1 step ┘
    """
    sc = sim(fast_path, num_scheduler_steps=4, options={"mix": "prefill_first"})
    res, trace = run_traced(sc, [Request(0.0, 16, 3), Request(0.0, 16, 6), Request(0.02, 16, 2)])
    assert trace == [
        (0.00, 0.01, {0: 16, 1: 16}),
        (0.01, 0.02, {0: 1, 1: 1}), (0.02, 0.03, {0: 1, 1: 1}),
        (0.03, 0.04, {0: 1, 1: 1}), (0.04, 0.05, {0: 1, 1: 1}),
        (0.05, 0.06, {2: 16}),  # a prefill step: r1's decode waits
        (0.06, 0.07, {1: 1, 2: 1}), (0.07, 0.08, {1: 1, 2: 1}), (0.08, 0.09, {1: 1, 2: 1}),
        (0.09, 0.10, {1: 1, 2: 1}),
    ]
    df = res.requests.set_index("id")
    np.testing.assert_allclose(df.ttft_s, [0.01, 0.01, 0.04], atol=1e-12)
    np.testing.assert_allclose(df.finish_s, [0.05, 0.10, 0.10], atol=1e-12)
    assert df.output_tokens.tolist() == [3, 6, 2]


def test_the_vllm_v0_presets_pick_the_default_schedulers_order_by_chunked_prefill():
    import servesim

    base = ["model=llama-3-8b", "stop={requests: 10, warmup_requests: 0}"]
    for preset in ("vllm-v0", "vllm-v0.4"):
        sc = servesim.load_scenario(f"scenarios/engines/{preset}.yaml", base)
        assert not sc.engine.enable_chunked_prefill and sc.engine.options["mix"] == "prefill_first"
        assert any("_schedule_default" in n for n in sc._engine_notes)
        on = servesim.load_scenario(f"scenarios/engines/{preset}.yaml", base + ["engine.enable_chunked_prefill=true"])
        assert "mix" not in on.engine.options  # _schedule_chunked_prefill: running first, mixed steps
    given = servesim.load_scenario("scenarios/engines/vllm-v0.yaml", base + ["engine.options={mix: running_first}"])
    assert given.engine.options["mix"] == "running_first"  # a given option wins over the rule
    for preset in ("vllm-v1", "tensorrt-llm", "lmdeploy"):  # engines that mix prefills into running steps
        sc = servesim.load_scenario(f"scenarios/engines/{preset}.yaml", base)
        assert "mix" not in sc.engine.options


# ---------------------------------------------------------------------------------- priority
@pytest.mark.parametrize("fast_path", FAST)
def test_priority_p0_preempts_newest_p3_for_a_slot(fast_path):
    sc = sim(fast_path, scheduler="priority", max_num_seqs=2)
    reqs = [Request(0.0, 4, 6, klass=3), Request(0.0, 4, 6, klass=3), Request(0.005, 2, 2, klass=0)]
    res, trace = run_traced(sc, reqs)
    assert trace == [
        (0.00, 0.01, {0: 4, 1: 4}),
        (0.01, 0.02, {0: 1, 2: 2}),  # r1 (P3, newest) preempted for r2 (P0)
        (0.02, 0.03, {0: 1, 2: 1}),  # r1 waits: no lower class to evict for it
        (0.03, 0.04, {0: 1, 1: 5}),  # r2 done; r1 recomputes prompt + its token
        (0.04, 0.05, {0: 1, 1: 1}),
        (0.05, 0.06, {0: 1, 1: 1}),
        (0.06, 0.07, {1: 1}),
        (0.07, 0.08, {1: 1}),
    ]
    df = res.requests.set_index("id")
    assert df.preemptions.tolist() == [0, 1, 0]
    np.testing.assert_allclose(df.loc[1, "blocked_preempted_s"], 0.02, atol=1e-12)
    np.testing.assert_allclose(df.loc[2, "ttft_s"], 0.015, atol=1e-12)


@pytest.mark.parametrize("fast_path", FAST)
def test_priority_orders_by_class_then_arrival(fast_path):
    """One slot held by a P0: the queue drains P1 (by arrival) before the earlier P4, and the P4's
    wait is charged to the higher class ahead of it."""
    sc = sim(fast_path, scheduler="priority", max_num_seqs=1)
    reqs = [Request(0.0, 2, 3, klass=0), Request(0.001, 2, 1, klass=4), Request(0.002, 2, 1, klass=1),
            Request(0.003, 2, 1, klass=1)]
    res, trace = run_traced(sc, reqs)
    assert [list(b) for _, _, b in trace] == [[0], [0], [0], [2], [3], [1]]
    df = res.requests.set_index("id")
    cols = ["blocked_iteration_s", "blocked_batch_slots_s", "blocked_higher_class_s"]
    # r1 (P4): behind the P1s until 40 ms, then itself the head, blocked on the slot
    np.testing.assert_allclose(df.loc[1, cols], [0.009, 0.01, 0.03], atol=1e-12)
    # r2, r3 (P1): their class's head is blocked on the slot (same-class requests share the cause)
    np.testing.assert_allclose(df.loc[2, cols], [0.008, 0.02, 0.0], atol=1e-12)
    np.testing.assert_allclose(df.loc[3, cols], [0.007, 0.03, 0.0], atol=1e-12)


@pytest.mark.parametrize("fast_path", FAST)
def test_priority_aging_promotes_a_starving_p4(fast_path):
    """aging_s 10 ms: by 50 ms the P4 (arrived at 1 ms) ranks P0 and, being older, goes before the
    P1 that arrived at 35 ms (also aged to P0), which cannot evict it. Without aging the P1 goes
    first."""
    reqs = [Request(0.0, 2, 5, klass=0), Request(0.001, 2, 1, klass=4), Request(0.035, 2, 1, klass=1)]
    for aging, order in [(0.01, [1, 2]), (None, [2, 1])]:
        opts = {"aging_s": aging} if aging else {}
        sc = sim(fast_path, scheduler="priority", max_num_seqs=1, options=opts)
        res, trace = run_traced(sc, reqs)
        assert [next(iter(b)) for _, _, b in trace[5:]] == order
        assert res.summary["requests"]["preemptions"] == 0


@pytest.mark.parametrize("fast_path", FAST)
def test_priority_preempts_lower_class_for_kv(fast_path):
    """A 6-block pool of 2-token blocks: r0 (P2) holds 4 blocks; the P0 r1 needs 3 (5 tokens), 2
    are free, so r0 is preempted for it."""
    sc = sim(fast_path, scheduler="priority", block_size=2, num_gpu_blocks_override=6, max_num_batched_tokens=16,
             max_model_len=12)
    reqs = [Request(0.0, 7, 3, klass=2), Request(0.005, 5, 2, klass=0)]
    res, trace = run_traced(sc, reqs)
    assert trace[:3] == [
        (0.00, 0.01, {0: 7}),  # 4 blocks
        (0.01, 0.02, {1: 5}),  # r0's decode would fit, but r0 is evicted to give r1 3 blocks
        (0.02, 0.03, {1: 1}),
    ]
    assert trace[3] == (0.03, 0.04, {0: 8})  # r0 recomputes
    assert res.requests.preemptions.tolist() == [1, 0]


@pytest.mark.parametrize("fast_path", FAST)
def test_priority_class_batch_budget(fast_path):
    """class_max_seqs [4, 4, 2]: P2 requests fill at most 2 of the 4 slots; a P0 arriving later
    joins at once, without evicting anyone; the third P2 waits on its class budget."""
    sc = sim(fast_path, scheduler="priority", max_num_seqs=4, options={"class_max_seqs": [4, 4, 2]})
    reqs = [Request(0.0, 3, 3, klass=2), Request(0.0, 3, 3, klass=2), Request(0.0, 3, 1, klass=2),
            Request(0.005, 2, 1, klass=0)]
    res, trace = run_traced(sc, reqs)
    assert trace == [
        (0.00, 0.01, {0: 3, 1: 3}),
        (0.01, 0.02, {0: 1, 1: 1, 3: 2}),  # r3 (P0) joins a batch of 2; r2 (P2) still may not
        (0.02, 0.03, {0: 1, 1: 1}),
        (0.03, 0.04, {2: 3}),
    ]
    df = res.requests.set_index("id")
    assert df.preemptions.sum() == 0
    np.testing.assert_allclose(df.loc[2, "blocked_batch_slots_s"], 0.03, atol=1e-12)


@pytest.mark.parametrize("fast_path", FAST)
def test_a_class_budget_binds_when_the_batch_is_full(fast_path):
    """Found defect (2026-12-04): class_max_seqs [3, 1, 3], max_num_seqs 3, three P2 running: a P1
    evicted the newest P2 to take the hard cap's slot, though its own budget (1) stayed full -- it
    got in when the batch was full, and not when a slot was free. It waits for the batch to drain
    below 1, nobody preempted."""
    sc = sim(fast_path, scheduler="priority", max_num_seqs=3, options={"class_max_seqs": [3, 1, 3]})
    reqs = [Request(0.0, 2, 6, klass=2), Request(0.0, 2, 6, klass=2), Request(0.0, 2, 6, klass=2),
            Request(0.005, 2, 2, klass=1)]
    res, trace = run_traced(sc, reqs)
    df = res.requests.set_index("id")
    assert df.preemptions.sum() == 0
    assert trace[0] == (0.00, 0.01, {0: 2, 1: 2, 2: 2})
    assert all(3 not in batch for _, _, batch in trace[:6])  # the P2s decode to their end first
    assert trace[6] == (0.06, 0.07, {3: 2})


@pytest.mark.parametrize("fast_path", FAST)
@pytest.mark.parametrize("policy", ["vllm", "chunked", "priority"])
def test_tier_transfer_sets_a_request_aside(policy, fast_path):
    """The KV manager reports r1's prefix on its way from a lower tier until 32 ms: r1 is set aside
    (r2 behind it goes first), its wait is charged to the transfer, and it rejoins at the first
    iteration boundary after the transfer (40 ms)."""
    from servesim.sched.parts import kv_prefix_lookup

    def lookup(kv, computed, rid, now):  # the prefix-cache hook, bound on the uncompiled engine
        return (0, 0.032) if rid == 1 and now < 0.032 else (0, 0.0)

    sc = sim(fast_path, scheduler=policy)
    res, trace = run_traced(sc, [Request(0.0, 4, 6), Request(0.005, 5, 2), Request(0.006, 3, 2)],
                            kernel_overrides={kv_prefix_lookup: lookup})
    assert trace == [
        (0.00, 0.01, {0: 4}),
        (0.01, 0.02, {0: 1, 2: 3}),
        (0.02, 0.03, {0: 1, 2: 1}),
        (0.03, 0.04, {0: 1}),
        (0.04, 0.05, {0: 1, 1: 5}),
        (0.05, 0.06, {0: 1, 1: 1}),
    ]
    df = res.requests.set_index("id")
    np.testing.assert_allclose(df.loc[1, ["blocked_iteration_s", "blocked_tier_transfer_s"]], [0.005, 0.03], atol=1e-12)
    np.testing.assert_allclose(df.loc[1, "queue_s"], 0.035, atol=1e-12)
