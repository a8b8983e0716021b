"""Hot-prefix preload counts lookups; the fast path must still equal single stepping (the policy
asks the KV manager about waiting requests a different number of times in the two modes)."""

from __future__ import annotations

import numpy as np
import pytest

from servesim import scenario_from_dict, simulate
from tests.conftest import BASE, merge

SESSIONS = {
    "arrival": {"process": "poisson", "rate": 4.0},
    "sessions": {"turns": {"dist": "geometric", "mean": 4, "max": 10}, "think_s": 1.0,
                 "new_input": {"dist": "uniform", "min": 20, "max": 200},
                 "output": {"dist": "uniform", "min": 5, "max": 60},
                 "system_prompt_tokens": 128, "block_tokens": 16, "max_context_tokens": 2000},
}


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_preload_and_tiers_fast_path_equals_single_step(seed):
    raw = merge(BASE, {
        "seed": seed, "stop": {"requests": 300},
        "engine": {"enable_prefix_caching": True, "num_gpu_blocks_override": 300, "max_model_len": 4096,
                   "max_num_batched_tokens": 4096, "max_num_seqs": 16,
                   "kv": {"preload": {"min_hits": 2, "window_s": 10, "max_share": 0.3}}},
        "kv_tiers": [{"kind": "cpu", "capacity_gib": 0.05}],
        "step_time": {"model": "roofline"},
    })
    raw["workload"] = SESSIONS  # replaces BASE's synthetic lengths
    runs = [simulate(scenario_from_dict(merge(raw, {"sim": {"fast_path": f}}))) for f in (True, False)]
    a, b = (r.requests for r in runs)
    for col in ("first_scheduled_s", "first_token_s", "finish_s", "preemptions"):
        np.testing.assert_array_equal(a[col].to_numpy(), b[col].to_numpy(), err_msg=col)
    ka, kb = runs[0].summary["kv"], runs[1].summary["kv"]
    assert ka["prefix_cache"] == kb["prefix_cache"]
    assert ka["tiers"]["L2"]["preloaded"] == kb["tiers"]["L2"]["preloaded"]
    assert ka["prefix_hit_rate"]["tokens"] > 0
    # the scenario exercises what it is about: preloads, tier fetches and evictions happen
    assert ka["tiers"]["L2"]["preloaded"] > 0 and ka["tiers"]["L2"]["fetches"] > 0
    assert ka["prefix_cache"]["evictions"] > 0
