"""Priority aging: the engine's wake-up for a class drop is the exact instant the drop is seen.

The horizon used to be "a hair early" (1e-9 relative before the arithmetic boundary). An engine
that idled waiting only for a drop (every waiting request blocked, nothing running) woke there,
saw the same order, computed the same horizon -- the instant it stood at -- and never advanced
again: a run that never ended (found by tests/test_testing_strategies.py's sessions knob; the
scenario below). The horizon is now the first float time whose effective class is lower."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

from hypothesis import given, settings
from hypothesis import strategies as hs

from servesim.jit import pure
from servesim.sched.queues import class_drop_after

# the scenario hypothesis found: priority with aging, prefix caching with a slow remote tier,
# sessions, a pool too small for two requests' KV
STUCK = {
    "name": "aging-idle", "seed": 269, "stop": {"requests": 32, "duration_s": 3.0},
    "hardware": {"gpu": "a100-80g"}, "model": "llama-3-8b",
    "engine": {"scheduler": "priority", "enable_chunked_prefill": True, "preemption": "recompute",
               "max_num_batched_tokens": 60, "options": {"aging_s": 0.005, "preempt_lower": True},
               "kv_allocator": "paged", "enable_prefix_caching": True, "prefix_cache_eviction": "priority",
               "kv": {"protect_share": [1.0, 1.0, 0.25, 0.25], "hash_outputs": False},
               "block_size": 2, "num_gpu_blocks_override": 28, "max_num_seqs": 6, "max_model_len": 96},
    "step_time": {"model": "constant", "seconds": 0.01},
    "workload": {"arrival": {"process": "gamma", "rate": 12.5, "cv": 3.0},
                 "sessions": {"turns": {"dist": "fixed", "value": 1}, "think_s": 0.05, "think_dist": "exponential",
                              "new_input": {"dist": "exponential", "min": 1, "max": 1, "mean": 1.0},
                              "output": {"dist": "exponential", "min": 1, "max": 1, "mean": 1.0},
                              "system_prompt_tokens": 32, "num_system_prompts": 3, "block_tokens": 4},
                 "classes": {"weights": [2.0, 1.0, 2.0]}},
    "kv_tiers": [{"kind": "remote", "capacity_gib": 0.5, "bandwidth_gb_s": 0.1}],
}


def test_an_engine_idling_for_a_class_drop_moves_on():
    """In a child process with a deadline (the old code never returned): the run ends, every
    request accounted, and the invariant checker and fast path = single stepping hold."""
    probe = textwrap.dedent(f"""
        from servesim.testing import check_run
        c = check_run({STUCK!r}, pairs=("fast_path",))
        r = c.result.summary["requests"]
        assert r["completed"] + r["rejected"] + r["in_flight"] == r["arrived"] == 32, r
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_a_horizon_that_is_not_ahead_is_an_error_not_a_hang():
    """A policy part whose horizon is not after the current time (here the old hair-early aging
    horizon) stops the run with an error naming it, instead of spinning at one instant."""
    probe = textwrap.dedent(f"""
        import numpy as np
        from servesim import scenario_from_dict
        from servesim.jit import pure
        from servesim.sched import queues
        from servesim.simulate import build, run_built

        eff_class = pure(queues.eff_class)

        def hair_early(cfg, st, now):
            t = np.inf
            for q in range(queues.QUEUED):
                if st.q_len[q] and eff_class(cfg, st, st.q_head[q], now) > 0:
                    a = st.arrival[st.q_head[q]]
                    t = min(t, a + ((now - a) // cfg.aging_s + 1) * cfg.aging_s)
            return t - 1e-9 * max(1.0, abs(t))

        b = build(scenario_from_dict({STUCK!r}), kernel_overrides={{queues.aging_horizon: hair_early}})
        try:
            run_built(b)
        except RuntimeError as exc:
            print(exc)
    """)
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "horizon must lie ahead of the current time" in proc.stdout


def _floor_class(t: float, a: float, aging: float) -> float:
    return (t - a) // aging


@settings(max_examples=400, deadline=None)
@given(a=hs.floats(0, 1e4), aging=hs.floats(1e-6, 1e3), waited=hs.floats(0, 1e5))
def test_the_drop_is_the_first_float_instant_after_now(a, aging, waited):
    """Compiled and pure: ``t > now``, the count of aging periods is higher at ``t`` and the same
    at the float just before it (when that is still after ``now``)."""
    now = a + waited
    for f in (class_drop_after, pure(class_drop_after)):
        t = f(a, aging, now)
        assert t > now
        assert _floor_class(t, a, aging) > _floor_class(now, a, aging)
        before = math.nextafter(t, -math.inf)
        assert before <= now or _floor_class(before, a, aging) == _floor_class(now, a, aging)
