"""Fuzzing the loader and the CLI with hostile inputs (tests/fuzz_inputs.py): every input either
runs (exit 0, every result file) or is refused with exit 2 and one ``error:`` line; the library
refuses the same mappings with one-line ScenarioErrors; never a traceback, never a hang. CI runs
300 generated inputs (the same ones every time); the slow test 5,000 (figures in
docs/reliability.md)."""

from __future__ import annotations

import pytest

from tests.fuzz_inputs import FuzzStats, fuzz, known_inputs, run_one


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
    """The corpus found by hand (issue 26 and later): each runs or is refused in one line."""
    stats = FuzzStats()
    for inp in known_inputs():
        run_one(inp, stats)
    assert stats.failures == [], _report(stats)
    assert stats.refused >= 1, stats.line()
    print(stats.line())


@pytest.mark.slow
def test_fuzz_5000_inputs():
    stats = fuzz(5000)
    assert stats.failures == [], _report(stats)
    assert stats.inputs == 5000
    print(stats.line())
