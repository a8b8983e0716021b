"""Test your scheduler with servesim's invariants: strategies for scenarios, and a checker that
attaches to any run, a policy of your own included.

    from hypothesis import given
    from servesim.testing import check_run, strategies as sst

    @given(sst.scenarios(policies=["vllm"]))
    def test_my_policy(raw):
        raw["engine"]["scheduler"] = "mypkg.policies:ShortestPromptFirst"
        check_run(raw)        # raises InvariantViolation naming the broken invariant

:func:`check_run` runs the scenario with the :class:`Checker` attached (every decision, every
iteration, the end of the run), then the comparisons of :mod:`servesim.testing.pairs` (fast path
= single stepping, compiled = reference where a compiled run exists, same seed -> identical
results); :func:`check_worker_independent` (not part of check_run: it starts worker processes)
compares ``simulate_many`` on one worker and on several. The invariants are named in
:data:`INVARIANTS`; docs/testing.md has a test to copy, docs/reliability.md how each invariant
is tested. The strategies need ``hypothesis``
(``pip install servesim[test]``); the checker does not.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from servesim.testing.checker import CheckStats, Checker
from servesim.testing.result_checks import check_counts, check_fragmentation, check_percentiles, check_tiers
from servesim.testing.fairness import check_bounded_wait, waits_by_class
from servesim.testing.invariants import INVARIANTS, InvariantViolation
from servesim.testing.pairs import (
    check_compiled,
    check_fast_path,
    check_reproducible,
    check_worker_independent,
    compare_frames,
    compare_results,
    compiled_unavailable,
)

PAIRS = ("fast_path", "reproducible", "compiled")


@dataclass
class CheckedRun:
    """What :func:`check_run` checked: the watched run's Result, the checker's counts, and each
    comparison's outcome ("ok", or "n/a: why")."""

    result: object
    stats: CheckStats
    pairs: dict[str, str] = field(default_factory=dict)


def check_run(scenario_or_raw, seed: int | None = None, *, order: str | None = "auto",
              kernel_overrides: dict | None = None, pairs=PAIRS, checker: Checker | None = None,
              max_wait_s: float | None = None) -> CheckedRun:
    """Run a scenario (a Scenario or a raw mapping) with every invariant checked; raise
    :class:`InvariantViolation` at the first one broken. ``order``: the admission order the
    policy promises (see :class:`Checker`). ``kernel_overrides``: kernels bound to your Python
    callables (``servesim.simulate.build``). ``pairs``: which comparisons to run (each costs one
    or two more runs): any of ``fast_path``, ``reproducible``, ``compiled``. ``checker``: a
    Checker of your own (a subclass with invariants of your policy), used instead of
    ``Checker(order=order)``. ``max_wait_s``: the bounded_wait invariant, no class starved
    beyond this wait at this scenario's load (:func:`check_bounded_wait`)."""
    from servesim.simulate import run_built
    from servesim.testing.pairs import as_scenario

    unknown = set(pairs) - set(PAIRS)
    if unknown:
        raise ValueError(f"pairs {sorted(unknown)}: allowed {', '.join(PAIRS)}")
    sc = as_scenario(scenario_or_raw)
    checker = checker if checker is not None else Checker(order=order)
    built = checker.build(sc, seed, kernel_overrides=kernel_overrides)
    result = run_built(built, seed)
    stats = checker.finish(result)
    if max_wait_s is not None:
        check_bounded_wait(result, max_wait_s)
    done: dict[str, str] = {}
    if "reproducible" in pairs:
        a, _ = check_reproducible(sc, seed, kernel_overrides=kernel_overrides)
        # the watched run is the run itself: attaching the checker changes nothing
        compare_results(result, a, "reproducible", exact=True, what="the watched run against an unwatched one")
        done["reproducible"] = "ok"
    if "fast_path" in pairs:
        check_fast_path(sc, seed, kernel_overrides=kernel_overrides)
        done["fast_path"] = "ok"
    if "compiled" in pairs:
        why = compiled_unavailable(sc, kernel_overrides=kernel_overrides)
        if why is None:
            check_compiled(sc, seed)
            done["compiled"] = "ok"
        else:
            done["compiled"] = f"n/a: {why}"
    return CheckedRun(result, stats, done)


__all__ = [
    "CheckStats", "CheckedRun", "Checker", "INVARIANTS", "InvariantViolation", "PAIRS", "check_bounded_wait",
    "check_compiled", "check_counts", "check_fast_path", "check_fragmentation", "check_percentiles",
    "check_reproducible", "check_run", "check_tiers", "check_worker_independent", "compare_frames",
    "compare_results", "compiled_unavailable", "strategies", "waits_by_class",
]


def __getattr__(name: str):
    """``strategies`` (hypothesis strategies for scenarios) loads on first use."""
    if name == "strategies":
        import importlib

        return importlib.import_module("servesim.testing.strategies")
    raise AttributeError(f"module 'servesim.testing' has no attribute {name!r}")
