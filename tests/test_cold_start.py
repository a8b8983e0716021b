"""A first run on a machine whose compiled engine is not built yet (servesim/simulate.py
``python_reasons``): the library compiles; the CLI runs a small run uncompiled and compiles for a
large one, and the header says which."""

from __future__ import annotations

import importlib

import pytest

from servesim import cli, jit
from servesim.simulate import build
from tests.conftest import scenario

simulate_mod = importlib.import_module("servesim.simulate")  # (the package's ``simulate`` is the function)


@pytest.fixture
def cold(monkeypatch):
    monkeypatch.setattr(jit, "compiled_ready", lambda: False)


def test_cold_choice_by_run_size(cold, monkeypatch):
    b = build(scenario(), cold="auto")  # 50 requests
    assert b.replica.path == "python"
    assert "not built on this machine" in b.replica.why and "50 requests" in b.replica.why
    b = build(scenario(), cold="compile")  # the library's default
    assert b.replica.path == "compiled" and b.replica.why == ""
    b = build(scenario(), cold="python")
    assert b.replica.path == "python" and "not built" in b.replica.why
    monkeypatch.setattr(simulate_mod, "SMALL_RUN_REQUESTS", 49)  # the same run is now "large"
    assert build(scenario(), cold="auto").replica.path == "compiled"
    with pytest.raises(ValueError, match="cold 'later'"):
        build(scenario(), cold="later")


def test_cold_choice_for_a_fleet(cold):
    sc = scenario(hardware={"gpu": "a100-80g", "replicas": 2})
    b = build(sc, cold="auto")
    assert b.replica.path == "python" and "not built on this machine" in b.replica.why


def test_warm_machine_compiles_whatever_the_size(monkeypatch):
    monkeypatch.setattr(jit, "compiled_ready", lambda: True)
    assert build(scenario(), cold="auto").replica.path == "compiled"
    assert build(scenario(), cold="python").replica.path == "compiled"


def test_cli_says_it_compiles_on_a_cold_machine(cold, monkeypatch, tmp_path, capsys):
    """A large first run compiles in the foreground after one line saying so; a small one says
    in the header that it runs uncompiled, and why."""
    import yaml

    from tests.conftest import merge, BASE

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(merge(BASE, {"stop": {"requests": 30}})))
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", str(path), "--out", str(tmp_path / "small")])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "python engine -- the compiled engine is not built on this machine yet" in " ".join(out.split())
    assert "compiling the engine" not in out
    monkeypatch.setattr(simulate_mod, "SMALL_RUN_REQUESTS", 10)
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", str(path), "--out", str(tmp_path / "large")])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "simulator compiled engine -- not built on this machine yet: the run compiles it first" in out
    assert "compiling the engine with numba" in out
