"""The compiled engine's readiness marker and the cold-start choice (servesim/engine/warm.py)."""

from __future__ import annotations

from servesim.engine import warm
from servesim.simulate import build
from tests.conftest import scenario


def test_marker_and_background_build(monkeypatch, tmp_path):
    monkeypatch.setattr(warm.jit, "cache_dir", lambda: str(tmp_path))
    started = []
    monkeypatch.setattr(warm.subprocess, "Popen", lambda *a, **k: started.append(a[0]))
    monkeypatch.setenv("SERVESIM_BACKGROUND_WARM", "1")
    assert not warm.compiled_ready()
    assert warm.warm_in_background() and "servesim.warmup" in started[0]
    (tmp_path / "WARMING").write_text("")  # one builder at a time
    assert warm.warm_in_background() and len(started) == 1
    warm.mark_ready()
    assert warm.compiled_ready() and not warm.warm_in_background()
    monkeypatch.setenv("SERVESIM_BACKGROUND_WARM", "0")
    (tmp_path / "READY").unlink()
    assert not warm.warm_in_background() and len(started) == 1


def test_cold_cli_runs_uncompiled_and_says_why(monkeypatch, tmp_path):
    monkeypatch.setattr(warm.jit, "cache_dir", lambda: str(tmp_path))
    b = build(scenario(), cold="python")
    assert b.replica.path == "python" and "not built on this machine" in b.replica.why
    b = build(scenario(), cold="compile")
    assert b.replica.path == "compiled"
