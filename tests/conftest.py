"""Shared test helpers: tiny scenario factories and the location of ../shared."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
# every bundled scenario file; scenarios/sweeps/ holds sweep specs and scenarios/plans/ plan specs,
# not scenarios (tests/test_sweep_spec.py and tests/test_plan.py load those)
SCENARIO_FILES = sorted(p for p in (REPO / "scenarios").rglob("*.yaml")
                        if not {"sweeps", "plans"} & set(p.relative_to(REPO).parts))

BASE = {
    "name": "t",
    "seed": 1,
    "stop": {"requests": 50},
    "hardware": {"gpu": "a100-80g"},
    "model": "llama-3-8b",
    "engine": {"scheduler": "vllm", "block_size": 16, "max_num_seqs": 8, "max_num_batched_tokens": 8192},
    "step_time": {"model": "constant", "seconds": 0.01},
    "workload": {
        "arrival": {"process": "poisson", "rate": 10.0},
        "prompt": {"dist": "fixed", "value": 16},
        "output": {"dist": "fixed", "value": 4},
    },
}


DISCRIMINATORS = ("dist", "process", "model")


def merge(base: dict, patch: dict) -> dict:
    """Recursive merge; a mapping that names a variant (dist/process/model) replaces the old one."""
    out = copy.deepcopy(base)
    for k, v in patch.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and not any(d in v for d in DISCRIMINATORS):
            out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def scenario(**patch):
    from servesim import scenario_from_dict

    return scenario_from_dict(merge(BASE, patch), "test")


def sessions_fleet(router: str, replicas: int = 4, requests: int = 300, **cluster) -> dict:
    """A fleet of ``replicas`` with prefix caching serving multi-turn chat sessions (a shared
    64-token system prompt, 32 new tokens a turn): the workload on which routers that keep a
    session's prefix in one cache (affinity, cache-aware) differ from load-only ones."""
    raw = merge(BASE, {"stop": {"requests": requests}, "hardware": {"replicas": replicas},
                       "engine": {"max_num_seqs": 8, "enable_prefix_caching": True},
                       "cluster": {"router": router, **cluster}})
    raw["workload"] = {"arrival": {"process": "poisson", "rate": 20.0},
                       "sessions": {"turns": {"dist": "geometric", "mean": 4, "max": 8}, "think_s": 0.2,
                                    "new_input": {"dist": "fixed", "value": 32},
                                    "output": {"dist": "fixed", "value": 8}, "system_prompt_tokens": 64}}
    return raw


@pytest.fixture
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip("../shared is not present")
    return SHARED


def pytest_sessionstart(session):
    """Compile the engine once, before any test runs (from the on-disk cache when it is there:
    a second or two). Tests that run servesim in a subprocess with a time limit (the hang guards
    of test_aging_horizon.py) or under an alarm (the fuzzer) must not pay a cold compile inside
    it: on a fresh checkout that is minutes, and they would time out on the compiler, not on a
    hang."""
    from tests.fuzz_inputs import warm_up

    warm_up()
