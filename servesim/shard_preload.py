"""The fork server's preload for a local sharded run (servesim/engine/shard.py
:func:`start_fork_server`): imported once, so that every worker process is forked with servesim,
Dask's worker and the compiled engine already loaded instead of loading them itself. A module of
the top floor, beside the CLI, because it runs a fleet's worker as the coordinator does.

A spawned worker process imports distributed and servesim (~0.7 s) and loads the compiled
engine from numba's cache (~0.8 s, plus ~0.5 s compiling numba's typed-list methods, which are
not cached on disk) before it builds a replica: on a 2-core box, four such starts cost more than
a quarter of what one worker does in a 16,384-replica run (benchmarks/RESULTS.md). Here that is
paid once, in the fork server, while the coordinator prepares the run; each worker forked from it
inherits the loaded machine code (fork copies the process, numba's dispatchers and all).

The warm-up is a two-replica fleet of the worker's own code (:class:`ShardWorker` built, one
window, the end, the gathering), so the kernels loaded are those a worker calls. The kernels'
types do not depend on the GPU, model or scheduler (a run of another model loads nothing more:
measured), so one fixed fleet serves every run. Nothing here may raise: the fork server dies on an
error other than ImportError in a preload module, and the workers could not start; a warm-up that
fails only leaves the workers to load the engine themselves, as spawned ones do.

Why the fork server and not forking the coordinator: the coordinator runs Dask's event loop in a
thread, and a fork of a process with threads copies locks that other threads may hold (Python and
Dask both warn against it); the fork server is a fresh single-threaded process (started by exec)
that only forks."""

from __future__ import annotations

import os

from servesim.engine.shard import WARM_ENV


def warm() -> str:
    """Import what a worker imports and, where the compiled engine is built on this machine, load
    it by running a two-replica fleet through :class:`ShardWorker`; what was done, in words."""
    try:
        import distributed.nanny  # noqa: F401 - (what a worker process runs)
        import distributed.worker  # noqa: F401

        from servesim.engine import shard_worker  # noqa: F401
        import servesim.simulate  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - see the module docstring
        return f"import failed ({type(exc).__name__})"
    if os.environ.get(WARM_ENV) != "compiled":
        return "imported"
    try:
        from servesim.jit import compiled_ready

        if not compiled_ready():  # (compiling here would hold the workers' start for minutes)
            return "imported (the compiled engine is not built yet)"
        _run_tiny()
    except Exception as exc:  # noqa: BLE001
        return f"imported; warm-up failed ({type(exc).__name__})"
    return "imported; compiled engine loaded"


def _run_tiny() -> None:
    from functools import partial

    import numpy as np

    from servesim import scenario_from_dict
    from servesim.engine.fleet_build import fleet_buffers
    from servesim.engine.shard_worker import ShardWorker
    from servesim.metrics.collect import Recorder
    from servesim.simulate import scenario_workload

    raw = {"name": "shard-warm-up", "seed": 1, "stop": {"requests": 64},
           "hardware": {"gpu": "a100-80g", "replicas": 2}, "model": "llama-3-8b",
           "engine": {"scheduler": "vllm"}, "sim": {"engine": "compiled"},
           "workload": {"arrival": {"process": "poisson", "rate": 20.0},
                        "prompt": {"dist": "lognormal", "mean": 400, "sigma": 0.8, "min": 1, "max": 2000},
                        "output": {"dist": "lognormal", "mean": 50, "sigma": 0.8, "min": 1, "max": 200}},
           "cluster": {"router": "least-tokens", "router_refresh_s": 0.5}}
    sc = scenario_from_dict(raw)
    wl = scenario_workload(sc, sc.seed)
    n = len(wl)
    w = ShardWorker(sc, sc.seed, wl, 0, 2, [None], fleet_buffers(2, n), True,
                    partial(Recorder, sc.metrics.timeseries_bin_s))
    half = n // 2
    w.window(np.arange(half), np.arange(half) % 2, float(wl.arrival_s[half]), None, None)
    w.window(np.arange(half, n), np.arange(half, n) % 2, float("inf"), float(wl.arrival_s[-1]), None)
    w.finish(float(wl.arrival_s[-1]))


STATE = warm()
