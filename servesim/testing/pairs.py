"""Invariants that compare runs: fast path = single stepping, compiled = reference, same seed ->
identical results, results independent of worker count.

Each runs a scenario twice with one thing changed (or nothing) and compares every per-request
column (status, reject reason, preemptions, timestamps, tokens, blocked seconds by cause) and the
summary, wall-clock time and the resolved scenario's hash aside (a sim setting is part of the
configuration, never of the results). ``kernel_overrides`` (a user's broken or experimental
kernels) apply to the runs that run Python.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from servesim.testing.invariants import InvariantViolation

TABLE_EXACT = ("status", "reject_reason", "preemptions", "num_output", "computed")
TABLE_TIMES = ("arrival", "t_first_sched", "t_first_token", "t_finish", "t_last_token", "blocked")
SKIP_SUMMARY = ("wall_s", "resolved_scenario")


def as_scenario(scenario_or_raw, **sim):
    """A Scenario from a Scenario or a raw mapping, with ``sim`` settings replaced."""
    from servesim.scenario import Scenario, scenario_from_dict

    if isinstance(scenario_or_raw, Scenario):
        sc = scenario_or_raw
        if sim:  # validated like --set (a bad value is one ScenarioError line)
            notes = sc.load_notes
            sc = sc.override({f"sim.{k}": v for k, v in sim.items()}, source="servesim.testing")
            sc._load_notes = notes
        return sc
    raw = dict(scenario_or_raw)
    if sim:
        raw["sim"] = {**(raw.get("sim") or {}), **sim}
    return scenario_from_dict(raw)


def run_plain(scenario_or_raw, seed: int | None = None, *, kernel_overrides: dict | None = None, **sim):
    """One run without the checker (``sim`` settings replaced); returns ``(Built, Result)``."""
    from servesim.simulate import build, run_built

    sc = as_scenario(scenario_or_raw, **sim)
    b = build(sc, seed, kernel_overrides=kernel_overrides or None)
    return b, run_built(b, seed)


def compare_results(a, b, invariant: str, *, exact: bool, what: str = "") -> None:
    """Raise InvariantViolation(``invariant``) at the first difference between Results ``a`` and
    ``b``: per-request columns, then the summary. ``exact``: bit for bit; else floats agree to
    1e-9 relative (1e-12 absolute)."""
    ta, tb = a.table, b.table
    label = f" ({what})" if what else ""
    if ta.n != tb.n:
        raise InvariantViolation(invariant, f"{ta.n} requests against {tb.n}{label}")
    for col in TABLE_EXACT:
        x, y = getattr(ta, col), getattr(tb, col)
        if not np.array_equal(x, y):
            i = int(np.flatnonzero(x != y)[0])
            raise InvariantViolation(invariant, f"request {i}: {col} {x[i]!r} against {y[i]!r}{label}")
    for col in TABLE_TIMES:
        x, y = getattr(ta, col), getattr(tb, col)
        same = np.isclose(x, y, rtol=0 if exact else 1e-9, atol=0 if exact else 1e-12, equal_nan=True)
        if exact:
            same = (x == y) | (np.isnan(x) & np.isnan(y))
        if not same.all():
            i = np.argwhere(~same)[0]
            r = int(i[0])
            raise InvariantViolation(invariant, f"request {r}: {col} {x[tuple(i)]!r} against {y[tuple(i)]!r}{label}")
    _compare_summary(a.summary, b.summary, invariant, exact, "summary", label)


def _compare_summary(x: Any, y: Any, invariant: str, exact: bool, path: str, label: str) -> None:
    if isinstance(x, dict) and isinstance(y, dict):
        keys = set(x) | set(y)
        for k in sorted(keys, key=str):
            if k in SKIP_SUMMARY:
                continue
            if k not in x or k not in y:
                raise InvariantViolation(invariant, f"{path}.{k} is in one summary only{label}")
            _compare_summary(x[k], y[k], invariant, exact, f"{path}.{k}", label)
        return
    if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)) and len(x) == len(y):
        for i, (u, v) in enumerate(zip(x, y)):
            _compare_summary(u, v, invariant, exact, f"{path}[{i}]", label)
        return
    if isinstance(x, float) and isinstance(y, float):
        if math.isnan(x) and math.isnan(y):
            return
        if x == y or (not exact and math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)):
            return
    elif x == y:
        return
    raise InvariantViolation(invariant, f"{path}: {x!r} against {y!r}{label}")


def check_fast_path(scenario_or_raw, seed: int | None = None, *, kernel_overrides: dict | None = None):
    """fast_path_exact: the run with ``sim.fast_path`` on equals the run with it off (to float
    rounding: a decode run sums its step times once). Returns the two Results (fast, single)."""
    _, fast = run_plain(scenario_or_raw, seed, kernel_overrides=kernel_overrides, fast_path=True)
    _, single = run_plain(scenario_or_raw, seed, kernel_overrides=kernel_overrides, fast_path=False)
    compare_results(fast, single, "fast_path_exact", exact=False, what="fast path against single stepping")
    return fast, single


def compiled_unavailable(scenario_or_raw, *, kernel_overrides: dict | None = None) -> str | None:
    """Why the compiled engine cannot run this scenario (None: it can)."""
    from servesim.policy_catalog import POLICIES
    from servesim.simulate import engine_reasons

    if kernel_overrides:
        return "kernels bound to Python callables"
    sc = as_scenario(scenario_or_raw)
    why = engine_reasons(sc, custom_model=False, on_iteration=False, user_policy=sc.engine.scheduler not in POLICIES)
    return "; ".join(why) if why else None


def check_compiled(scenario_or_raw, seed: int | None = None, *, reference_overrides: dict | None = None):
    """compiled_equals_reference: the compiled engine and the same source run as Python agree bit
    for bit. ``reference_overrides`` bind kernels of the Python run only (to show the check
    failing). Returns the two Results (compiled, reference), or None when the scenario needs the
    Python engine (a user policy, prefix caching...): there is no compiled run to compare."""
    if compiled_unavailable(scenario_or_raw) is not None:
        return None
    bc, compiled = run_plain(scenario_or_raw, seed, engine="compiled")
    br, reference = run_plain(scenario_or_raw, seed, kernel_overrides=reference_overrides, engine="python")
    assert bc.replica.path == "compiled" and br.replica.path == "python"
    compare_results(compiled, reference, "compiled_equals_reference", exact=True, what="compiled against Python")
    return compiled, reference


def check_reproducible(scenario_or_raw, seed: int | None = None, *, kernel_overrides: dict | None = None):
    """reproducible: two runs of the scenario with one seed agree bit for bit. Returns both."""
    _, a = run_plain(scenario_or_raw, seed, kernel_overrides=kernel_overrides)
    _, b = run_plain(scenario_or_raw, seed, kernel_overrides=kernel_overrides)
    compare_results(a, b, "reproducible", exact=True, what="two runs with the same seed")
    return a, b


def check_worker_independent(scenario_or_raw, grid_or_points=None, seeds=2, *, workers: int = 2,
                             scheduler: str | None = None, metrics=None):
    """worker_independent: ``servesim.simulate_many`` of these points and seeds gives the same
    rows, bit for bit, in this process (one worker) and on ``workers`` Dask worker processes (or
    the Dask cluster at ``scheduler``). ``grid_or_points`` as for simulate_many (None: the
    scenario itself); ``seeds``: a count or a list. Every column but the wall-clock time is
    compared. Returns the two DataFrames (one worker, several). What it catches: anything that
    depends on the process rather than on the scenario and seed -- Python's per-process string
    hash salt, a module-level cache or counter, the process id, the order in which a worker ran
    its tasks."""
    from servesim.sweep.many import simulate_many

    sc = as_scenario(scenario_or_raw)
    points = [{}] if grid_or_points is None else grid_or_points
    one = simulate_many(sc, points, seeds, workers=1, metrics=metrics)
    many = simulate_many(sc, points, seeds, workers=workers, scheduler=scheduler, metrics=metrics)
    where = f"dask cluster {scheduler}" if scheduler is not None else f"{workers} worker processes"
    compare_frames(one, many, "worker_independent", what=f"1 worker against {where}")
    return one, many


def compare_frames(a, b, invariant: str, *, what: str = "") -> None:
    """Raise InvariantViolation(``invariant``) at the first difference between two
    simulate_many frames (same rows in the same order, same columns, equal values; NaN equals
    NaN; ``wall_s`` aside)."""
    label = f" ({what})" if what else ""
    if list(a.columns) != list(b.columns):
        raise InvariantViolation(invariant, f"columns differ: {sorted(set(a.columns) ^ set(b.columns))}{label}")
    if len(a) != len(b):
        raise InvariantViolation(invariant, f"{len(a)} rows against {len(b)}{label}")
    for i in range(len(a)):
        x, y = a.iloc[i], b.iloc[i]
        for col in a.columns:
            if col == "wall_s":
                continue
            u, v = (z.item() if hasattr(z, "item") else z for z in (x[col], y[col]))  # (numpy scalars)
            both_nan = isinstance(u, float) and isinstance(v, float) and math.isnan(u) and math.isnan(v)
            if not both_nan and not u == v:
                row = f"point {x.get('point')}, seed {x.get('seed')}"
                raise InvariantViolation(invariant, f"{row}: {col} {u!r} against {v!r}{label}")
