"""docs/testing.md's test to copy runs as written (with fewer examples), and catches a policy
that breaks its promise."""

from __future__ import annotations

import importlib
import re
import sys

import pytest

from tests.conftest import REPO

DOC = REPO / "docs" / "testing.md"


def doc_files() -> dict[str, str]:
    text = DOC.read_text()
    return dict(re.findall(r"<!-- file: (\S+) -->\n```python\n(.*?)```", text, flags=re.S))


@pytest.fixture
def user_suite(tmp_path, monkeypatch):
    files = doc_files()
    assert set(files) == {"mypolicies.py", "test_mypolicies.py"}
    for name, code in files.items():
        # fewer examples, the same ones every time, no shrinking (shrinking the broken policy's
        # failure took 70 s of the fast suite)
        code = code.replace("@settings(max_examples=25, deadline=None)",
                            "@settings(max_examples=10, deadline=None, database=None, derandomize=True,\n"
                            "          phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate])")
        if name == "test_mypolicies.py":
            assert "phases=" in code, "the documented @settings line changed: update this fixture"
            code = "import hypothesis\n" + code
        (tmp_path / name).write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("mypolicies", "test_mypolicies"):
        sys.modules.pop(name, None)


def test_the_documented_test_passes(user_suite):
    importlib.import_module("test_mypolicies").test_shortest_prompt_first()


def test_the_documented_test_catches_a_broken_promise(user_suite):
    src = (user_suite / "mypolicies.py").read_text()
    (user_suite / "mypolicies.py").write_text(src.replace("st.prompt[rid] < st.prompt[best]",
                                                          "st.prompt[rid] > st.prompt[best]"))
    with pytest.raises(AssertionError, match="while a .*-token one waits"):
        importlib.import_module("test_mypolicies").test_shortest_prompt_first()
