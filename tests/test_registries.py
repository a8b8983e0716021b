"""One registry per extension point: every other list of names is derived from it, and adding
an entry (or a user's plug-in by import path) is all it takes."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from servesim import router_catalog
from servesim.errors import ScenarioError
from servesim.router_catalog import ROUTERS, RouterSpec
from servesim.scenario import scenario_from_dict
from servesim.simulate import simulate
from tests.conftest import BASE, merge

REPO = Path(__file__).resolve().parents[1]


def _fleet(router: str) -> dict:
    return merge(BASE, {"hardware": {"gpu": "a100-80g", "replicas": 3}, "cluster": {"router": router},
                        "stop": {"requests": 30}})


def _replicas(res) -> np.ndarray:
    return res.requests["replica"].to_numpy()


def test_a_router_added_in_one_registry_entry_runs(monkeypatch):
    """One entry in servesim/router_catalog.py (its class anywhere importable) and the scenario
    validates, the fleet routes by it, and the test strategies draw it."""
    monkeypatch.setitem(ROUTERS, "last", RouterSpec("last", "every request to the last replica",
                                                    "tests.plugins.routers:LastReplica"))
    res = simulate(scenario_from_dict(_fleet("last"), "t"))
    assert set(_replicas(res)) == {2}
    from servesim.testing import strategies

    assert "last" in strategies.router_names()


def test_a_users_router_by_import_path():
    res = simulate(scenario_from_dict(_fleet("tests.plugins.routers:LastReplica"), "t"))
    assert set(_replicas(res)) == {2}


@pytest.mark.parametrize("router, message", [
    ("nearest", "cluster.router = 'nearest': not a known router (allowed: round-robin, random,"),
    ("tests.plugins.routers:NotARouter", "is not a subclass of servesim.engine.router.Router"),
    ("tests.plugins.nope:X", "cannot import it"),
])
def test_bad_routers_are_one_line(router, message):
    with pytest.raises(ScenarioError) as exc:
        simulate(scenario_from_dict(_fleet(router), "t"))
    assert message in str(exc.value) and "\n" not in str(exc.value).strip()


def test_docs_router_table_is_the_registry():
    """docs/cluster.md's table of routers lists exactly the registry's routers, in its order."""
    text = (REPO / "docs/cluster.md").read_text()
    rows = re.findall(r"^\| `([a-z-]+)` \|", text.split("| `cluster.router` | rule |", 1)[1].split("\n\n", 1)[0], re.M)
    assert rows == list(ROUTERS)


def test_strategies_draw_every_router_a_generated_workload_can_feed():
    from servesim.testing import strategies

    assert strategies.router_names() == [n for n, s in ROUTERS.items() if not s.needs_keys]
    assert router_catalog.router_names() == list(ROUTERS)


def test_tier_kinds_come_from_one_registry():
    """A tier kind is one entry in config/kv.py's TIER_DEFAULTS: the config's Literal and the
    strategies' draws are built from it."""
    from typing import get_args

    from hypothesis import HealthCheck, given, settings

    from servesim.config.kv import TIER_DEFAULTS, TierConfig
    from servesim.testing import strategies

    assert get_args(TierConfig.model_fields["kind"].annotation) == tuple(TIER_DEFAULTS)
    seen = set()

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(strategies.tiers())
    def draw(tiers):
        seen.update(t["kind"] for t in tiers)

    draw()
    assert seen == set(TIER_DEFAULTS)


def test_num_classes_is_one_constant():
    """NUM_CLASSES is defined once (servesim/fields.py); every other module imports it."""
    pkg = REPO / "servesim"
    defined = [str(p.relative_to(REPO)) for p in pkg.rglob("*.py")
               if re.search(r"^NUM_CLASSES\s*=", p.read_text(), re.M)]
    assert defined == ["servesim/fields.py"]
