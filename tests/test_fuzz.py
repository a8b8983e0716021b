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
    generated,
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


def test_the_inputs_do_not_depend_on_what_was_imported_before(tmp_path, monkeypatch):
    """The same inputs whatever modules the process loaded first (a test session's other tests,
    a constant added anywhere in servesim): hypothesis draws some values from the constants of
    the local modules loaded, which made the "same" 5,000 differ between sessions. And a
    gzipped data file's bytes do not hold the time it was made."""
    import gzip
    import sys

    first = generated(200)
    (tmp_path / "fuzz_pool_module.py").write_text(  # a local module with constants of its own
        "".join(f"C{i} = {v!r}\n" for i, v in enumerate([*range(3, 400, 7), 0.25, 1e-5, 77777, "x" * 3, "fleet"])))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fuzz_pool_module", raising=False)
    __import__("fuzz_pool_module")
    monkeypatch.setattr(gzip.time, "time", lambda: 1.5e9)  # another second
    again = generated(200)
    key = [(i.text, i.files, i.folders, i.args) for i in first]
    assert key == [(i.text, i.files, i.folders, i.args) for i in again]
    assert any(name.endswith(".gz") for i in first for name in i.files), "no gzipped file drawn: draw more"


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
