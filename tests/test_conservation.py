"""Conservation and invariants: nothing is created or lost, and the invariant hook holds."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.request import CAUSE_NAMES
from servesim.simulate import simulate
from tests.conftest import BASE, merge, scenario
from servesim import scenario_from_dict


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rate=st.floats(2.0, 200.0),
    n=st.integers(1, 60),
    duration=st.one_of(st.none(), st.floats(0.1, 2.0)),
    blocks=st.integers(4, 40),
    block=st.sampled_from([1, 4, 16]),
    seqs=st.integers(1, 16),
    chunked=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_requests_conserved_and_blocks_balanced(rate, n, duration, blocks, block, seqs, chunked, seed):
    stop = {"requests": n} if duration is None else {"requests": n, "duration_s": duration}
    raw = merge(BASE, {
        "seed": seed, "stop": stop,
        "engine": {"block_size": block, "num_gpu_blocks_override": blocks, "max_num_seqs": seqs,
                   "max_num_batched_tokens": 64 if chunked else 256, "enable_chunked_prefill": chunked,
                   "max_model_len": 256},
        "workload": {"arrival": {"process": "poisson", "rate": rate},
                     "prompt": {"dist": "uniform", "min": 1, "max": 100},
                     "output": {"dist": "uniform", "min": 1, "max": 50}},
        "sim": {"check_invariants": True},  # KV held + free == total, budget, max_num_seqs each iteration
    })
    res = simulate(scenario_from_dict(raw))
    r = res.summary["requests"]
    assert r["arrived"] == r["completed"] + r["rejected"] + r["in_flight"]
    if duration is None:
        assert r["in_flight"] == 0 and r["arrived"] == n
    df = res.requests
    done = df[df.status == "finished"]
    assert (done.output_tokens > 0).all()
    # the per-cause waiting seconds of a request sum to its queueing delay (first admission)
    causes = [f"blocked_{c}_s" for c in CAUSE_NAMES if c != "preempted"]
    started = df[df.first_scheduled_s.notna()]
    np.testing.assert_allclose(started[causes].sum(axis=1), started.queue_s, atol=1e-9)
    assert (started[causes] >= -1e-9).all().all()


def test_every_block_returned_at_the_end():
    from servesim.simulate import build, run_built

    sc = scenario(stop={"requests": 200}, sim={"check_invariants": True},
                  engine={"num_gpu_blocks_override": 20, "block_size": 4, "max_num_batched_tokens": 8192},
                  workload={"arrival": {"process": "poisson", "rate": 300.0},
                            "output": {"dist": "uniform", "min": 1, "max": 40}})
    b = build(sc)
    res = run_built(b)
    assert res.summary["requests"]["completed"] == 200
    assert res.summary["requests"]["preemptions"] > 0  # the small pool forced preemptions
    assert int(b.kv.s[0].free) == b.kv.num_blocks
    assert (b.kv.held == 0).all()
