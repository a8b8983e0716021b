"""Every bundled scenario loads, and runs a few hundred requests without error."""

from __future__ import annotations

from pathlib import Path

import pytest

from servesim import load_scenario, simulate
from tests.conftest import REPO, SCENARIO_FILES, SHARED

SCENARIOS = SCENARIO_FILES


def _needs_shared(path: Path) -> bool:
    return "shared/" in path.read_text()


@pytest.mark.parametrize("path", SCENARIOS, ids=[str(p.relative_to(REPO / "scenarios")) for p in SCENARIOS])
def test_bundled_scenario_runs(path):
    if _needs_shared(path) and not SHARED.is_dir():
        pytest.skip("needs ../shared")
    sc = load_scenario(path, ["stop.requests=200", "stop.warmup_requests=0"])
    res = simulate(sc)
    r = res.summary["requests"]
    assert r["arrived"] == r["completed"] + r["rejected"] + r["in_flight"]
    assert r["completed"] > 0
