"""Fuzzing the loader and the CLI with hostile inputs (tests/fuzz_inputs.py): every input either
runs (exit 0, every result file) or is refused with exit 2 and one ``error:`` line; the library
refuses the same mappings with one-line ScenarioErrors; never a traceback, never a hang. CI runs
300 generated inputs (the same ones every time); the slow test 5,000 (figures in
docs/reliability.md)."""

from __future__ import annotations

import pytest

from tests.fuzz_inputs import (
    FuzzInput,
    FuzzStats,
    _known_base,
    _yaml,
    fuzz,
    known_inputs,
    run_one,
)


def _report(stats) -> str:
    lines = [stats.line()]
    for what, detail, inp in stats.failures[:5]:
        lines.append(f"- {what}: {str(detail)[:600]} | args {inp.args} | text {inp.text[:300]!r}")
    return "\n".join(lines)


def test_fuzz_300_inputs():
    stats = fuzz(300)
    assert stats.failures == [], _report(stats)
    assert stats.inputs == 300
    assert stats.ran >= 30 and stats.refused >= 100, stats.line()  # both outcomes exercised
    print(stats.line())


def test_known_inputs():
    """The corpus found by hand (issue 26 and later): each runs or is refused in one line; where
    an input carries a check (issue 26's wrong results), its results are right; where it names
    words (a misleading message), its refusal holds them."""
    stats = FuzzStats()
    for inp in known_inputs():
        run_one(inp, stats)
    assert stats.failures == [], _report(stats)
    assert stats.refused >= 1, stats.line()
    print(stats.line())


def test_the_harness_fails_wrong_results_misleading_lines_and_failed_setups():
    """The corpus's own checks can fail: a ``check`` finding the results wrong, a refusal
    lacking the words ``says`` asks for, a ``before`` command that does not exit 0 -- and each
    sees what it should (the earlier run's folder; the input's folder and stdout)."""
    text = _yaml(_known_base())
    seen = {}

    def wrong(work, stdout):
        seen["files"] = sorted(p.name for p in (work / "out").iterdir())
        seen["stdout"] = stdout
        return "wrong on purpose"

    run = ("run", "{dir}/scenario.yaml", "--out", "{dir}/out")
    cases = [FuzzInput(text, command=run, check=wrong),
             FuzzInput(text, args=("--out", ""), says=("empty", "no such word")),
             FuzzInput(text, before=(run + ("--seeds", "0"),), command=run + ("-q",))]
    stats = FuzzStats()
    for inp in cases:
        run_one(inp, stats)
    assert [f[0] for f in stats.failures] == ["exit 0, wrong results", "refused without ['no such word']",
                                              "setup run exit 2"], _report(stats)
    assert stats.ran == stats.refused == 0
    assert "summary.json" in seen["files"] and "wrote " in seen["stdout"]
    stats = FuzzStats()  # the same, right: no failure
    for inp in (FuzzInput(text, command=run, check=lambda w, o: None), FuzzInput(text, args=("--out", ""), says=("empty",)),
                FuzzInput(text, before=(run + ("-q",),), command=run + ("-q", "--force"))):
        run_one(inp, stats)
    assert stats.failures == [] and stats.ran == 2 and stats.refused == 1, _report(stats)


@pytest.mark.slow
def test_fuzz_5000_inputs():
    stats = fuzz(5000)
    assert stats.failures == [], _report(stats)
    assert stats.inputs == 5000
    print(stats.line())
