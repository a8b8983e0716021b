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
from servesim.sweep.many import simulate_many

__all__ = ["Result", "Scenario", "ServesimError", "load_scenario", "scenario_from_dict", "simulate",
           "simulate_many"]
