"""Engine behaviours policies rely on: CPU overhead accounting, multi-step bursts, policies that
always chunk."""

from __future__ import annotations

import pytest

from servesim.request import Request, Workload
from servesim.simulate import simulate
from tests.conftest import scenario


def run(sc, reqs):
    trace = []
    res = simulate(sc, workload=Workload.from_requests(reqs),
                   on_iteration=lambda t0, t1, ids, n: trace.append((round(t0, 9), round(t1, 9))))
    return res, trace


def test_cpu_overhead_adds_to_each_iteration_and_is_reported_apart():
    sc = scenario(engine={"cpu_overhead_s": 0.002, "cpu_overhead_per_seq_s": 0.001})
    res, trace = run(sc, [Request(0.0, 4, 3)])
    assert trace == [(0.0, 0.013), (0.013, 0.026), (0.026, 0.039)]  # 10 ms GPU + 2 ms + 1 ms x 1 seq
    e = res.summary["engine"]
    assert e["cpu_overhead_s"] == pytest.approx(0.009)
    assert e["gpu_s"] == pytest.approx(0.030)


@pytest.mark.parametrize("fast_path", [True, False])
def test_multi_step_charges_the_constant_cpu_overhead_once_per_burst(fast_path):
    sc = scenario(engine={"num_scheduler_steps": 4, "cpu_overhead_s": 0.005},
                  sim={"fast_path": fast_path})
    res, trace = run(sc, [Request(0.0, 4, 5)])
    # prefill (10 + 5 ms), then one burst of 4 decode steps: 5 ms of CPU once, 4 x 10 ms of GPU
    assert trace[0] == (0.0, 0.015)
    assert [t1 - t0 for t0, t1 in trace[1:]] == pytest.approx([0.015, 0.010, 0.010, 0.010])
    assert res.summary["engine"]["cpu_overhead_s"] == pytest.approx(0.010)


def test_chunked_policy_chunks_without_the_vllm_flag():
    # a 3000-token prompt with a 1024-token budget: the chunked policy splits it (vllm would need
    # enable_chunked_prefill, and the scenario would otherwise be refused)
    sc = scenario(engine={"scheduler": "chunked", "max_num_batched_tokens": 1024, "max_model_len": 4096,
                          "chunked_prefill_size": 1024})
    res, trace = run(sc, [Request(0.0, 3000, 2)])
    assert res.summary["requests"]["completed"] == 1 and len(trace) == 3 + 1  # 3 chunks, 1 decode
    from servesim.errors import ScenarioError

    with pytest.raises(ScenarioError, match="max_num_batched_tokens 1024 is smaller than max_model_len 4096"):
        scenario(engine={"max_num_batched_tokens": 1024, "max_model_len": 4096})
