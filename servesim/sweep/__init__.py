"""Many simulations: sweep specs and designs, execution here or on Dask, the parquet store,
replications with confidence intervals, capacity searches (docs/sweeps.md).

    spec.py, design.py   what to run: a base scenario, axes, a design, seeds, metrics
    task.py, executor.py how one run is done, and where (this process | Dask)
    runner.py, store.py  the loop: tasks -> rows -> parquet parts, resume, dedupe
    many.py              simulate_many: the same from Python, as a DataFrame
    replicate.py         servesim run --seeds N: intervals over replications
    ratescale.py         the one way to scale a workload's rate
    capacity.py          max rate / min replicas meeting SLOs
"""

from servesim.exports import exports

__all__, __getattr__ = exports(__name__, {
    "load_results": "servesim.sweep.store",
    "simulate_many": "servesim.sweep.many",
    "SLO": "servesim.sweep.capacity",
    "Budget": "servesim.sweep.capacity",
    "find_min_replicas": "servesim.sweep.capacity",
})
