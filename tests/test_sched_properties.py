"""Scheduling invariants over random workloads and configurations, for every policy.

Hypothesis draws a policy with its knobs (preemption mode, chunking mode, multi-step, aging, class
batch sizes, micro-batches), a small KV pool and budget, and a random open-loop workload with SLA
classes. Each scenario runs with invariant checks on, once single-stepping (observed through the
iteration hook and a wrapper around the policy's ``schedule``) and once on the fast path; then:

* no iteration exceeds the token budget or the policy's batch cap (``max_num_seqs``,
  ``max_running_requests``, ``max_batch_size``);
* every arrived request finished, or was rejected with a reason;
* first admissions are FIFO within a class (FCFS policies: FIFO overall);
* priority without aging: no request is admitted while a request of a higher class is still waiting;
* every request's blocked seconds by cause sum to its queueing delay;
* the fast path gives the single-step results exactly.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim import scenario_from_dict
from servesim.request import WAITING
from servesim.request import CAUSE_NAMES
from servesim.simulate import build, run_built, simulate
from tests.conftest import BASE, merge
from tests.test_fastpath_exact import TS_COLS, assert_summaries_equal

MAX_MODEL_LEN = 96


@st.composite
def policies(draw) -> dict:
    name = draw(st.sampled_from(["vllm", "static-fifo", "chunked", "priority"]))
    eng: dict = {"scheduler": name}
    opts: dict = {}
    chunked = draw(st.booleans()) if name != "static-fifo" else False
    if name == "chunked":
        chunked = True
        opts["mix"] = draw(st.sampled_from(["stall_free", "prefill_first", "hybrid_only", "chunk_only"]))
        opts["retract"] = draw(st.sampled_from(["newest", "sglang"]))
        opts["admission"] = draw(st.sampled_from(["whole_prompt", "sglang"]))
        eng["chunked_prefill_size"] = draw(st.integers(8, 64))
        eng["max_running_requests"] = draw(st.integers(1, 8))
    if name == "static-fifo":
        eng["max_batch_size"] = draw(st.integers(1, 8))
        if draw(st.booleans()):
            opts["micro_batch_size"] = draw(st.integers(1, 4))
    if name == "priority":
        if draw(st.booleans()):
            opts["aging_s"] = draw(st.sampled_from([0.02, 0.1, 0.5]))
        if draw(st.booleans()):
            opts["class_max_seqs"] = draw(st.lists(st.integers(1, 8), min_size=1, max_size=5))
        opts["preempt_lower"] = draw(st.booleans())
    if name != "static-fifo":
        eng["preemption"] = draw(st.sampled_from(["recompute", "swap"]))
        if eng["preemption"] == "swap":
            opts["swap_space_gib"] = draw(st.sampled_from([0.0, 0.001, 4.0]))
        eng["num_scheduler_steps"] = draw(st.sampled_from([1, 1, 3]))
    eng["enable_chunked_prefill"] = chunked
    eng["max_num_batched_tokens"] = draw(st.integers(16, 96)) if chunked else 128
    eng["options"] = opts
    return eng


@st.composite
def scenarios(draw) -> dict:
    eng = draw(policies())
    if eng["scheduler"] == "vllm" and draw(st.booleans()):  # vLLM 0.6's asynchronous output processing
        eng["options"] = {**eng["options"], "async_output": True}  # (open loops below, as it needs)
    block = draw(st.sampled_from([1, 2, 4, 16]))
    blocks = draw(st.integers(8, 60))
    eng.update({"block_size": block, "num_gpu_blocks_override": max(blocks, math.ceil(MAX_MODEL_LEN / block)),
                "max_num_seqs": draw(st.integers(1, 8)), "max_model_len": MAX_MODEL_LEN})
    if "max_batch_size" in eng:  # a static batch larger than the slots is refused
        eng["max_batch_size"] = min(eng["max_batch_size"], eng["max_num_seqs"])
    weights = draw(st.lists(st.sampled_from([0.0, 1.0, 2.0]), min_size=1, max_size=5).filter(lambda w: sum(w) > 0))
    return merge(BASE, {
        "seed": draw(st.integers(0, 10_000)),
        "stop": {"requests": draw(st.integers(5, 40))},
        "engine": eng,
        "step_time": draw(st.sampled_from([{"model": "constant", "seconds": 0.01}, {"model": "roofline"}])),
        "workload": {"arrival": {"process": draw(st.sampled_from(["poisson", "gamma"])),
                                 "rate": draw(st.floats(5.0, 150.0))},
                     "prompt": {"dist": "uniform", "min": 1, "max": 60},
                     "output": {"dist": "uniform", "min": 1, "max": 40},
                     "classes": {"weights": weights}},
        "sim": {"check_invariants": True},
    })


def batch_cap(eng: dict) -> int:
    cap = eng["max_num_seqs"]
    if eng["scheduler"] == "static-fifo":
        cap = min(cap, eng["max_batch_size"])
    if eng["scheduler"] == "chunked":
        cap = min(cap, eng["max_running_requests"])
    return cap


class Observer:
    """Watches a single-stepping run: every iteration's batch, and who each schedule call admits
    while whom it leaves waiting."""

    def __init__(self, raw: dict):
        self.eng = raw["engine"]
        self.batches: list[tuple[np.ndarray, np.ndarray]] = []
        self.priority_violations: list[str] = []
        self.table = None
        self.partials = 0  # most requests left mid-prompt by one iteration

    def on_iteration(self, t0, t1, ids, num_new) -> None:
        self.batches.append((ids.copy(), num_new.copy()))
        if self.table is not None:  # prompts this iteration leaves unfinished (computed not yet advanced)
            t = self.table
            left = t.prompt[ids].astype(int) + t.num_output[ids] - t.computed[ids] - num_new
            self.partials = max(self.partials, int((left > 0).sum()))

    def overrides(self) -> dict:
        """The policy's ``schedule`` kernel, watched (bound on the uncompiled engine)."""
        from servesim.jit import pure
        from servesim.sched.policies import schedule

        inner = pure(schedule)

        def watched(cfg, st, kv, now):
            before = st.status == WAITING
            inner(cfg, st, kv, now)
            after = st.status == WAITING
            fresh = np.flatnonzero(before & ~after & (st.t_sched == now))
            still = np.flatnonzero(before & after)
            if len(fresh) and len(still) and st.klass[still].min() < st.klass[fresh].max():
                self.priority_violations.append(
                    f"t={now}: admitted {fresh.tolist()} (classes {st.klass[fresh].tolist()}) while "
                    f"{still.tolist()} (classes {st.klass[still].tolist()}) wait")

        return {schedule: watched}


def run(raw: dict, fast: bool, observer: Observer | None = None):
    sc = scenario_from_dict(merge(raw, {"sim": {"fast_path": fast}}))
    if observer is None:
        return simulate(sc)
    b = build(sc, on_iteration=observer.on_iteration, kernel_overrides=observer.overrides())
    observer.table = b.table
    return run_built(b)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_scheduling_invariants(raw):
    eng = raw["engine"]
    obs = Observer(raw)
    slow = run(raw, fast=False, observer=obs)
    df = slow.requests

    # budgets and caps, every iteration
    cap = batch_cap(eng)
    assert obs.batches
    for ids, num_new in obs.batches:
        assert int(num_new.sum()) <= eng["max_num_batched_tokens"]
        assert len(ids) <= cap
        assert len(np.unique(ids)) == len(ids)

    # chunking splits at most one prompt per iteration (SGLang's single chunked request; vLLM's
    # budget is spent by the first prompt it cuts)
    assert obs.partials <= 1

    # every arrived request finished or was rejected with a reason
    assert set(df.status) <= {"finished", "rejected"}
    rejected = df[df.status == "rejected"]
    assert (rejected.reject_reason != "").all()

    # FIFO of first admission within a class (overall for the FCFS policies)
    done = df[df.status == "finished"]
    groups = [done] if eng["scheduler"] != "priority" else [g for _, g in done.groupby("klass")]
    for g in groups:
        by_arrival = g.sort_values(["arrival_s", "id"])
        assert (np.diff(by_arrival.first_scheduled_s.to_numpy()) >= -1e-12).all()

    # strict priority without aging
    if eng["scheduler"] == "priority" and "aging_s" not in eng["options"]:
        assert obs.priority_violations == []

    # blocked seconds by cause sum to the queueing delay (preemption waits are charged apart)
    first_wait = [f"blocked_{n}_s" for n in CAUSE_NAMES if n != "preempted"]
    np.testing.assert_allclose(done[first_wait].sum(axis=1), done.queue_s, rtol=1e-9, atol=1e-9)
    assert (done[[f"blocked_{n}_s" for n in CAUSE_NAMES]] >= -1e-9).all().all()
    assert (done.blocked_preempted_s[done.preemptions == 0] == 0).all()

    # the fast path gives the same results
    fast = run(raw, fast=True)
    f = fast.requests
    assert f.status.tolist() == df.status.tolist()
    assert f.preemptions.tolist() == df.preemptions.tolist()
    for col in TS_COLS + [c for c in f.columns if c.startswith("blocked_")]:
        np.testing.assert_allclose(f[col].to_numpy(), df[col].to_numpy(), rtol=1e-9, atol=1e-9, err_msg=col)
    assert_summaries_equal(fast.summary, slow.summary)


SESSIONS = {
    "workload": {"arrival": {"process": "poisson", "rate": 4.0},
                 "sessions": {"turns": {"dist": "fixed", "value": 3}, "think_s": 0.3, "think_dist": "fixed",
                              "new_input": {"dist": "uniform", "min": 4, "max": 40},
                              "output": {"dist": "uniform", "min": 1, "max": 12},
                              "system_prompt_tokens": 32, "block_tokens": 16}},
}


@st.composite
def kv_scenarios(draw) -> dict:
    """Every policy on every KV manager: prefix caching (with lower tiers), static and elastic
    reservation, on multi-turn sessions whose turns share prefixes."""
    raw = draw(scenarios())
    eng = raw["engine"]
    eng.update({"block_size": 8, "num_gpu_blocks_override": draw(st.integers(24, 80)), "max_model_len": 192,
                "max_num_batched_tokens": 192 if not eng["enable_chunked_prefill"] else eng["max_num_batched_tokens"]})
    kv = draw(st.sampled_from(["prefix", "prefix_tiers", "static", "elastic"]))
    patch: dict = {"engine": eng, **SESSIONS}
    if kv.startswith("prefix"):
        eng["enable_prefix_caching"] = True
        if kv == "prefix_tiers":
            patch["kv_tiers"] = [{"kind": "cpu", "capacity_gib": 0.01}]
    else:
        eng["kv_allocator"] = kv
    raw = merge(raw, patch)
    del raw["workload"]["prompt"], raw["workload"]["output"]
    raw["stop"] = {"requests": draw(st.integers(5, 40))}
    return raw


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kv_scenarios())
def test_policies_on_every_kv_manager(raw):
    slow, fast = run(raw, fast=False), run(raw, fast=True)
    df, f = slow.requests, fast.requests
    assert set(df.status) <= {"finished", "rejected"}
    done = df[df.status == "finished"]
    first_wait = [f"blocked_{n}_s" for n in CAUSE_NAMES if n != "preempted"]
    np.testing.assert_allclose(done[first_wait].sum(axis=1), done.queue_s, rtol=1e-9, atol=1e-9)
    assert f.status.tolist() == df.status.tolist()
    for col in TS_COLS + [c for c in f.columns if c.startswith("blocked_")]:
        np.testing.assert_allclose(f[col].to_numpy(), df[col].to_numpy(), rtol=1e-9, atol=1e-9, err_msg=col)


def test_one_partial_prompt_even_when_admission_evicts():
    """Found by the property above: a class-0 arrival cut by the token budget evicted a class-1
    request for its KV (preempt_lower); the evicted request's decode token came back to the budget
    and re-admitted it for one token of recomputation -- a second partial prompt in one pass."""
    raw = merge(BASE, {
        "seed": 7, "stop": {"requests": 7},
        "engine": {"scheduler": "priority", "block_size": 1, "max_num_seqs": 3, "max_num_batched_tokens": 16,
                   "preemption": "recompute", "enable_chunked_prefill": True, "options": {"preempt_lower": True},
                   "num_gpu_blocks_override": 96, "max_model_len": 96},
        "step_time": {"model": "constant", "seconds": 0.01},
        "workload": {"arrival": {"process": "poisson", "rate": 64.0}, "prompt": {"dist": "uniform", "min": 1, "max": 60},
                     "output": {"dist": "uniform", "min": 1, "max": 40}, "classes": {"weights": [1.0, 1.0]}},
        "sim": {"check_invariants": True},
    })
    obs = Observer(raw)
    res = run(raw, fast=False, observer=obs)
    assert obs.partials == 1
    assert res.summary["requests"]["preemptions"] >= 1  # the eviction still happens
