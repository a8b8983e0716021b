"""What the reference experiments run: every arm of issue 15 as a list of runs.

The arms are files (scenarios/reference/*.yaml); experiment B's axes (models, concurrency, knobs)
are sweep specs beside them (scenarios/reference/sweeps/*.yaml), so `servesim run` and
`servesim sweep` reproduce any row of docs/reference-experiments.md. This module only reads them:
a run is a validated scenario with a label and the tags its tables group by.

``quick=True`` shrinks every run (a few seconds of traffic, a hundred requests) for the smoke test:
same files, same code path, numbers not meant to be read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servesim import Scenario, load_scenario

REPO = Path(__file__).resolve().parents[2]
REF = REPO / "scenarios" / "reference"
SWEEPS = REF / "sweeps"

ENGINES = ("vllm", "sglang")
MODELS = ("qwen3-4b", "qwen3-8b", "qwen3-14b")


@dataclass(frozen=True)
class Run:
    exp: str  # experiment id: A-fleet, A-sessions, A-tiers, B1 .. B4
    label: str  # unique within the experiment; names the run's folder
    scenario: Scenario
    source: str  # the file (and overrides) it came from, relative to the repo
    tags: dict[str, Any] = field(default_factory=dict)
    per_round: bool = False  # keep per-round figures (multi-turn sessions)


@dataclass(frozen=True)
class Experiment:
    id: str
    title: str
    runs: list[Run]


def _rel(p: Path) -> str:
    return str(p.relative_to(REPO))


def _quick_stop(sc: Scenario) -> dict[str, Any]:
    """~120 requests (or ~150 seconds' worth, at least 6 s), whichever the run is bounded by."""
    from servesim.sweep.ratescale import base_rate

    st = sc.stop
    if st.requests is not None:
        return {"stop.requests": 120, "stop.warmup_requests": min(st.warmup_requests, 20)}
    rate = base_rate(sc) or 1.0
    return {"stop.duration_s": min(st.duration_s, max(6.0, 150.0 / rate)),
            "stop.warmup_requests": min(st.warmup_requests, 10)}


def _file_run(exp: str, label: str, name: str, overrides: dict | None = None, quick: bool = False,
              **tags) -> Run:
    path = REF / name
    over = dict(overrides or {})
    sc = load_scenario(path, over)
    if quick:
        sc = sc.override(_quick_stop(sc), source="--quick")
    src = _rel(path) + "".join(f" --set {k}={v}" for k, v in over.items())
    return Run(exp, label, sc, src, tags, per_round=exp == "A-sessions")


def _spec_runs(exp: str, spec_name: str, quick: bool, engine: str, label) -> list[Run]:
    """The points of a sweep spec; ``label(values) -> (label, tags)`` names each."""
    from servesim.sweep.spec import load_spec

    spec = load_spec(SWEEPS / spec_name)
    runs = []
    for p in spec.points:
        sc = p.scenario
        if quick:
            sc = sc.override(_quick_stop(sc), source="--quick")
        name, tags = label(p.values)
        src = f"{_rel(SWEEPS / spec_name)} point {p.index} (" + ", ".join(f"{k}={v}" for k, v in p.values.items()) + ")"
        runs.append(Run(exp, f"{engine}-{name}", sc, src, {"engine": engine, **tags}))
    return runs


def _by_model(v: dict) -> tuple[str, dict]:
    return v["model"], {"model": v["model"]}


def _by_model_clients(v: dict) -> tuple[str, dict]:
    c = v["workload.arrival.clients"]
    return f"{v['model']}-c{c}", {"model": v["model"], "clients": c}


def _by_knobs(v: dict) -> tuple[str, dict]:
    block = v["engine.block_size"]
    if "engine.chunked_prefill_size" in v:  # SGLang: a chunk of the context length splits nothing
        c = v["engine.chunked_prefill_size"]
        chunk = "off" if c >= 32768 else str(c)
    else:
        chunk = str(v["engine.max_num_batched_tokens"]) if v["engine.enable_chunked_prefill"] else "off"
    return f"b{block}-{chunk}", {"block": block, "chunk": chunk}


# ------------------------------------------------------------------------------- experiments
def fleet(quick: bool = False) -> Experiment:
    runs = []
    for model in ("qwen3-8b", "qwen3-14b"):
        over = {} if model == "qwen3-8b" else {"model": model}
        runs.append(_file_run("A-fleet", f"spark-{model}", "a_fleet_spark.yaml", over, quick, engine="spark",
                              model=model))
        runs.append(_file_run("A-fleet", f"halo-{model}", "a_fleet_halo.yaml", over, quick, engine="halo", model=model))
    return Experiment("A-fleet", "Spark vs Halo on 24 A100s, three streams", runs)


SESSION_ARMS = ("paged", "paged_nocache", "elastic", "static")
TIER_ARMS = ("none", "l2", "l2_64g", "l2_l3", "l2_l3_preload")


def sessions(quick: bool = False) -> Experiment:
    runs = [_file_run("A-sessions", arm, f"a_sessions_{arm}.yaml", None, quick, arm=arm) for arm in SESSION_ARMS]
    return Experiment("A-sessions", "10-round sessions: paged vs elastic vs static", runs)


def tiers(quick: bool = False) -> Experiment:
    runs = [_file_run("A-tiers", arm, f"a_tiers_{arm}.yaml", None, quick, arm=arm, prompts=4) for arm in TIER_ARMS]
    # sensitivity: where preload matters (32 system prompts, each hot but used less often than the
    # small pool turns over); overrides on the same files
    for arm in ("l2", "l2_l3", "l2_l3_preload"):
        runs.append(_file_run("A-tiers", f"{arm}-32prompts", f"a_tiers_{arm}.yaml",
                              {"workload.sessions.num_system_prompts": 32}, quick, arm=arm, prompts=32))
    return Experiment("A-tiers", "KV tiers under a small GPU pool", runs)


def closed_loop(quick: bool = False) -> Experiment:
    runs = [r for e in ENGINES for r in _spec_runs("B1", f"b1_closed_{e}.yaml", quick, e, _by_model_clients)]
    return Experiment("B1", "vLLM vs SGLang: closed loop 2,048 in / 512 out", runs)


def mix(quick: bool = False) -> Experiment:
    runs = [r for e in ENGINES for r in _spec_runs("B2", f"b2_mix_{e}.yaml", quick, e, _by_model)]
    return Experiment("B2", "vLLM vs SGLang: the 3:5:2 mix", runs)


def abnormal(quick: bool = False) -> Experiment:
    runs = [r for e in ENGINES for r in _spec_runs("B3", f"b3_abnormal_{e}.yaml", quick, e, _by_model)]
    return Experiment("B3", "vLLM vs SGLang: the mix with 10% requests over 16K tokens", runs)


def knobs(quick: bool = False) -> Experiment:
    runs = [r for e in ENGINES for r in _spec_runs("B4", f"b4_knobs_{e}.yaml", quick, e, _by_knobs)]
    return Experiment("B4", "vLLM vs SGLang: block size, chunk size, chunked prefill", runs)


EXPERIMENTS = {"A-fleet": fleet, "A-sessions": sessions, "A-tiers": tiers, "B1": closed_loop, "B2": mix,
               "B3": abnormal, "B4": knobs}


def experiments(only: list[str] | None = None, quick: bool = False) -> list[Experiment]:
    names = list(EXPERIMENTS) if not only else only
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown:
        raise ValueError(f"--only {unknown[0]!r}: not an experiment (known: {', '.join(EXPERIMENTS)})")
    return [EXPERIMENTS[n](quick) for n in names]
