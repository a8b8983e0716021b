"""The import contract of docs/architecture.md (floors; no cycles between packages), checked by import-linter
with the contract in pyproject.toml."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_imports_point_down_the_floors():
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    if not Path(exe).exists():
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    res = subprocess.run([exe], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "2 kept, 0 broken" in res.stdout


def test_the_cli_loads_the_offline_tools_only_when_a_tool_verb_is_named():
    """servesim/tools is the top floor (pandas, the calibration verbs): ``servesim run`` must not
    import it; ``servesim calibrate ...`` loads it through cli/commands.py _Commands."""
    code = ("import sys, servesim.cli as c; before = sorted(m for m in sys.modules if m.startswith('servesim.tools'));"
            "c.app(args=['calibrate', '--help'], standalone_mode=False);"
            "print(before, 'servesim.tools.calibrate_cli' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "[] True"
