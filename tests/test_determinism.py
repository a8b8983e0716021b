"""Same scenario and seed: byte-identical summary.json (wall time excluded)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from servesim.cli import app
from servesim.simulate import simulate, summary_json
from tests.conftest import REPO, scenario


def strip_wall(text: str) -> str:
    d = json.loads(text)
    d.pop("wall_s")
    return json.dumps(d, sort_keys=True)


def test_cli_summary_byte_identical(tmp_path):
    runner = CliRunner()
    outs = []
    for i in range(2):
        out = tmp_path / f"run{i}"
        res = runner.invoke(app, ["run", str(REPO / "scenarios" / "quickstart.yaml"), "--out", str(out),
                                  "--set", "stop.requests=800", "--set", "stop.warmup_requests=50", "-q"])
        assert res.exit_code == 0, res.stderr
        outs.append((out / "summary.json").read_text())
    a, b = (json.loads(o) for o in outs)
    a.pop("wall_s"), b.pop("wall_s")
    assert json.dumps(a, indent=2) == json.dumps(b, indent=2)


def test_seed_changes_results_and_is_reproducible():
    sc = scenario(stop={"requests": 300}, step_time={"model": "roofline"},
                  workload={"prompt": {"dist": "lognormal", "mean": 300, "sigma": 1.0, "max": 4000}})
    a, b, c = simulate(sc, seed=1), simulate(sc, seed=1), simulate(sc, seed=2)
    assert strip_wall(summary_json(a.summary)) == strip_wall(summary_json(b.summary))
    assert strip_wall(summary_json(a.summary)) != strip_wall(summary_json(c.summary))
    assert a.requests.equals(b.requests)
