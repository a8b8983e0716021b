"""The console script (servesim.cli.entry) leaves without Python's teardown (0.3-0.4 s of a small
run): what the command printed must still arrive, its status must be the command's, and a
thread still at work must be waited for."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from servesim import cli


def test_cli_entry_flushes_and_keeps_the_exit_status(tmp_path):
    """The console script leaves without Python's teardown: what it printed must still arrive,
    and its status must be the command's."""
    env = {**os.environ, "SERVESIM_NO_DISK_MEMO": "1"}
    code = "import sys; sys.argv = ['servesim', *sys.argv[1:]]; from servesim.cli import entry; entry()"
    ok = subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True, text=True, env=env)
    bad = subprocess.run([sys.executable, "-c", code, "run", str(tmp_path / "missing.yaml")],
                         capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip()
    assert bad.returncode == 2
    assert "no such scenario file" in bad.stderr


def test_entry_exits_normally_while_a_thread_still_works(monkeypatch):
    """A non-daemon thread still running: entry() takes Python's normal exit (which waits for
    it) instead of ending the process under it."""
    release = threading.Event()
    worker = threading.Thread(target=release.wait, daemon=False)
    worker.start()
    monkeypatch.setattr(cli, "main", lambda: None)
    monkeypatch.setattr(os, "_exit", lambda code: pytest.fail("os._exit called while a thread was working"))
    try:
        with pytest.raises(SystemExit) as exc:
            cli.entry()
        assert exc.value.code == 0
    finally:
        release.set()
        worker.join()
