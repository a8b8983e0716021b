"""Speed benchmark: simulated requests per wall second, per policy, beside a baseline checkout.

Workloads (each run in its own subprocess, so start-up and peak RSS are its own):

  a      Azure 2023 conversation lengths, each clipped to 4,096 total tokens, Poisson 6.45 req/s,
         A100-80G, llama-3-8b, block 16, max_num_seqs 128, max_num_batched_tokens 4096
  b      (a) with chunked prefill: the chunked policy chunks at 512 (chunked_prefill_size); the
         other policies use vLLM's flag with a 512-token budget
  c      (a) overloaded at 10 req/s
  core   ShareGPT lengths (Sarathi-Serve's file), Poisson at ~80 % of capacity, max_num_seqs 256

Every workload runs with each policy of ``--policies`` (vllm, chunked, priority, static-fifo).
``--baseline PATH`` runs the same scenarios on another checkout of servesim (e.g. a worktree of an
older commit) in the same session, so ratios are measured side by side; the baseline takes its
compiled core where it had one (sim.engine: compiled), else its Python engine
(``--baseline-engine compiled``: a baseline with the one-kernel engine, every policy compiled).

``--whole-process N`` times ``servesim run`` end to end (interpreter start, imports, scenario,
workload, run, files written) at N requests per policy on workload (a), and reports the ratio to
Vidur's cost model (9 s of start-up plus 5.9 ms per request, measured on a machine where
``python -m timeit "sum(range(100000))"`` reports 2.8 ms), scaled by this machine's timeit figure,
which is printed beside the results.

"run" times the simulation alone: each process first runs a 50-request cut of the same scenario,
which loads the cached compiled engine (a fixed 0.1-0.3 s per process, in "incl. load+build").

Usage:  python benchmarks/speed.py [--requests 100000] [--only a,b] [--policies vllm,chunked]
                                   [--baseline /path/to/old/checkout] [--baseline-engine old|compiled]
                                   [--whole-process 10000]
Append the printed tables to benchmarks/RESULTS.md with the date and machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SERVESIM_SHARED", REPO.parent / "shared"))  # the data beside the checkout
CORE_RATE = 2.2  # req/s: 80 % of the 2.76 req/s the core setup sustains, roofline (see --find-capacity)
INF = float("inf")
POLICIES = ("vllm", "chunked", "priority", "static-fifo")
VIDUR_START_S, VIDUR_PER_REQ_S, VIDUR_TIMEIT_MS = 9.0, 5.9e-3, 2.8

AZURE_CONV = str(SHARED / "traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv")
SHAREGPT = str(SHARED / "traces/sarathi_vidur_length_dists/sharegpt_8k_filtered_stats_llama2_tokenizer.csv")


def scenario_dict(name: str, n: int, step_model: str, policy: str = "vllm") -> dict:
    step = {"model": step_model}
    if name == "core":
        d = {"name": f"speed-core-{policy}", "seed": 1, "stop": {"requests": n},
             "hardware": {"gpu": "a100-80g"}, "model": "llama-3-8b",
             "engine": {"scheduler": "vllm", "block_size": 16, "max_num_seqs": 256,
                        "max_num_batched_tokens": 8192, "max_model_len": 8192},
             "step_time": step,
             "workload": {"arrival": {"process": "poisson", "rate": CORE_RATE},
                          "lengths": {"file": SHAREGPT, "max_total": 8192}}}
    else:
        d = {"name": f"speed-{name}-{policy}", "seed": 1, "stop": {"requests": n},
             "hardware": {"gpu": "a100-80g"}, "model": "llama-3-8b",
             "engine": {"scheduler": "vllm", "block_size": 16, "max_num_seqs": 128,
                        "max_num_batched_tokens": 4096, "max_model_len": 4096},
             "step_time": step,
             "workload": {"arrival": {"process": "poisson", "rate": 10.0 if name == "c" else 6.45},
                          "lengths": {"file": AZURE_CONV, "prompt_column": "ContextTokens",
                                      "output_column": "GeneratedTokens", "clip_total": 4096}}}
    e = d["engine"]
    e["scheduler"] = policy
    if name == "b":
        if policy == "chunked":
            e["chunked_prefill_size"] = 512
        else:
            e.update({"enable_chunked_prefill": True, "max_num_batched_tokens": 512})
    return d


def run_one(spec: dict) -> dict:
    """Run in this process (whichever servesim is on the path); print one JSON line."""
    t0 = time.perf_counter()
    import servesim
    from servesim import scenario_from_dict
    from servesim.simulate import build, run_built

    raw = scenario_dict(spec["workload"], spec["requests"], spec["step_model"], spec["policy"])
    if spec.get("engine"):
        raw["sim"] = {"engine": spec["engine"]}
    sc = scenario_from_dict(raw, raw["name"])
    # the first compiled call of a process loads the cached engine (0.1-0.3 s): done here, on a
    # 50-request cut of the same scenario, so that "run" times the simulation alone ("incl.
    # load+build" keeps it)
    run_built(build(scenario_from_dict({**raw, "stop": {"requests": 50}}, raw["name"])))
    t_load = time.perf_counter() - t0
    b = build(sc)
    t_build = time.perf_counter() - t0 - t_load
    res = run_built(b)
    s = res.summary
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    n = spec["requests"]
    out = {
        **spec, "servesim": str(Path(servesim.__file__).parents[1]),
        "engine": getattr(b.replica, "path", None) or getattr(b.replica, "name", "?"),
        "load_s": round(t_load, 3), "build_s": round(t_build, 3), "run_s": round(s["wall_s"], 3),
        "req_per_wall_s": round(n / s["wall_s"]), "req_per_wall_s_total": round(n / (time.perf_counter() - t0)),
        "iterations": s["engine"]["iterations"], "preemptions": s["requests"]["preemptions"],
        "sim_time_s": round(s["sim_time_s"], 1), "peak_rss_mb": round(rss_mb),
        "ttft_p99_s": s["latency_s"]["ttft"]["p99"],
    }
    print(json.dumps(out))
    return out


def checkout_env(src: str | None, **extra: str) -> dict:
    """This process's environment with ``src`` (a checkout of servesim; None: the installed one)
    first on PYTHONPATH, plus ``extra`` variables."""
    env = {**os.environ, **extra}
    if src:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return env


def timed_servesim_run(path: Path, out: Path, env: dict) -> float:
    """Wall seconds of one ``servesim run PATH --out OUT -q --force`` process, end to end."""
    cmd = [sys.executable, "-m", "servesim.cli", "run", str(path), "--out", str(out), "-q", "--force"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"servesim run failed ({env.get('PYTHONPATH') or 'this checkout'}):\n{proc.stderr[-3000:]}")
    return dt


def subprocess_run(spec: dict, src: str | None) -> dict:
    env = checkout_env(src)
    proc = subprocess.run([sys.executable, __file__, "--one", json.dumps(spec)], capture_output=True, text=True,
                          env=env, cwd=tempfile.gettempdir())
    if proc.returncode != 0:
        sys.exit(f"{spec} on {src or 'this checkout'} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def timeit_ms() -> float:
    out = subprocess.run([sys.executable, "-m", "timeit", "sum(range(100000))"], capture_output=True, text=True).stdout
    value, unit = out.split(":")[1].split()[:2]  # "200 loops, best of 5: 1.24 msec per loop"
    return float(value) * {"msec": 1.0, "usec": 1e-3, "sec": 1e3}[unit]


def byte_compile(src: str | None) -> list[str]:
    """Write the bytecode of every package a ``servesim run`` of ``src``'s servesim (None: the
    installed one) imports, as ``pip install`` does, and return the packages that lacked some.

    Where PYTHONDONTWRITEBYTECODE is set (this project's VMs and the device host) and a package
    was installed without its bytecode (the device host's numpy: 407 modules, no .pyc), every
    timed process would compile those modules from source again: ~0.2 s for the servesim checkout
    on PYTHONPATH, ~0.17 s for numpy on the device host -- a cost no pip-installed user pays.
    (The standard library is left as it is.)"""
    env = checkout_env(src)
    tmp = Path(tempfile.mkdtemp(prefix="servesim-bytecode-"))
    path = tmp / "a.yaml"
    path.write_text(yaml.safe_dump(scenario_dict("a", 200, "roofline")))
    probe = (f"import sys, sysconfig\nfrom servesim.cli import main\n"
             f"try:\n    main(['run', {str(path)!r}, '--out', {str(tmp / 'out')!r}, '-q'])\nexcept SystemExit:\n    pass\n"
             f"std = sysconfig.get_paths()['stdlib']\n"
             f"for m in list(sys.modules.values()):\n"
             f"    f = getattr(m, '__file__', None) or ''\n"
             f"    if f.endswith('.py') and not f.startswith(std + '/'):\n"
             f"        print('MODULE', f)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env,
                         cwd=tempfile.gettempdir()).stdout
    lacking = []
    for where in sorted({_package_of(line[7:]) for line in out.splitlines() if line.startswith("MODULE ")}):
        done = subprocess.run([sys.executable, "-m", "compileall", where], capture_output=True, text=True)
        if "Compiling " in done.stdout:  # (it names each file it had to compile)
            lacking.append(where)
    return lacking


def byte_compile_and_say(src: str | None) -> None:
    """:func:`byte_compile`, printing the packages that lacked bytecode (a fact about the machine
    worth recording beside its figures)."""
    lacking = byte_compile(src)
    if lacking:
        print(f"byte-compiled {len(lacking)} packages that lacked bytecode ({src or 'this checkout'}): "
              + ", ".join(Path(p).name for p in lacking), flush=True)


def _package_of(module_file: str) -> str:
    """The top-level package folder holding ``module_file`` (the file itself for a lone module)."""
    p = Path(module_file).parent
    if not (p / "__init__.py").exists():
        return module_file
    while (p.parent / "__init__.py").exists():
        p = p.parent
    return str(p)


def warm_up(src: str | None) -> None:
    """``servesim warm`` of a checkout: compile its engine into numba's cache (a no-op when built)."""
    env = checkout_env(src)
    subprocess.run([sys.executable, "-m", "servesim.cli", "warm"], env=env, cwd=tempfile.gettempdir(),
                   capture_output=True)


def whole_process(n: int, policy: str, src: str | None, step_model: str) -> float:
    """Seconds of ``servesim run`` on workload (a) at ``n`` requests, end to end, fresh out dir."""
    tmp = Path(tempfile.mkdtemp(prefix="servesim-speed-"))
    path = tmp / "a.yaml"
    path.write_text(yaml.safe_dump(scenario_dict("a", n, step_model, policy)))
    return timed_servesim_run(path, tmp / "out", checkout_env(src))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--only", default="a,b")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--step-model", default="roofline", choices=["roofline", "pack"])
    ap.add_argument("--baseline", help="another servesim checkout to run beside this one")
    ap.add_argument("--baseline-engine", default="old", choices=["old", "compiled"],
                    help="old: the baseline predates the one-kernel engine (compiled for vllm, else its "
                         "Python engine); compiled: every policy compiled there too")
    ap.add_argument("--whole-process", type=int, default=0, help="also time `servesim run` end to end at N requests")
    ap.add_argument("--skip-run", action="store_true", help="only the whole-process table (with --whole-process)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        run_one(json.loads(args.one))
        return
    policies = args.policies.split(",")
    if args.skip_run:
        args.only = ""
    # warm the numba caches of both checkouts (a first compiled run on a machine compiles)
    for policy in policies if args.only else ():
        subprocess_run({"workload": "a", "policy": policy, "requests": 200, "step_model": args.step_model}, None)
        if args.baseline and (policy == "vllm" or args.baseline_engine == "compiled"):
            subprocess_run({"workload": "a", "policy": policy, "requests": 200, "step_model": args.step_model,
                            "engine": "compiled"}, args.baseline)
    t_ms = timeit_ms()
    print(f"{time.strftime('%Y-%m-%d')} · {platform.machine()} · python {platform.python_version()} · "
          f"step model {args.step_model} · timeit sum(range(100000)) = {t_ms:.2f} ms", flush=True)
    rows = []
    for name in filter(None, args.only.split(",")):
        for policy in policies:
            spec = {"workload": name, "policy": policy, "requests": args.requests, "step_model": args.step_model}
            new = subprocess_run(spec, None)
            old = None
            if args.baseline:
                compiled = policy == "vllm" or args.baseline_engine == "compiled"
                spec_old = {**spec, "engine": "compiled" if compiled else "python"}
                old = subprocess_run(spec_old, args.baseline)
            rows.append((new, old))
            line = f"{name:5s} {policy:12s} {new['engine']:9s} {new['req_per_wall_s']:>9,} req/s"
            if old:
                line += f"   baseline {old['engine']:9s} {old['req_per_wall_s']:>9,} req/s   x{new['req_per_wall_s'] / old['req_per_wall_s']:.1f}"
            print(line, flush=True)
    if rows:
        print("\n| workload | policy | engine | req/wall s (run) | req/wall s incl. load+build | iterations | peak RSS MB |"
              + (" baseline engine | baseline req/wall s | ratio |" if args.baseline else ""))
        print("|---|---|---|---|---|---|---|" + ("---|---|---|" if args.baseline else ""))
    for new, old in rows:
        line = (f"| {new['workload']} | {new['policy']} | {new['engine']} | {new['req_per_wall_s']:,} | "
                f"{new['req_per_wall_s_total']:,} | {new['iterations']:,} | {new['peak_rss_mb']} |")
        if old:
            line += f" {old['engine']} | {old['req_per_wall_s']:,} | {new['req_per_wall_s'] / old['req_per_wall_s']:.1f}x |"
        print(line)
    if args.whole_process:
        n = args.whole_process
        for src in (None, args.baseline) if args.baseline else (None,):
            warm_up(src)
            byte_compile_and_say(src)
        # timeit sampled beside every timed process (the machine's speed drifts), the median scales
        # Vidur's model
        ticks, best, old = [], {}, {}
        for policy in policies:
            for _ in range(3):
                ticks.append(timeit_ms())
                best[policy] = min(best.get(policy, INF), whole_process(n, policy, None, args.step_model))
                if args.baseline:
                    old[policy] = min(old.get(policy, INF), whole_process(n, policy, args.baseline, args.step_model))
        t_med = statistics.median(ticks)
        vidur = (VIDUR_START_S + VIDUR_PER_REQ_S * n) * t_med / VIDUR_TIMEIT_MS  # scaled to this machine
        print(f"\nWhole process, `servesim run` on (a) at {n:,} requests, best of 3 (Vidur's model scaled to "
              f"timeit {t_med:.2f} ms, the median of {len(ticks)} samples between the runs, "
              f"{min(ticks):.2f}-{max(ticks):.2f}: {vidur:.1f} s)")
        print("| policy | servesim run s | x Vidur |" + (" baseline s | baseline x Vidur |" if args.baseline else ""))
        print("|---|---|---|" + ("---|---|" if args.baseline else ""))
        for policy in policies:
            line = f"| {policy} | {best[policy]:.2f} | {vidur / best[policy]:.0f}x |"
            if args.baseline:
                line += f" {old[policy]:.2f} | {vidur / old[policy]:.0f}x |"
            print(line, flush=True)

if __name__ == "__main__":
    main()
