"""One unit of work: a configuration and a seed. This runs on workers.

A task carries its validated scenario and its seed, so the result depends on the task alone,
never on which worker runs it or in which order: sweeps give the same rows on one process, on a
local cluster or on a remote one. The worker returns the whole summary (a few kB); flattening to
metrics happens where rows are kept. It also returns the request rate that arrived
(``arrived_req_per_s``: what a capacity search reports when the scenario's rate is not a request
rate, e.g. session starts).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from servesim.errors import ServesimError
from servesim.scenario import Scenario
from servesim.sweep.ratescale import measured_req_per_s


@dataclass(frozen=True)
class Task:
    key: str  # the configuration's key (servesim.sweep.spec.scenario_key)
    seed: int
    replication: int  # index of ``seed`` among the point's seeds
    scenario: Scenario
    out_dir: str | None = None  # write requests/timeseries/summary there (replicated runs)

    @property
    def id(self) -> tuple[str, int]:
        return (self.key, self.seed)


def run_task(task: Task) -> dict:
    """Simulate one task. Bad input found only at build time (a missing pack or trace file on
    this worker, an unsupported replica count) comes back as ``{"error": line}`` so the client
    reports it; anything else is a bug and raises."""
    from servesim.simulate import simulate

    try:
        res = simulate(task.scenario, seed=task.seed)
    except ServesimError as exc:
        return {"key": task.key, "seed": task.seed, "error": str(exc)}
    if task.out_dir is not None:
        res.write(Path(task.out_dir))
    arrived = measured_req_per_s(res.table.arrival, res.summary["sim_time_s"], task.scenario.stop.warmup_requests)
    return {"key": task.key, "seed": task.seed, "summary": res.summary, "arrived_req_per_s": arrived,
            "step_model": res.step_model}
