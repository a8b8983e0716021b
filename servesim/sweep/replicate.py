"""Independent replications of one scenario, and what they say together.

``servesim run --seeds 10`` (or ``stop.replications: 10``) runs seeds ``seed .. seed+9`` of the
scenario and reports every metric as an estimate with a confidence interval (a t interval over the
replications; servesim/metrics/intervals.py says why). The replicated summary keeps the shape of a
single run's (every number the mean over replications) and adds::

    "seed": [1, 2, ...],
    "replications": {"n": 10, "seeds": [...], "confidence": 0.95, "method": "..."},
    "intervals": {"ttft_p99": {"estimate", "half_width", "lo", "hi", "n", "confidence"}, ...}

keyed by the flat metric names of :mod:`servesim.metrics.flat` (the names SLOs and sweeps use),
per-class metrics included (``ttft_p99@chat``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pandas as pd

from servesim.metrics.flat import METRIC_NAMES, class_metric_names, flat_metrics
from servesim.metrics.intervals import (DEFAULT_CONFIDENCE, METHOD, Interval, absent_groups_as_zero, intervals,
                                       mean_summary)
from servesim.scenario import Scenario
from servesim.metrics.runfiles import clear_earlier_run, summary_json
from servesim.sweep.executor import SerialExecutor
from servesim.sweep.runner import Progress, raise_errors, run_tasks
from servesim.sweep.spec import Point, scenario_key
from servesim.sweep.task import Task


@dataclass
class Replicated:
    scenario: Scenario
    seeds: list[int]
    summaries: list[dict]  # in seed order
    confidence: float = DEFAULT_CONFIDENCE

    @cached_property
    def rows(self) -> list[dict[str, float]]:
        """Flat metrics of each run, per-class ones (``ttft_p99@P0``) included; a class a run
        did not see counts 0 requests there (metrics/intervals.py absent_groups_as_zero)."""
        filled = absent_groups_as_zero(self.summaries)
        return [flat_metrics(s, METRIC_NAMES + class_metric_names(s)) for s in filled]

    @cached_property
    def intervals(self) -> dict[str, Interval]:
        return intervals(self.rows, self.confidence)

    @cached_property
    def summary(self) -> dict:
        s = mean_summary(self.summaries)
        s["scenario"] = self.scenario.name
        s["seed"] = list(self.seeds)
        s["wall_s"] = float(sum(x["wall_s"] for x in self.summaries))
        s["replications"] = {"n": len(self.seeds), "seeds": list(self.seeds), "confidence": self.confidence,
                             "method": METHOD}
        s["intervals"] = {k: iv.to_dict() for k, iv in self.intervals.items()}
        return s

    def frame(self) -> pd.DataFrame:
        """One row per replication: seed, flat metrics, wall_s."""
        return pd.DataFrame([{"seed": seed, **row, "wall_s": s["wall_s"]}
                             for seed, row, s in zip(self.seeds, self.rows, self.summaries)])

    def write(self, out_dir: str | Path) -> Path:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        clear_earlier_run(out, keep_seeds=self.seeds)  # a run replaces a run as a set (--force)
        (out / "summary.json").write_text(summary_json(self.summary))
        self.frame().to_parquet(out / "replications.parquet", index=False)
        return out


def replication_seeds(base_seed: int, n: int) -> list[int]:
    return [base_seed + r for r in range(n)]


def replicate(scenario: Scenario, seeds: list[int], *, executor=None, out_dir: str | Path | None = None,
              confidence: float = DEFAULT_CONFIDENCE, progress: Progress | None = None) -> Replicated:
    """Run ``scenario`` once per seed (on ``executor``, default this process). With ``out_dir``,
    each run writes its own files to ``out_dir/seed-<seed>/``."""
    key = scenario_key(scenario)
    point = Point(0, {}, scenario, key)
    # each run is one replication: its scenario.resolved.yaml says replications: 1, so re-running
    # seed 2's file runs seed 2 (with replications: N it ran seeds 2..N+1)
    one = scenario.model_copy(update={"stop": scenario.stop.model_copy(update={"replications": 1})})
    tasks = [Task(key, s, r, one, None if out_dir is None else str(Path(out_dir) / f"seed-{s}"))
             for r, s in enumerate(seeds)]
    got: dict[int, dict] = {}
    rep = run_tasks([point], tasks, executor or SerialExecutor(), metrics=(), progress=progress,
                    on_summary=lambda t, s: got.__setitem__(t.seed, s))
    raise_errors(rep)
    return Replicated(scenario, list(seeds), [got[s] for s in seeds], confidence)
