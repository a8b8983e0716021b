"""servesim: a discrete-event simulator of LLM serving schedulers.

    >>> import servesim
    >>> sc = servesim.load_scenario("scenarios/quickstart.yaml", ["workload.arrival.rate=8"])
    >>> res = servesim.simulate(sc)
    >>> res.summary["latency_s"]["ttft"]["p99"], len(res.requests)
"""

from servesim.version import __version__  # noqa: F401

from servesim.errors import ServesimError
from servesim.scenario import Scenario, load_scenario, scenario_from_dict
from servesim.simulate import Built, Result, build, run_built, simulate

# The public API: these names, and each package's ``__all__`` (servesim.report, .sweep, .testing,
# .workload, .kv, .perf) and servesim.request's. Every other module is internal: it may change
# without notice (docs/architecture.md; tests/test_public_api.py holds docs and notebooks to it).
__all__ = ["Built", "Result", "Scenario", "ServesimError", "build", "load_scenario", "run_built", "scenario_from_dict",
           "simulate", "simulate_many"]


def __getattr__(name: str):
    """``servesim.simulate_many`` and ``servesim.sweep`` load on first use: a plain ``import
    servesim`` stays free of pandas and the sweep machinery."""
    if name == "simulate_many":
        from servesim.sweep.many import simulate_many

        return simulate_many
    if name == "sweep":
        import importlib

        return importlib.import_module("servesim.sweep")
    raise AttributeError(f"module 'servesim' has no attribute {name!r}")
