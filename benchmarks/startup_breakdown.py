"""Where a whole-process ``servesim run`` spends its time, by package, on this machine.

Issue 10 measures ``servesim run`` end to end at 10,000 requests against Vidur; most of a warm
run is start-up, and start-up depends on the machine more than ``timeit`` says (its file system,
how many packages its environment holds). This prints, for workload (a) of benchmarks/speed.py:

* the import time of each top-level package (``python -X importtime``, self times summed per
  package, the median of ``--repeat`` processes; importtime's own overhead inflates each figure
  by a similar share, so read them as shares);
* the installed distributions on ``sys.path`` and the time pydantic's plugin lookup takes to scan
  their entry points (it runs once per process, when the first config model is built);
* which imported packages lacked bytecode (they are byte-compiled first, as ``pip install``
  would have; see ``speed.byte_compile``);
* the whole process, alternated: as installed, with ``PYDANTIC_DISABLE_PLUGINS=__all__``, and
  ``--baseline`` (another checkout) if given.

Usage:  python benchmarks/startup_breakdown.py [--requests 10000] [--repeat 5] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from speed import byte_compile_and_say, checkout_env, scenario_dict, timed_servesim_run, timeit_ms  # noqa: E402


def import_shares(path: Path, out: Path) -> Counter:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "servesim.cli", "run", str(path), "--out",
                           str(out), "-q", "--force"], capture_output=True, text=True, cwd=tempfile.gettempdir())
    if proc.returncode != 0:
        sys.exit(f"servesim run failed:\n{proc.stderr[-3000:]}")
    per = Counter()
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _, name = (x.strip() for x in line.split(":", 1)[1].split("|"))
        parts = name.split(".")
        key = ".".join(parts[:2]) if parts[0] == "servesim" else parts[0]
        per[key] += int(self_us)
    return per


def plugin_scan() -> tuple[int, float]:
    code = ("import time; t = time.perf_counter(); from importlib.metadata import distributions, entry_points; "
            "list(entry_points(group='pydantic')); dt = time.perf_counter() - t; "
            "print(sum(1 for _ in distributions()), dt)")
    n, dt = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.split()
    return int(n), float(dt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--baseline", help="another servesim checkout, timed beside this one")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="servesim-startup-"))
    path = tmp / "a.yaml"
    path.write_text(yaml.safe_dump(scenario_dict("a", args.requests, "roofline", "vllm")))
    for src in (None, args.baseline) if args.baseline else (None,):
        byte_compile_and_say(src)  # as pip install would have (see speed.byte_compile)
    timed_servesim_run(path, tmp / "warm", checkout_env(None))  # first run: caches, page cache
    print(f"{time.strftime('%Y-%m-%d')} · python {sys.version.split()[0]} · timeit {timeit_ms():.2f} ms")
    n, dt = plugin_scan()
    print(f"{n} distributions on sys.path; pydantic's plugin lookup (importlib.metadata + entry points): "
          f"{dt * 1e3:.0f} ms")
    shares = [import_shares(path, tmp / "imp") for _ in range(args.repeat)]
    keys = set().union(*shares)
    med = sorted(((statistics.median(s[k] for s in shares) / 1e3, k) for k in keys), reverse=True)
    print(f"\nimports (importtime self ms, median of {args.repeat}; all packages {sum(m for m, _ in med):.0f} ms)")
    for ms, k in med[:25]:
        print(f"  {ms:7.1f}  {k}")
    variants = {"as installed": checkout_env(None),
                "PYDANTIC_DISABLE_PLUGINS": checkout_env(None, PYDANTIC_DISABLE_PLUGINS="__all__")}
    if args.baseline:
        variants["baseline"] = checkout_env(args.baseline)
    times: dict[str, list[float]] = {k: [] for k in variants}
    for i in range(args.repeat):
        for k in (list(variants) if i % 2 == 0 else list(variants)[::-1]):
            times[k].append(timed_servesim_run(path, tmp / k.replace(" ", "_"), variants[k]))
    print(f"\nwhole process at {args.requests:,} requests (s; median, min of {args.repeat}, alternated)")
    for k, ts in times.items():
        print(f"  {k:26s} {statistics.median(ts):.3f}  {min(ts):.3f}")


if __name__ == "__main__":
    main()
