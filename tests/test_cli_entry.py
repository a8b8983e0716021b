"""The console script (``servesim = servesim.cli:main``) as a process: what the command printed
arrives, and its exit status is the command's (0; 2 for bad input)."""

from __future__ import annotations

import os
import subprocess
import sys


def test_cli_process_prints_and_keeps_the_exit_status(tmp_path):
    env = {**os.environ, "SERVESIM_NO_DISK_MEMO": "1"}
    code = "import sys; sys.argv = ['servesim', *sys.argv[1:]]; from servesim.cli import main; main()"
    ok = subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True, text=True, env=env)
    bad = subprocess.run([sys.executable, "-c", code, "run", str(tmp_path / "missing.yaml")],
                         capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip()
    assert bad.returncode == 2
    assert "no such scenario file" in bad.stderr
