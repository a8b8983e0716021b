"""Golden traces: tiny workloads whose exact iterations and timestamps are written out by hand.

Constant step model (10 ms), so every timestamp is a sum of steps and arrival times.
"""

from __future__ import annotations

import numpy as np
import pytest

from servesim.request import Request, Workload
from servesim.simulate import simulate
from tests.conftest import scenario

STEP = 0.01


def run_traced(sc, requests, kernel_overrides=None):
    from servesim.simulate import build, run_built

    trace = []

    def hook(t0, t1, ids, num_new):
        trace.append((round(t0, 9), round(t1, 9), dict(zip(ids.tolist(), num_new.tolist()))))

    b = build(sc, workload=Workload.from_requests(requests), on_iteration=hook, kernel_overrides=kernel_overrides)
    return run_built(b), trace


@pytest.mark.parametrize("fast_path", [True, False])
def test_continuous_batching_trace(fast_path):
    """max_num_seqs 2: r2 and r3 wait for batch slots, then are admitted together."""
    sc = scenario(engine={"max_num_seqs": 2, "max_num_batched_tokens": 16, "max_model_len": 16},
                  sim={"fast_path": fast_path, "check_invariants": True})
    reqs = [Request(0.000, 4, 3), Request(0.005, 6, 2), Request(0.012, 8, 2), Request(0.013, 3, 1)]
    res, trace = run_traced(sc, reqs)
    assert trace == [
        (0.00, 0.01, {0: 4}),  # r0 prefills alone
        (0.01, 0.02, {0: 1, 1: 6}),  # r0 decodes, r1 (arrived at 5 ms) prefills alongside
        (0.02, 0.03, {0: 1, 1: 1}),  # r2, r3 arrived but both slots are taken
        (0.03, 0.04, {2: 8, 3: 3}),  # r0, r1 finished at 30 ms; both newcomers prefill
        (0.04, 0.05, {2: 1}),  # r3 needed one token and is done; r2 decodes its last
    ]
    df = res.requests.set_index("id")
    np.testing.assert_allclose(df.first_scheduled_s, [0.0, 0.01, 0.03, 0.03], atol=1e-12)
    np.testing.assert_allclose(df.first_token_s, [0.01, 0.02, 0.04, 0.04], atol=1e-12)
    np.testing.assert_allclose(df.finish_s, [0.03, 0.03, 0.05, 0.04], atol=1e-12)
    np.testing.assert_allclose(df.ttft_s, [0.01, 0.015, 0.028, 0.027], atol=1e-12)
    np.testing.assert_allclose(df.tpot_s.iloc[:3], [0.01, 0.01, 0.01], atol=1e-12)
    assert np.isnan(df.tpot_s.iloc[3])  # one output token: no TPOT
    # r2 waited 8 ms for the iteration boundary, then 10 ms for a batch slot
    np.testing.assert_allclose(df.loc[2, ["blocked_iteration_s", "blocked_batch_slots_s"]], [0.008, 0.010], atol=1e-12)
    np.testing.assert_allclose(df.loc[3, ["blocked_iteration_s", "blocked_batch_slots_s"]], [0.007, 0.010], atol=1e-12)
    assert res.summary["requests"]["completed"] == 4


@pytest.mark.parametrize("fast_path", [True, False])
def test_recompute_preemption_trace(fast_path):
    """A 4-block pool of 2-token blocks: r1 is preempted when r0's decode needs its block."""
    sc = scenario(engine={"block_size": 2, "num_gpu_blocks_override": 4, "max_num_batched_tokens": 16,
                          "max_model_len": 16},
                  sim={"fast_path": fast_path, "check_invariants": True})
    reqs = [Request(0.0, 3, 4), Request(0.001, 2, 3)]
    res, trace = run_traced(sc, reqs)
    assert trace == [
        (0.00, 0.01, {0: 3}),  # r0: 3 slots, 2 blocks
        (0.01, 0.02, {0: 1, 1: 2}),  # r0 4 slots (2 blocks), r1 2 slots (1 block): 1 free
        (0.02, 0.03, {0: 1}),  # r0 takes the last block; r1 cannot grow: preempted (newest)
        (0.03, 0.04, {0: 1}),  # r1 waits: its 3 known tokens need 2 blocks, 1 is free
        (0.04, 0.05, {1: 3}),  # r0 done at 40 ms; r1 recomputes prompt + its 1 output token
        (0.05, 0.06, {1: 1}),
    ]
    df = res.requests.set_index("id")
    assert df.preemptions.tolist() == [0, 1]
    np.testing.assert_allclose(df.finish_s, [0.04, 0.06], atol=1e-12)
    np.testing.assert_allclose(df.loc[1, "blocked_preempted_s"], 0.02, atol=1e-12)
    np.testing.assert_allclose(df.loc[1, "blocked_iteration_s"], 0.009, atol=1e-12)
    # ITL: r0's three 10 ms gaps, r1's 30 ms gap across the preemption and a last 10 ms gap
    itl = res.summary["latency_s"]["itl"]
    assert itl["count"] == 5
    assert itl["mean"] == pytest.approx((4 * 0.01 + 0.03) / 5)
    # numpy linear percentile: position 0.999 * (5 - 1) = 3.996, between the 4th and 5th gap
    assert itl["p999"] == pytest.approx(0.01 + 0.996 * 0.02)


def test_rejections_are_counted_not_dropped():
    sc = scenario(engine={"max_num_batched_tokens": 64, "max_model_len": 64, "num_gpu_blocks_override": 2,
                          "block_size": 16})
    reqs = [Request(0.0, 10, 5), Request(0.1, 60, 10), Request(0.2, 30, 10)]
    res = simulate(sc, workload=Workload.from_requests(reqs))
    s = res.summary["requests"]
    assert (s["completed"], s["rejected"]) == (1, 2)
    assert s["rejected_by_reason"] == {"exceeds_max_model_len": 1, "exceeds_kv_capacity": 1}
    assert res.requests.reject_reason.tolist() == ["", "exceeds_max_model_len", "exceeds_kv_capacity"]
