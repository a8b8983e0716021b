"""Build the compiled engine now: ``servesim warm``, or ``python -m servesim.warmup`` (the
background process the CLI starts on a cold machine; one at a time, a lock file says who).
See servesim/engine/warm.py for the marker that records a built engine."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from servesim.engine.warm import mark_ready, marker, warming


# a tiny run that reaches every kernel of the engine (one compiled specialization serves every
# policy, allocator and step-time model: they are data, not types)
WARM_SCENARIO = {"name": "warm", "stop": {"requests": 20}, "sim": {"engine": "compiled"},
                 "engine": {"num_gpu_blocks_override": 64, "max_model_len": 512, "max_num_batched_tokens": 512},
                 "workload": {"arrival": {"process": "poisson", "rate": 50.0},
                              "prompt": {"dist": "uniform", "min": 1, "max": 100},
                              "output": {"dist": "uniform", "min": 1, "max": 20}}}


def warm() -> float:
    """Compile the engine now (a tiny run of every kernel), mark it ready, then build the
    ahead-of-time engine from it (servesim/aot.py); returns seconds."""
    t0 = time.perf_counter()
    from servesim.scenario import scenario_from_dict
    from servesim.simulate import simulate

    simulate(scenario_from_dict(WARM_SCENARIO, "warm"))
    mark_ready()
    build_ahead_of_time()
    return time.perf_counter() - t0


def build_ahead_of_time() -> str:
    """Compile the ahead-of-time engine (servesim/aot.py) into the cache folder -- numba's JIT
    cache is warm by then, so it takes seconds -- and return :func:`servesim.aot.status`. A
    failure (no C compiler, a numba without ``pycc``) is recorded there, not raised: runs then
    keep the JIT-compiled engine."""
    from servesim import aot

    p = aot.paths()
    if p is None:
        return aot.status()
    so, meta = p
    failed = meta.with_name("AOT_FAILED")
    try:
        args = _example_arguments()
        with tempfile.TemporaryDirectory(prefix=".aot-", dir=so.parent) as tmp:  # then one rename
            _compile_ahead_of_time(args, tmp)
            os.replace(Path(tmp) / so.name, so)
    except Exception as exc:  # no C compiler, a numba without pycc, a compile error
        lines = str(exc).strip().splitlines()
        failed.write_text(f"{type(exc).__name__}: {lines[-1] if lines else ''}\n")
        return aot.status()
    import numba

    meta.write_text(json.dumps({"format": aot.FORMAT, "layout": aot.layout(args), "numba": numba.__version__,
                                "built": time.strftime("%Y-%m-%d %H:%M:%S")}))
    failed.unlink(missing_ok=True)
    return aot.status()


def _example_arguments() -> tuple:
    """(cfg, state, pool, step tables) of a tiny built replica: the types to compile for (every
    built-in policy, allocator and step-time model shares them; tests/test_aot.py checks)."""
    from servesim.scenario import scenario_from_dict
    from servesim.simulate import build

    r = build(scenario_from_dict(WARM_SCENARIO, "aot"), cold="compile").replica
    return r.cfg, r.st, r.kv, r.tab


def _compile_ahead_of_time(args: tuple, out_dir: str) -> None:
    import warnings

    from numba import typeof, types

    from servesim import aot
    from servesim.engine.kernel import advance_tuples

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pycc's pending-deprecation notice
        from numba.pycc import CC

        cc = CC(aot.MODULE)
        cc.output_dir = out_dir
        cc.verbose = False
        cc.export("advance", types.int64(*(typeof(a) for a in args), types.float64))(advance_tuples.py_func)
        cc.compile()


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
