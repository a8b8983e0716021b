"""bounded_wait (servesim.testing.check_bounded_wait): a policy that starves a class under a
stated load is caught, where every other invariant holds (issue 26: a starving policy passed
as ``requests_conserved``). Failing before: there was no such invariant."""

from __future__ import annotations

import pytest

from servesim.testing import INVARIANTS, InvariantViolation, check_bounded_wait, check_run, waits_by_class
from tests.conftest import BASE, merge

# P0 alone (24 req/s) about fills one slot (4 iterations of 10 ms a request: 25 req/s): under a
# priority policy without aging P4 waits for the arrivals to stop; FCFS serves both alike
RAW = merge(BASE, {"stop": {"requests": 240}, "engine": {"max_num_seqs": 1},
                   "workload": {"arrival": {"process": "poisson", "rate": 30.0},
                                "classes": {"weights": [4, 0, 0, 0, 1]}}})


def test_a_starving_policy_breaks_bounded_wait_where_fcfs_holds():
    fair = check_run(RAW, pairs=(), max_wait_s=60.0)  # every other invariant holds too
    bound = 2 * max(waits_by_class(fair.result).values())
    check_bounded_wait(fair.result, bound)
    starving = merge(RAW, {"engine": {"scheduler": "priority"}})
    with pytest.raises(InvariantViolation) as e:
        check_run(starving, pairs=(), max_wait_s=bound)  # passes every invariant but this one
    assert e.value.invariant == "bounded_wait" and "class P4" in str(e.value), str(e.value)
    assert "bounded_wait" in INVARIANTS


def test_bounded_wait_refuses_a_bound_that_is_not_one():
    res = check_run(merge(RAW, {"stop": {"requests": 10}}), pairs=()).result
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="max_wait_s"):
            check_bounded_wait(res, bad)


def test_simulate_many_in_a_worker_importing_a_script_says_what_to_do(monkeypatch, capsys):
    """A script without a __main__ guard: each spawned worker re-imports it as __mp_main__ and
    reached simulate_many(workers=2) again (~400 lines of tracebacks). Now one line, and it exits."""
    import sys
    import types

    from servesim.sweep.executor import DaskExecutor

    fake = types.ModuleType("__mp_main__")
    monkeypatch.setitem(sys.modules, "__main__", fake)
    with pytest.raises(SystemExit):
        DaskExecutor(workers=2)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'if __name__ == "__main__":' in err[0] and "workers=1" in err[0]


POLICY_MODULE = '''
import servesim.jit
from servesim.sched import parts

builtin_admit = servesim.jit.pure(parts.admit_head)


def my_admit_head(cfg, st, kv, rid, queue, now, cap, hybrid):
    if st.prompt[rid] > 4096 and st.s.run_len > 0:
        return parts.NO_BUDGET
    return builtin_admit(cfg, st, kv, rid, queue, now, cap, hybrid)


def raw_admit_head(cfg, st, kv, rid, queue, now, cap, hybrid):
    return parts.admit_head(cfg, st, kv, rid, queue, now, cap, hybrid)  # the compiled kernel: a TypingError


class LongPromptsAlone:
    base = "vllm"
    parts = {"admit_head": my_admit_head}


class CallsTheKernel:
    base = "vllm"
    parts = {"admit_head": raw_admit_head}
'''


def test_calling_a_built_in_part_from_yours(tmp_path, monkeypatch):
    """docs/testing.md "Calling a built-in part": through servesim.jit.pure it runs (and equals
    the built-in where the rule never binds); the compiled kernel itself is one line, naming it
    (before: pages of numba TypingError)."""
    import yaml

    import servesim
    from tests.fuzz_inputs import run_cli

    (tmp_path / "wrapmod.py").write_text(POLICY_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    raw = merge(BASE, {"stop": {"requests": 20}})
    mine = servesim.simulate(servesim.scenario_from_dict(merge(raw, {"engine": {"scheduler": "wrapmod:LongPromptsAlone"}})))
    ref = servesim.simulate(servesim.scenario_from_dict(raw))
    assert mine.summary["latency_s"]["e2e"] == ref.summary["latency_s"]["e2e"]  # 16-token prompts: same runs
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(merge(raw, {"engine": {"scheduler": "wrapmod:CallsTheKernel"}})))
    code, crash, out, err = run_cli(["run", str(f), "--out", str(tmp_path / "o"), "-q"])
    lines = [x for x in err.splitlines() if x.strip()]
    assert crash is None and code == 2 and len(lines) == 1, (code, crash, err[-500:])
    assert "admit_head" in lines[0] and "servesim.jit.pure" in lines[0]


def test_numba_typing_error_becomes_one_line():
    from numba.core.errors import TypingError

    from servesim.errors import kernel_typing_line as numba_typing_line

    exc = TypingError("Failed in nopython mode pipeline (step: nopython frontend)\nNo implementation of function "
                      "Function(<function admit_head>) found for signature:\n \n >>> admit_head(ReplicaState, ...)\n")
    line = numba_typing_line(exc)
    assert line is not None and "\n" not in line and "admit_head" in line and "servesim.jit.pure(admit_head)" in line
    assert numba_typing_line(ValueError("x")) is None
