"""Batch composition (prefill vs decode tokens per iteration) in the time series.

With a constant step time ``c``, every iteration lasts exactly ``c``, so the time integral of a
per-iteration token count is ``c`` times its sum over iterations: the prefill integral must be
``c`` x (every prompt token computed, recomputation included) and the decode integral ``c`` x
(every output token after the first; with multi-step bursts, plus the tokens computed past a
finish and discarded). Checked on both engines, single stepping and the fast path,
multi-step bursts, chunked prefill and recompute preemptions.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import merge, scenario
from servesim import simulate

STEP = 0.01


def _integrals(res):
    rec = res.recorder
    rec.flush()
    nb = rec.series.nbins()
    total = rec.series.integral[3, :nb].sum()
    prefill = rec.series.integral[7, :nb].sum()
    return prefill / STEP, (total - prefill) / STEP


CASES = {
    "plain": {},
    "chunked": {"engine": {"enable_chunked_prefill": True, "max_num_batched_tokens": 96}},
    "multistep": {"engine": {"num_scheduler_steps": 4}},
    "static": {"engine": {"scheduler": "static-fifo", "max_batch_size": 4}},
}


@pytest.mark.parametrize("engine", ["python", "compiled"])
@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("case", sorted(CASES))
def test_prefill_and_decode_tokens_add_up(case, fast, engine):
    patch = {"workload": {"arrival": {"process": "poisson", "rate": 40.0},
                          "prompt": {"dist": "uniform", "min": 8, "max": 300},
                          "output": {"dist": "uniform", "min": 1, "max": 40}},
             "stop": {"requests": 120}, "sim": {"fast_path": fast, "engine": engine}}
    sc = scenario(**merge(patch, CASES[case]))
    res = simulate(sc)
    r = res.requests
    assert (r["status"] == "finished").all()
    prefill, decode = _integrals(res)
    assert r["preemptions"].sum() == 0
    assert prefill == pytest.approx(float(r["prompt_tokens"].sum()), rel=1e-9)
    useful = float((r["output_tokens"] - 1).sum())
    if case == "multistep":
        # vLLM 0.6 bursts run all their steps: a request that finishes inside one keeps decoding
        # (tokens discarded) to its end, at most k - 1 = 3 tokens per request (exact timeline:
        # tests/test_sched_golden.py::test_vllm_0_6_multi_step_golden_timeline)
        extra = decode - useful
        assert extra == pytest.approx(round(extra), abs=1e-6) and 0 < round(extra) <= 3 * len(r)
        return
    assert decode == pytest.approx(useful, rel=1e-9)


def test_recomputation_counts_as_prefill():
    """A pool too small for the load preempts (recompute). A request preempted after n sampled
    tokens recomputes prompt + n tokens as prefill, which includes the KV of its last sampled
    token: that token's decode step never happens. So decode = sum(outputs - 1) - preemptions
    (all of them here happen while decoding: prompts fit one iteration), and the prefill
    integral exceeds the prompts by at least one prompt per preemption."""
    sc = scenario(engine={"scheduler": "vllm", "block_size": 16, "max_num_seqs": 32, "max_num_batched_tokens": 8192,
                          "num_gpu_blocks_override": 40},
                  workload={"arrival": {"process": "poisson", "rate": 200.0},
                            "prompt": {"dist": "fixed", "value": 100}, "output": {"dist": "fixed", "value": 60}},
                  stop={"requests": 80})
    res = simulate(sc)
    r = res.requests
    n_pre = int(r["preemptions"].sum())
    assert (r["status"] == "finished").all() and n_pre > 0
    prefill, decode = _integrals(res)
    assert decode == pytest.approx(float((r["output_tokens"] - 1).sum() - n_pre), rel=1e-9)
    assert prefill >= r["prompt_tokens"].sum() + 100 * n_pre - 1e-6
    ts = res.timeseries
    assert np.allclose(ts["decode_tokens_mean"] + ts["prefill_tokens_mean"], ts["batch_tokens_mean"], equal_nan=True)
