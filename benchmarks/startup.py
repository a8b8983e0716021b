"""Warm start-up benchmark: a fresh process to its first simulated second, beside numba's floor.

Issue 10's target: "start-up + first prediction under 1 s when warm". Each sample is a new
interpreter that imports servesim, loads ``scenarios/quickstart.yaml``, builds the compiled engine
from numba's on-disk cache and advances it one simulated second (the first iterations' step
times predicted and scheduled). Beside it, in the same session, numba's own floor: a new
interpreter importing numba and calling one cached ``@njit(cache=True)`` function. Both are
run ``--repeat`` times, interleaved, so load on a shared machine hits both alike.

Usage:  python benchmarks/startup.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SERVESIM = textwrap.dedent(f"""
    import time; t0 = time.perf_counter()
    import servesim
    from servesim.simulate import build
    sc = servesim.load_scenario({str(REPO / "scenarios/quickstart.yaml")!r})
    b = build(sc, cold="compile")
    assert b.replica.path == "compiled", b.replica.path
    b.replica.advance(1.0)
    print(time.perf_counter() - t0)
""")

FLOOR_MODULE = textwrap.dedent("""
    import numba

    @numba.njit(cache=True)
    def one(x):
        return x + 1
""")

FLOOR = textwrap.dedent("""
    import time; t0 = time.perf_counter()
    import floor_mod
    floor_mod.one(1)
    print(time.perf_counter() - t0)
""")


def sample(code: str, cwd: str, env_path: str | None = None) -> float:
    env = None
    if env_path:
        import os

        env = {**os.environ, "PYTHONPATH": env_path + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, env=env)
    if out.returncode != 0:
        sys.exit(out.stderr[-2000:])
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    from speed import byte_compile  # benchmarks/ is this script's folder, so on sys.path

    byte_compile(None)
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "floor_mod.py").write_text(FLOOR_MODULE)
        sample(FLOOR, tmp, tmp)  # compile and cache the floor's function
        sample(SERVESIM, tmp)  # the engine compiled and cached (about a minute the first time)
        floors, starts = [], []
        for _ in range(args.repeat):
            floors.append(sample(FLOOR, tmp, tmp))
            starts.append(sample(SERVESIM, tmp))
    t = subprocess.run([sys.executable, "-m", "timeit", "sum(range(100000))"], capture_output=True, text=True).stdout
    print(f"{time.strftime('%Y-%m-%d')} · python {sys.version.split()[0]} · timeit: {t.strip()}")
    print("| measure | min s | median s | max s |")
    print("|---|---|---|---|")
    for name, xs in (("servesim: import, quickstart, compiled engine from cache, 1 simulated s", starts),
                     ("numba floor: import numba + one cached @njit call", floors)):
        print(f"| {name} | {min(xs):.3f} | {statistics.median(xs):.3f} | {max(xs):.3f} |")


if __name__ == "__main__":
    main()
