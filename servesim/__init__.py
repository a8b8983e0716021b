"""servesim: a discrete-event simulator of LLM serving schedulers.

    >>> import servesim
    >>> sc = servesim.load_scenario("scenarios/quickstart.yaml", ["workload.arrival.rate=8"])
    >>> res = servesim.simulate(sc)
    >>> res.summary["latency_s"]["ttft"]["p99"], len(res.requests)
"""

from servesim.version import __version__  # noqa: F401

from servesim.errors import ServesimError
from servesim.scenario import Scenario, load_scenario, scenario_from_dict
from servesim.simulate import Result, simulate

__all__ = ["Result", "Scenario", "ServesimError", "load_scenario", "scenario_from_dict", "simulate",
           "simulate_many"]


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
