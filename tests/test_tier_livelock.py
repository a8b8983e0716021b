"""A livelock with lower KV tiers, found by servesim.testing's strategies (ninth session), and the
stall guard that ends any run that makes no progress.

With prefix caching and a lower tier, a waiting request whose fetch has landed holds the blocks
its KV came back into. A running request that could not grow beside such holders was preempted
(recompute), readmitted at the front of the queue with a first chunk that fit, and preempted again
at its next chunk, every iteration: 5 requests finished in 200 simulated seconds where 8,973 do
without tiers, and a property-test draw ran for minutes. Now the running pass takes those blocks
back (the holders' KV stays in the prefix cache) before it preempts anyone (sched/parts.py
``allocate_or_preempt``). And a request preempted ``MAX_PREEMPTIONS`` times ends the run with one
line (``NoProgress``) instead of a run that never ends.
"""

from __future__ import annotations

import pytest

from servesim import scenario_from_dict
from servesim.errors import NoProgress
from servesim.sched import state as sched_state
from servesim.simulate import simulate

# the two draws of scenarios(prefix=True, pressure=True) that ran for minutes (priority scheduler,
# aging, preempt_lower; a CPU tier / a CPU and a remote tier)
HOLDERS_PRELOAD = {'name': 'hypothesis',
                  'seed': 222,
                  'stop': {'requests': 31, 'warmup_requests': 1},
                  'hardware': {'gpu': 'a100-80g'},
                  'model': 'llama-3-8b',
                  'engine': {'scheduler': 'priority',
                             'enable_chunked_prefill': True,
                             'preemption': 'recompute',
                             'num_scheduler_steps': 1,
                             'max_num_batched_tokens': 4,
                             'options': {'aging_s': 0.5, 'preempt_lower': True},
                             'kv_allocator': 'paged',
                             'enable_prefix_caching': True,
                             'kv': {'preload': {'min_hits': 3, 'window_s': 0.5, 'max_share': 0.2}, 'hash_outputs': False},
                             'block_size': 16,
                             'num_gpu_blocks_override': 9,
                             'max_num_seqs': 3,
                             'max_model_len': 96,
                             'cpu_overhead_s': 0.002,
                             'cpu_overhead_per_seq_s': 0.0001},
                  'step_time': {'model': 'roofline'},
                  'workload': {'arrival': {'process': 'poisson', 'rate': 200.0},
                               'sessions': {'turns': {'dist': 'fixed', 'value': 4},
                                            'think_s': 0.05,
                                            'think_dist': 'fixed',
                                            'new_input': {'dist': 'exponential', 'min': 18, 'max': 31, 'mean': 24.5},
                                            'output': {'dist': 'exponential', 'min': 7, 'max': 13, 'mean': 10.0},
                                            'system_prompt_tokens': 32,
                                            'num_system_prompts': 3,
                                            'block_tokens': 16}},
                  'kv_tiers': [{'kind': 'cpu', 'capacity_gib': 0.5, 'latency_s': 0.0}]}
HOLDERS_TWO_TIERS = {'name': 'hypothesis',
                    'seed': 3458,
                    'stop': {'requests': 18},
                    'hardware': {'gpu': 'a100-80g'},
                    'model': 'llama-3-8b',
                    'engine': {'scheduler': 'priority',
                               'enable_chunked_prefill': True,
                               'preemption': 'recompute',
                               'num_scheduler_steps': 1,
                               'max_num_batched_tokens': 55,
                               'options': {'aging_s': 0.02, 'class_max_seqs': [6, 1, 4, 8], 'preempt_lower': True},
                               'kv_allocator': 'paged',
                               'enable_prefix_caching': True,
                               'block_size': 1,
                               'num_gpu_blocks_override': 120,
                               'max_num_seqs': 7,
                               'max_model_len': 96},
                    'step_time': {'model': 'constant', 'seconds': 0.001},
                    'workload': {'streams': [{'name': 's0',
                                              'share': 2.0,
                                              'class': 'label0',
                                              'priority': 4,
                                              'prompt': {'dist': 'uniform', 'min': 1, 'max': 14},
                                              'output': {'dist': 'fixed', 'value': 82},
                                              'slo': {'ttft_p99': 1.0, 'e2e_p50': 5.0}},
                                             {'name': 's1',
                                              'share': 2.0,
                                              'class': 'label1',
                                              'priority': 4,
                                              'sessions': {'turns': {'dist': 'fixed', 'value': 1},
                                                           'think_s': 0.05,
                                                           'think_dist': 'exponential',
                                                           'new_input': {'dist': 'normal',
                                                                         'min': 24,
                                                                         'max': 33,
                                                                         'mean': 28.5,
                                                                         'std': 0.0},
                                                           'output': {'dist': 'fixed', 'value': 8},
                                                           'system_prompt_tokens': 8,
                                                           'num_system_prompts': 1,
                                                           'block_tokens': 4}}],
                                 'arrival': {'process': 'constant', 'rate': 200.0}},
                    'kv_tiers': [{'kind': 'cpu', 'capacity_gib': 0.002, 'latency_s': 0.01},
                                 {'kind': 'remote', 'capacity_gib': 0.5, 'latency_s': 0.0, 'channels': 2}]}


def _fcfs(raw: dict) -> dict:
    """The same draw on vLLM's FCFS scheduler: the livelock did not depend on the scheduler."""
    eng = {k: v for k, v in raw["engine"].items() if k != "options"}
    return {**raw, "engine": {**eng, "scheduler": "vllm"}}


@pytest.mark.parametrize("raw", [HOLDERS_PRELOAD, HOLDERS_TWO_TIERS, _fcfs(HOLDERS_TWO_TIERS)],
                         ids=["preload", "two_tiers", "two_tiers_fcfs"])
@pytest.mark.parametrize("engine", ["compiled", "python"])
def test_the_drawn_runs_finish_every_request(raw, engine):
    res = simulate(scenario_from_dict({**raw, "sim": {"engine": engine}}))
    r = res.summary["requests"]
    assert r["in_flight"] == 0 and r["completed"] + r["rejected"] == raw["stop"]["requests"]
    assert r["preemptions"] < 10 * raw["stop"]["requests"]


def test_a_long_run_of_the_draw_keeps_finishing_requests():
    """200 simulated seconds of the two-tier draw finished 5 requests (3,216 preemptions) before;
    without the tiers the same arrivals finish 8,973. 20 s: about a tenth of that, not a handful."""
    raw = {**_fcfs(HOLDERS_TWO_TIERS), "stop": {"duration_s": 20.0}}
    r = simulate(scenario_from_dict(raw)).summary["requests"]
    assert r["completed"] > 500
    assert r["preemptions"] < 3 * r["completed"]


def test_compiled_and_python_agree_on_the_long_run():
    raw = {**_fcfs(HOLDERS_TWO_TIERS), "stop": {"duration_s": 2.0}}
    a = simulate(scenario_from_dict({**raw, "sim": {"engine": "compiled"}})).summary["requests"]
    b = simulate(scenario_from_dict({**raw, "sim": {"engine": "python"}})).summary["requests"]
    assert a == b


def test_a_run_that_cannot_progress_ends_with_one_line(monkeypatch):
    """The guard, reached with a low limit (the Python engine binds the module's value at build):
    the tierless run preempts a few requests more than 3 times; the run stops at the first."""
    monkeypatch.setattr(sched_state, "MAX_PREEMPTIONS", 3)
    raw = {k: v for k, v in _fcfs(HOLDERS_TWO_TIERS).items() if k != "kv_tiers"}
    raw = {**raw, "stop": {"duration_s": 2.0}, "sim": {"engine": "python"}}
    with pytest.raises(NoProgress) as exc:
        simulate(scenario_from_dict(raw))
    msg = str(exc.value)
    assert "\n" not in msg and "was preempted 3 times" in msg and "num_gpu_blocks_override" in msg
    assert "120 blocks of 1 tokens" in msg
