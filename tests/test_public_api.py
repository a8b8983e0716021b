"""The public API (servesim/__init__.py): docs, README and notebooks import only public names --
from ``servesim`` itself, or from a package or top-level module (``servesim.report``,
``servesim.request``) that lists them in its ``__all__``; never from a module inside a package."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```[a-z]*[^\n]*\n(.*?)^```", re.M | re.S)  # every code block (YAML ones import nothing)


def _code(path: Path) -> list[str]:
    text = path.read_text()
    return [text] if path.suffix == ".py" else FENCE.findall(text)


def _sources() -> list[Path]:
    return sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"] + sorted((REPO / "notebooks").glob("*.py"))


def _imports(code: str):
    """(module, names) of every import of servesim in ``code`` (doctest prompts removed)."""
    code = "\n".join(line[4:] if line.startswith((">>> ", "... ")) else line for line in code.splitlines())
    try:
        tree = ast.parse(code)
    except SyntaxError:  # (a fragment: read the import lines alone)
        tree = ast.parse("\n".join(line.strip() for line in code.splitlines()
                                   if re.match(r"\s*(from servesim|import servesim)", line) and "(" not in line))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "servesim":
            yield node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "servesim":
                    yield a.name, []


def public_problems(module: str, names: list[str]) -> list[str]:
    if module.count(".") > 1:
        return [f"{module} is inside a package: import from {'.'.join(module.split('.')[:2])} (its __all__)"]
    mod = importlib.import_module(module)
    public = set(getattr(mod, "__all__", ()))
    return [f"{module}.{n} is not in {module}.__all__" for n in names if n not in public]


def test_docs_and_notebooks_import_only_public_names():
    problems = []
    for path in _sources():
        for code in _code(path):
            for module, names in _imports(code):
                problems += [f"{path.relative_to(REPO)}: {p}" for p in public_problems(module, names)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("module, names, bad", [
    ("servesim.report.build", ["write_run_report"], "inside a package"),
    ("servesim.report", ["sweepcharts"], "not in servesim.report.__all__"),
    ("servesim", ["simulate"], None),
])
def test_the_check_itself(module, names, bad):
    found = public_problems(module, names)
    assert (bad is None and not found) or (bad is not None and bad in found[0])


def test_every_public_name_resolves():
    for module in ("servesim", "servesim.report", "servesim.sweep", "servesim.testing", "servesim.workload",
                   "servesim.kv", "servesim.perf", "servesim.tools", "servesim.request"):
        mod = importlib.import_module(module)
        for name in mod.__all__:
            assert getattr(mod, name) is not None, (module, name)
