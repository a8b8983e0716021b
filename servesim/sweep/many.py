"""``simulate_many``: many configurations and seeds from Python, as one DataFrame.

    >>> df = servesim.simulate_many(sc, {"workload.arrival.rate": [2, 4, 8],
    ...                                  "engine.max_num_seqs": [64, 256]}, seeds=3)
    >>> df.groupby("workload.arrival.rate")["ttft_p99"].mean()

It is a sweep without a folder: the same points, tasks, seeds and rows as ``servesim sweep``, run
in this process by default or on Dask (``workers=N`` local processes, ``scheduler=ADDRESS``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from servesim.metrics.flat import check_metric_name
from servesim.scenario import Scenario
from servesim.sweep.design import Dimension, SpecError, expand, parse_axis
from servesim.sweep.executor import make_executor
from servesim.sweep.runner import expand_rows, raise_errors, run_tasks, tasks_for
from servesim.sweep.spec import Point, check_fits, scenario_key


def points_of(grid_or_points: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A mapping is a grid (each value a list, or an axis form such as ``{start, stop, num}``;
    every combination, first path slowest); a sequence of mappings is the points themselves."""
    if isinstance(grid_or_points, Mapping):
        dims = []
        for k, v in grid_or_points.items():
            dims.append(Dimension((parse_axis(str(k), list(v) if isinstance(v, (tuple, range)) else v,
                                              f"simulate_many: {k}"),)))
        return expand(dims, "grid")
    if isinstance(grid_or_points, Sequence) and not isinstance(grid_or_points, str):
        out = []
        for i, p in enumerate(grid_or_points):
            if not isinstance(p, Mapping):
                raise SpecError(f"simulate_many: points[{i}] = {p!r} is not a mapping of dotted paths to values")
            out.append(dict(p))
        return out
    raise SpecError(f"simulate_many: expected a grid (mapping of paths to value lists) or a list of points, "
                    f"got {type(grid_or_points).__name__}")


def seeds_list(seeds: int | Sequence[int], base_seed: int) -> list[int]:
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        if seeds < 1:
            raise SpecError(f"simulate_many: seeds = {seeds}: give a count >= 1 or a list of seeds")
        return [base_seed + r for r in range(seeds)]
    if isinstance(seeds, Sequence) and seeds and all(isinstance(s, int) and s >= 0 for s in seeds):
        if len(set(seeds)) != len(seeds):
            raise SpecError(f"simulate_many: seeds = {list(seeds)}: seeds repeat")
        return list(seeds)
    raise SpecError(f"simulate_many: seeds = {seeds!r}: give a count >= 1 or a list of distinct seeds >= 0")


def simulate_many(scenario: Scenario, grid_or_points: Mapping[str, Any] | Sequence[Mapping[str, Any]],
                  seeds: int | Sequence[int] = 1, *, metrics: Sequence[str] | None = None,
                  workers: int | None = 1, scheduler: str | None = None) -> pd.DataFrame:
    """Run ``scenario`` at every point (dotted path -> value) for every seed; one row per point and
    seed: ``point, key, seed, replication``, the point's values, the metrics (all of
    :mod:`servesim.metrics.flat`, or ``metrics``) and ``wall_s``.

    ``seeds``: a count (seeds ``scenario.seed + 0 .. n-1`` at every point: common random numbers,
    so differences between points are not seed noise) or explicit seeds. Every point is validated
    before anything runs; a bad one raises one line naming it."""
    if metrics is not None:
        for m in metrics:
            why = check_metric_name(m)
            if why:
                raise SpecError(f"simulate_many: metrics: {why}")
    values = points_of(grid_or_points)
    points = []
    digests: dict[str, str] = {}  # each file the points read is hashed once
    for i, v in enumerate(values):
        label = ", ".join(f"{k}={x}" for k, x in v.items())
        where = f"simulate_many: point {i} ({label})"
        sc = scenario.override(v, source=where)
        check_fits(sc, where)
        points.append(Point(i, v, sc, scenario_key(sc, digests)))
    explicit = None if isinstance(seeds, int) and not isinstance(seeds, bool) else seeds_list(seeds, 0)
    if explicit is None:
        seeds_list(seeds, 0)  # validates the count

    def seeds_of(p: Point) -> list[int]:
        return explicit if explicit is not None else seeds_list(seeds, p.scenario.seed)

    tasks = tasks_for(points, seeds_of)
    with make_executor(workers, scheduler) as ex:
        rep = run_tasks(points, tasks, ex, metrics=metrics)
    raise_errors(rep)
    return expand_rows(points, pd.DataFrame(rep.rows), seeds_of)
