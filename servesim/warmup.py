"""Build the compiled engine now: ``servesim warm``, or ``python -m servesim.warmup`` (the
background process the CLI starts on a cold machine; one at a time, a lock file says who).
See servesim/engine/warm.py for the marker that records a built engine."""

from __future__ import annotations

import os
import time

from servesim.engine.warm import mark_ready, marker, warming


def warm() -> float:
    """Compile the engine now (a tiny run of every kernel) and mark it ready; returns seconds."""
    t0 = time.perf_counter()
    from servesim.scenario import scenario_from_dict
    from servesim.simulate import simulate

    raw = {"name": "warm", "stop": {"requests": 20}, "sim": {"engine": "compiled"},
           "engine": {"num_gpu_blocks_override": 64, "max_model_len": 512, "max_num_batched_tokens": 512},
           "workload": {"arrival": {"process": "poisson", "rate": 50.0},
                        "prompt": {"dist": "uniform", "min": 1, "max": 100},
                        "output": {"dist": "uniform", "min": 1, "max": 20}}}
    simulate(scenario_from_dict(raw, "warm"))
    mark_ready()
    return time.perf_counter() - t0


def main() -> None:
    m = marker()
    lock = m.with_name("WARMING") if m is not None else None
    if lock is not None:
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.close(fd)
        except FileExistsError:
            if warming():
                return  # someone else is building it
            lock.touch()
    try:
        warm()
    finally:
        if lock is not None:
            try:
                lock.unlink()
            except OSError:
                pass


if __name__ == "__main__":  # pragma: no cover - run as a background process
    main()
