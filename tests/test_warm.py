"""The compiled engine's readiness marker and the cold-start choice (servesim/engine/warm.py)."""

from __future__ import annotations

from servesim.engine import warm
from servesim.simulate import build
from tests.conftest import scenario


def test_marker_and_background_build(monkeypatch, tmp_path):
    monkeypatch.setattr(warm.kernel_cache, "cache_dir", lambda: str(tmp_path))
    started = []
    monkeypatch.setattr(warm.subprocess, "Popen", lambda *a, **k: started.append(a[0]))
    monkeypatch.setenv("SERVESIM_BACKGROUND_WARM", "1")
    assert not warm.compiled_ready()
    assert warm.warm_in_background() and "servesim.warmup" in started[0]
    (tmp_path / "WARMING").write_text("")  # one builder at a time
    assert warm.warm_in_background() and len(started) == 1
    warm.mark_ready()
    assert warm.compiled_ready() and warm.aot_pending()  # the ahead-of-time engine is built next
    assert warm.warm_in_background() and len(started) == 1  # (by the same builder)
    (tmp_path / "AOT_FAILED").write_text("no C compiler\n")  # built, or known to fail: nothing to start
    (tmp_path / "WARMING").unlink()
    assert not warm.aot_pending() and not warm.warm_in_background()
    monkeypatch.setenv("SERVESIM_BACKGROUND_WARM", "0")
    (tmp_path / "READY").unlink()
    assert not warm.warm_in_background() and len(started) == 1


def test_cold_cli_runs_uncompiled_and_says_why(monkeypatch, tmp_path):
    monkeypatch.setattr(warm.kernel_cache, "cache_dir", lambda: str(tmp_path))
    b = build(scenario(), cold="python")
    assert b.replica.path == "python" and "not built on this machine" in b.replica.why
    b = build(scenario(), cold="compile")
    assert b.replica.path == "compiled"



def test_background_build_warms_the_servesim_that_asked(monkeypatch, tmp_path):
    """``python -m servesim.warmup`` resolves the package from its working folder first: started
    from a source checkout after ``pip install .`` (the README's first command), it warmed the
    checkout's copy, whose cache key differs, and the installed copy stayed cold for good. The
    builder starts in the folder holding the asking package: run there (with a decoy servesim in
    the caller's folder), the command imports the asking copy."""
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "user" / "servesim").mkdir(parents=True)
    (tmp_path / "user" / "servesim" / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path / "user")  # the user's folder holds another servesim
    monkeypatch.setattr(warm.kernel_cache, "cache_dir", lambda: str(tmp_path))
    monkeypatch.setenv("SERVESIM_BACKGROUND_WARM", "1")
    captured = {}
    monkeypatch.setattr(warm.subprocess, "Popen", lambda args, **kw: captured.update(kw, args=args))
    assert warm.warm_in_background()
    assert captured["args"][1:] == ["-m", "servesim.warmup"]
    monkeypatch.undo()  # (Popen again)
    probe = subprocess.run([captured["args"][0], "-c", "import servesim.kernel_cache as j; print(j.__file__)"],
                           cwd=captured["cwd"], capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr
    assert Path(probe.stdout.strip()).resolve() == Path(warm.kernel_cache.__file__).resolve()
