"""Defects that servesim.testing's strategies found in parts owned elsewhere, kept as strict xfail
tests with their shrunk reproducers until they are fixed (then the test passes, strict xfail
fails, and the marker -- and the matching entry of servesim.testing.strategies.avoid_known_defects
-- come out)."""

from __future__ import annotations

import pytest

from servesim import scenario_from_dict
from servesim.simulate import simulate

# chunked + options.admission: sglang + prefix caching + a lower tier + sessions, 9 requests
STALL = {
    "name": "stall", "seed": 3431742, "stop": {"requests": 9}, "hardware": {"gpu": "a100-80g"},
    "model": "llama-3-8b",
    "engine": {"scheduler": "chunked", "enable_chunked_prefill": True, "preemption": "recompute",
               "max_num_batched_tokens": 81, "options": {"admission": "sglang"}, "kv_allocator": "paged",
               "enable_prefix_caching": True, "block_size": 2, "num_gpu_blocks_override": 58, "max_num_seqs": 3,
               "max_model_len": 96},
    "step_time": {"model": "constant", "seconds": 0.01},
    "workload": {
        "arrival": {"process": "poisson", "rate": 147.56839827782753},
        "streams": [{"name": "s0", "share": 1.0, "class": "label0", "priority": 1,
                     "sessions": {"turns": {"dist": "fixed", "value": 2}, "think_s": 0.3,
                                  "think_dist": "exponential",
                                  "new_input": {"dist": "normal", "min": 26, "max": 33, "mean": 29.5, "std": 1.0},
                                  "output": {"dist": "uniform", "min": 13, "max": 15},
                                  "system_prompt_tokens": 0, "num_system_prompts": 2, "block_tokens": 4}}]},
    "kv_tiers": [{"kind": "remote", "capacity_gib": 0.01, "latency_s": 0.0001, "channels": 2}],
}


@pytest.mark.xfail(strict=True, raises=RuntimeError,
                   reason="SGLang admission with KV tier fetches stalls: 'scheduler returned an empty batch with "
                          "work pending and nothing left to wait for' (found by the strategies after main's "
                          "6074d42; whole_prompt admission, or no tier, runs)")
def test_sglang_admission_with_tier_fetches_does_not_stall():
    res = simulate(scenario_from_dict(STALL))
    assert res.summary["requests"]["in_flight"] == 0


def test_the_same_run_with_whole_prompt_admission_completes():
    raw = {**STALL, "engine": {**STALL["engine"], "options": {"admission": "whole_prompt"}}}
    assert simulate(scenario_from_dict(raw)).summary["requests"]["in_flight"] == 0
