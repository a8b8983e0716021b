"""Every named invariant fails on a deliberately broken part (tests/broken_parts.py), and the
checker names it; the same scenarios with faithful parts pass. A check that cannot fail proves
nothing: these show each one can."""

from __future__ import annotations

import numpy as np
import pytest

from servesim import scenario_from_dict
from servesim.engine import kernel as K
from servesim.kv import kernels as kvk
from servesim.perf import kernels as pk
from servesim.simulate import run_built
from servesim.testing import (
    INVARIANTS,
    Checker,
    InvariantViolation,
    check_compiled,
    check_fast_path,
    check_reproducible,
    check_run,
    check_worker_independent,
)
from tests import broken_parts as bp
from tests.conftest import BASE, merge

# a busy replica: a small pool (preemptions), few slots, a queue that builds up
BUSY = merge(BASE, {
    "stop": {"requests": 60},
    "engine": {"num_gpu_blocks_override": 40, "block_size": 4, "max_num_seqs": 4,
               "max_num_batched_tokens": 96, "max_model_len": 96},
    "workload": {"arrival": {"process": "poisson", "rate": 200.0},
                 "prompt": {"dist": "uniform", "min": 8, "max": 40},
                 "output": {"dist": "uniform", "min": 2, "max": 30}},
})
CLASSES = merge(BUSY, {"engine": {"scheduler": "priority", "options": {"aging_s": 0.2}},
                       "workload": {"classes": {"weights": [1, 1, 1, 1, 1]}}})
SESSIONS = merge(BUSY, {
    "stop": {"requests": 60},
    "engine": {"enable_prefix_caching": True, "block_size": 8, "num_gpu_blocks_override": 30,
               "max_model_len": 192, "max_num_batched_tokens": 192, "max_num_seqs": 8},
    "kv_tiers": [{"kind": "cpu", "capacity_gib": 0.002}],
    "workload": {"arrival": {"process": "poisson", "rate": 8.0},
                 "sessions": {"turns": {"dist": "fixed", "value": 3}, "think_s": 0.3, "think_dist": "fixed",
                              "new_input": {"dist": "uniform", "min": 4, "max": 40},
                              "output": {"dist": "uniform", "min": 1, "max": 12},
                              "system_prompt_tokens": 32, "block_tokens": 16}},
})
del SESSIONS["workload"]["prompt"], SESSIONS["workload"]["output"]


def policy(raw: dict, cls: str) -> dict:
    return merge(raw, {"engine": {"scheduler": f"tests.broken_parts:{cls}"}})


def violated(raw, **kw) -> InvariantViolation:
    with pytest.raises(InvariantViolation) as e:
        check_run(raw, pairs=(), **kw)
    return e.value


FAITHFUL = [  # (scenario, the order the policy promises)
    (policy(BUSY, "Faithful"), "fifo"),
    (policy(CLASSES, "DocumentedAging"), "classes"),
    (SESSIONS, "auto"),
]


@pytest.mark.parametrize("raw, order", FAITHFUL, ids=["busy", "aging", "tiers"])
def test_the_scenarios_pass_with_faithful_parts(raw, order):
    checked = check_run(raw, order=order)
    s = checked.stats
    assert s.decisions > 50 and s.iterations > 50 and s.admissions > 20
    assert checked.result.summary["requests"]["completed"] == 60


def test_the_busy_scenario_exercises_what_the_parts_break():
    r = check_run(BUSY, pairs=()).result.summary
    assert r["requests"]["preemptions"] > 0
    assert r["blockage"]["all"]["share"]["batch_slots"] > 0


def test_lost_request():
    e = violated(policy(BUSY, "LosesRequests"))
    assert e.invariant == "requests_conserved" and "not anywhere" in str(e)


def test_duplicated_request():
    e = violated(policy(BUSY, "DuplicatesRequests"))
    assert e.invariant == "requests_conserved" and "is in queue 0 but its status is running" in str(e)


def test_silent_cancellation_breaks_the_count():
    e = violated(policy(BUSY, "CancelsSilently"))
    assert e.invariant == "arrivals_accounted" and "ended requests" in str(e)


def test_leaking_kv_free():
    e = violated(BUSY, kernel_overrides={kvk.kv_free: bp.leaky_free})
    assert e.invariant == "kv_conserved" and "!= pool" in str(e)


def test_over_granting_kv_allocate():
    e = violated(BUSY, kernel_overrides={kvk.kv_allocate: bp.grant_without_blocks})
    assert e.invariant == "kv_capacity" and "blocks of 4 slots" in str(e)


def _tier_run(broken_demote):
    from servesim.kv.ptiers import tier_demote

    checker = Checker()
    b = checker.build(scenario_from_dict(SESSIONS), kernel_overrides={tier_demote: broken_demote()})
    with pytest.raises(InvariantViolation) as e:
        checker.finish(run_built(b))
    return e.value


def test_tier_losing_blocks():
    e = _tier_run(bp.broken_demote_loses)
    assert e.invariant == "kv_conserved" and "sent down" in str(e)


def test_tier_over_capacity():
    e = _tier_run(bp.broken_demote_never_evicts)
    assert e.invariant == "kv_capacity" and "capacity" in str(e)


def test_budget_ignored():
    e = violated(policy(merge(BUSY, {"engine": {"max_num_seqs": 8, "num_gpu_blocks_override": 400},
                                     "workload": {"arrival": {"process": "poisson", "rate": 2000.0}}}),
                        "IgnoresBudget"))
    assert e.invariant == "batch_limits" and "max_num_batched_tokens 96" in str(e)


def test_batch_cap_ignored():
    e = violated(policy(BUSY, "IgnoresBatchCap"))
    assert e.invariant == "batch_limits" and "requests run > the cap of 4" in str(e)


def test_negative_step_time():
    e = violated(BUSY, kernel_overrides={pk.iteration_seconds: bp.negative_step})
    assert e.invariant == "time_monotone" and "before it starts" in str(e)


def test_scheduled_before_arrival():
    e = violated(policy(merge(BUSY, {"workload": {"arrival": {"process": "poisson", "rate": 5.0}}}),
                        "SchedulesTheFuture"))
    assert e.invariant == "causality" and "arrives at" in str(e)


def test_finish_before_first_token():
    e = violated(BUSY, kernel_overrides={K.finish: bp.finish_stamped_at_admission})
    assert e.invariant == "causality" and "before its first token" in str(e)


def test_lifo_breaks_a_fifo_promise():
    e = violated(policy(BUSY, "LifoHead"), order="fifo")
    assert e.invariant == "fifo"
    # a policy with a discipline of its own promises nothing unless told: the rest holds
    assert check_run(policy(BUSY, "LifoHead"), pairs=()).stats.order_checked is None


def test_aging_faster_than_documented_is_a_priority_inversion():
    e = violated(policy(CLASSES, "AgingTooFast"), order="classes")
    assert e.invariant == "priority_order"


def test_ignoring_classes_is_a_priority_inversion():
    e = violated(policy(merge(CLASSES, {"engine": {"options": {}}}), "IgnoresClasses"), order="classes")
    assert e.invariant == "priority_order"


def test_non_monotone_percentiles(monkeypatch):
    import servesim.metrics.summary as summary
    from servesim.metrics import stats

    def swapped(x):
        d = stats.describe(x)
        if d["p90"] is not None and d["p99"] != d["p90"]:
            d["p90"], d["p99"] = d["p99"], d["p90"]
        return d

    monkeypatch.setattr(summary, "describe", swapped)
    e = violated(BUSY)
    assert e.invariant == "percentiles_monotone" and "p90" in str(e)


def test_fragmentation_beyond_the_pool():
    e = violated(BUSY, kernel_overrides={kvk.kv_step_usage: bp.waste_beyond_the_pool})
    assert e.invariant == "fragmentation_bounded"


def test_stepping_dependent_decision_breaks_the_fast_path():
    raw = policy(BUSY, "SteppingDependent")
    check_run(raw, pairs=())  # a single run breaks nothing
    with pytest.raises(InvariantViolation) as e:
        check_fast_path(raw)
    assert e.value.invariant == "fast_path_exact"


def test_compiled_against_a_diverging_reference():
    with pytest.raises(InvariantViolation) as e:
        check_compiled(BUSY, reference_overrides={pk.decode_seconds: bp.decode_one_ulp_slower})
    assert e.value.invariant == "compiled_equals_reference"
    assert check_compiled(BUSY) is not None


def test_global_rng_breaks_reproducibility():
    np.random.seed(0)
    with pytest.raises(InvariantViolation) as e:
        check_reproducible(policy(BUSY, "GlobalRandomHead"))
    assert e.value.invariant == "reproducible"


@pytest.fixture(scope="module")
def two_workers():
    """Two Dask worker processes (one cluster for the module's worker tests), started without
    PYTHONHASHSEED so that each process salts string hashes its own way, as by default."""
    import os

    from servesim.sweep.executor import DaskExecutor

    saved = os.environ.pop("PYTHONHASHSEED", None)
    try:
        with DaskExecutor(workers=2) as ex:
            yield ex.client.scheduler.address
    finally:
        if saved is not None:
            os.environ["PYTHONHASHSEED"] = saved


PY = {"sim": {"engine": "python"}}  # (worker processes never wait for a first compile)
POINTS = {"engine.max_num_seqs": [2, 4]}


def test_process_salted_hashes_break_worker_independence(two_workers):
    raw = merge(policy(BUSY, "HashSpreadHead"), PY)
    check_reproducible(raw)  # two runs in one process agree...
    with pytest.raises(InvariantViolation) as e:  # ...but not a run in another process
        check_worker_independent(raw, POINTS, seeds=2, scheduler=two_workers)
    assert e.value.invariant == "worker_independent"
    one, many = check_worker_independent(merge(policy(BUSY, "Faithful"), PY), POINTS, seeds=2,
                                         scheduler=two_workers)
    assert len(one) == 4 and one["completed"].tolist() == many["completed"].tolist()


def test_starving_a_class_breaks_bounded_wait():
    """priority without aging, P0 alone filling the engine: P4 waits for P0's arrivals to stop
    (the FCFS contrast on the same arrivals: tests/test_starvation.py)."""
    from tests.test_starvation import RAW

    with pytest.raises(InvariantViolation) as e:
        check_run(merge(RAW, {"engine": {"scheduler": "priority"}}), pairs=(), max_wait_s=2.0)
    assert e.value.invariant == "bounded_wait" and "class P4" in str(e.value)


def test_every_invariant_has_a_failing_test():
    """The list above covers INVARIANTS."""
    import inspect
    import sys

    src = inspect.getsource(sys.modules[__name__])
    missing = [n for n in INVARIANTS if f'"{n}"' not in src.split("def test_every_invariant")[0]]
    assert missing == []


def test_check_invariants_alone_catches_a_grant_past_the_pool():
    """Issue 26: a policy part that admits past the KV pool ran to completion with no word even
    with sim.check_invariants: true (only servesim.testing caught it). The engine's own check now
    holds every running request to the slots it holds: a kv_allocate granting without blocks and
    a schedule admitting without allocating both stop in one line naming the request, the token
    it computes up to and the slots it holds; the built-in parts pass, compiled and not."""
    from servesim.errors import PolicyBug
    from servesim.simulate import build

    sc = scenario_from_dict(merge(BUSY, {"sim": {"check_invariants": True}}))
    line = r"^request \d+ computes up to token \d+ \(\d+ computed \+ \d+ this step\) but holds 0 KV slots " \
           r"\(0 blocks of 4\): the policy admitted it past the KV pool"
    with pytest.raises(PolicyBug, match=line):
        run_built(build(sc, kernel_overrides={kvk.kv_allocate: bp.grant_without_blocks}))
    past = scenario_from_dict(policy(merge(BUSY, {"sim": {"check_invariants": True}}), "AdmitsPastThePool"))
    with pytest.raises(AssertionError, match=line):  # (a PolicyBug is an AssertionError, as every engine check)
        run_built(build(past))
    for cold in ("compile", "python"):  # the built-in parts pass the check, compiled or not
        assert run_built(build(sc, cold=cold)).summary["requests"]["completed"] == 60


def test_a_policy_admitting_past_the_pool_is_one_line_from_the_cli(tmp_path):
    """The same check from ``servesim run``: one error line, exit status 2, no traceback."""
    import yaml

    from tests.fuzz_inputs import run_cli

    path = tmp_path / "past.yaml"
    path.write_text(yaml.safe_dump(policy(merge(BUSY, {"sim": {"check_invariants": True}}), "AdmitsPastThePool")))
    code, crash, out, err = run_cli(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"])
    assert crash is None and code == 2, (crash, err)
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err + out, err
    assert "past the KV pool" in lines[0] and "holds 0 KV slots" in lines[0], lines[0]
