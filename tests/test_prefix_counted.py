"""A prefix cache over a workload without chains keeps counts, not block ids (kv/pcache.py,
chainless pools): nothing is ever cached there, so which block a request holds cannot change a
decision. Hypothesis draws such scenarios over every policy and both eviction rules that need no
extra setting; each runs with the counted pool and with the block-id pool it replaces, and every
per-request time, the summaries (KV usage and the prefix-cache counters included) must agree."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.kv import pstate
from tests.conftest import BASE, merge
from tests.test_fastpath_exact import assert_same_run, run


@st.composite
def chainless(draw):
    sched = draw(st.sampled_from(["vllm", "chunked", "priority"]))
    chunked = sched == "chunked" or draw(st.booleans())
    engine = {"scheduler": sched, "enable_prefix_caching": True,
              "prefix_cache_eviction": draw(st.sampled_from(["lru", "priority", "sglang"])),
              "num_gpu_blocks_override": draw(st.integers(40, 200)), "block_size": draw(st.sampled_from([1, 8, 16])),
              "max_model_len": 1024, "enable_chunked_prefill": chunked,
              "max_num_batched_tokens": draw(st.sampled_from([256, 512])) if chunked else 1024,
              "max_num_seqs": draw(st.integers(2, 12)),
              "preemption": draw(st.sampled_from(["recompute", "swap"])) if sched != "chunked" else "recompute"}
    if sched == "chunked":
        engine["options"] = {"admission": draw(st.sampled_from(["whole_prompt", "sglang"]))}
    raw = merge(BASE, {"seed": draw(st.integers(0, 10_000)), "stop": {"requests": draw(st.integers(20, 80))},
                       "engine": engine, "step_time": {"model": "roofline"}, "sim": {"check_invariants": True}})
    raw["workload"] = {"arrival": {"process": "poisson", "rate": draw(st.floats(5.0, 40.0))},
                       "prompt": {"dist": "uniform", "min": 1, "max": 400},
                       "output": {"dist": "uniform", "min": 1, "max": 60},
                       "classes": {"weights": draw(st.sampled_from([[1.0], [1, 2, 1]]))}}
    return raw


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chainless())
def test_counted_pool_gives_the_block_id_results(raw):
    made = []
    real = pstate.make_prefix_kv

    def ids(*a, **k):
        k["counted"] = False
        made.append(k)
        return real(*a, **k)

    counted = run(raw, True)
    pstate.make_prefix_kv = ids
    try:
        by_ids = run(raw, True)
    finally:
        pstate.make_prefix_kv = real
    assert made, "the block-id pool was not built"
    assert_same_run(counted, by_ids)
