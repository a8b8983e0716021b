"""Where a compiled fleet run spends its time inside its kernels (issue 30): cProfile sees the
compiled routed loop (engine/fleet_loop.py ``fleet_run``) as one call, so this script runs an
instrumented copy of it, and of the replica loop it calls (engine/kernel.py ``advance``), with
cycle counters (``llvm.readcyclecounter``) around each part, in place of the cached ones.

The copies are made from the current sources at start-up (the text of ``fleet_run`` and
``advance``, with counters inserted at named lines; a line that is no longer there is an error,
so a stale copy cannot report), compiled without a cache (~20 s). They call the same compiled
kernels, so results are those of the real loop (``--digest`` prints a hash of every request's
timestamps and replica to compare with an uninstrumented run: ``--digest --plain``).

  python benchmarks/fleet_profile.py 1024 least-tokens 200000   # a fleet (the benchmark's workload)
  python benchmarks/fleet_profile.py 1 least-tokens 200000      # one replica routed (fleet_build.SOLO
                                                                # off): the lone replica's work, in the same loop

Counters (seconds at the measured cycle rate): the router's choice (``choose``: the re-read of
touched replicas and the tree), ``route_in``, the engine calls (``advance``), the heap and marks;
inside ``advance``: the tally for the pack (``count``), commits of decode runs and of single
iterations, arrivals pulled, the scheduler, planning; and the counts of runs, steps, request-steps.
"""

from __future__ import annotations

import hashlib
import inspect
import re
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def _rdtsc(typingctx):
    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(64), []),
                                            "llvm.readcyclecounter")
        return builder.call(fn, [])
    return types.int64(), codegen


@numba.njit
def cycles():
    return _rdtsc()


P = 20  # ints[P + i]: the loop's counters; ints[P + 20 + i]: advance's (PR)
LOOP = ["choose", "route_in", "advance", "heap+mark", "in-kernel"]  # (5, 6: routes, engine calls)
ADV = ["count", "commit_decode", "runs", "run steps", "request-steps", "commit_iter", "iterations", "pull",
       "schedule", "schedules", "plan_decode", "plan_iter"]
COUNTS = {"runs", "run steps", "request-steps", "iterations", "schedules"}


def _edit(src: str, edits: list[tuple[str, str]]) -> str:
    for old, new in edits:  # (whole lines: a line's text inside a more indented one does not match)
        if src.count("\n" + old) != 1:
            raise SystemExit(f"fleet_profile: {old.strip()[:60]!r} is no longer in the source once: update the script")
        src = src.replace("\n" + old, "\n" + new.lstrip("\n"))
    return src


def _indent(block: str, spaces: int) -> str:
    return textwrap.indent(textwrap.dedent(block), " " * spaces)


def instrumented():
    """(fleet_run, advance) copies with counters, compiled here."""
    from servesim.engine import fleet_loop as FL
    from servesim.engine import kernel as K

    adv = inspect.getsource(K.advance.py_func).replace("@kernel\n", "")
    adv = adv.replace("def advance(cfg, st, kv, tab, until):", "def advance_p(cfg, st, kv, tab, until, pr):")
    adv = _edit(adv, [
        ("                count_decode_run(tab, st.b_ids, st.computed, st.s.b_len, st.s.run_k, st.s.now, st.ends)\n"
         "                commit_decode_run(cfg, st, kv, st.s.run_k)\n",
         _indent("""
             c0 = _rdtsc()
             count_decode_run(tab, st.b_ids, st.computed, st.s.b_len, st.s.run_k, st.s.now, st.ends)
             c1 = _rdtsc()
             commit_decode_run(cfg, st, kv, st.s.run_k)
             pr[0] += c1 - c0
             pr[1] += _rdtsc() - c1
             pr[2] += 1
             pr[3] += st.s.run_k
             pr[4] += st.s.run_k * st.s.b_len
             """, 16)),
        ("                count_iteration(tab, st.b_new, st.b_ctx, st.s.b_len, st.s.t_end - st.s.now)\n"
         "                commit_iteration(cfg, st, kv, st.s.t_end)\n",
         _indent("""
             c0 = _rdtsc()
             count_iteration(tab, st.b_new, st.b_ctx, st.s.b_len, st.s.t_end - st.s.now)
             c1 = _rdtsc()
             commit_iteration(cfg, st, kv, st.s.t_end)
             pr[0] += c1 - c0
             pr[5] += _rdtsc() - c1
             pr[6] += 1
             """, 16)),
        ("            pull_arrivals(cfg, st, now)\n",
         "            c0 = _rdtsc()\n            pull_arrivals(cfg, st, now)\n            pr[7] += _rdtsc() - c0\n"),
        ("            schedule(cfg, st, kv, now)\n",
         "            c0 = _rdtsc()\n            schedule(cfg, st, kv, now)\n            pr[8] += _rdtsc() - c0\n"
         "            pr[9] += 1\n"),
        ("                    k = plan_decode_run(cfg, st, kv, tab, until)\n",
         "                    c0 = _rdtsc()\n                    k = plan_decode_run(cfg, st, kv, tab, until)\n"
         "                    pr[10] += _rdtsc() - c0\n"),
        ("                    st.s.t_end = plan_iteration(cfg, st, tab)\n",
         "                    c0 = _rdtsc()\n                    st.s.t_end = plan_iteration(cfg, st, tab)\n"
         "                    pr[11] += _rdtsc() - c0\n"),
    ])
    run = inspect.getsource(FL.fleet_run.py_func).replace("@kernel\n", "")
    run = run.replace("def fleet_run(", "def fleet_run_p(")
    run = _edit(run, [
        ("    refs = ref.refs\n", "    refs = ref.refs\n    pr = ints[P + 20:]\n    t_in = _rdtsc()\n"),
        ("                    r = _choose(ref, ints, draws, t)\n",
         "                    c0 = _rdtsc()\n                    r = _choose(ref, ints, draws, t)\n"
         "                    ints[P + 0] += _rdtsc() - c0\n                    ints[P + 5] += 1\n"),
        ("                e = ref.first[r]\n", "                c1 = _rdtsc()\n                e = ref.first[r]\n"),
        ("                route_in_ref(x, slot)\n",
         "                route_in_ref(x, slot)\n                ints[P + 1] += _rdtsc() - c1\n"),
        ("        code = advance_ref(x, bound)\n",
         "        c0 = _rdtsc()\n        code = advance_p(x.conf.cfg, x.state, x.kv, x.conf.tab, bound, pr)\n"
         "        c1 = _rdtsc()\n        ints[P + 2] += c1 - c0\n        ints[P + 6] += 1\n"),
        ("        eh_set(key, eh, ehpos, ints, e, k)\n        ints[I_CALLS] += 1\n",
         "        eh_set(key, eh, ehpos, ints, e, k)\n        ints[P + 3] += _rdtsc() - c1\n        ints[I_CALLS] += 1\n"),
    ])
    # every return adds the time since entry
    run = re.sub(r"(?m)^( *)return X_", r"\1ints[P + 4] += _rdtsc() - t_in\n\1return X_", run)
    scope = {**vars(K), **vars(FL), "_rdtsc": _rdtsc, "P": P, "np": np}
    exec(compile(adv, "<advance_p>", "exec"), scope)  # noqa: S102 (the copy above, compiled)
    scope["advance_p"] = numba.njit(scope["advance_p"])
    exec(compile(run, "<fleet_run_p>", "exec"), scope)  # noqa: S102
    return numba.njit(scope["fleet_run_p"])


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    n, router, requests = int(args[0]), args[1], int(args[2])
    plain = "--plain" in sys.argv
    import fleet as bench

    from servesim import scenario_from_dict
    from servesim.engine import fleet_build
    from servesim.engine import fleet_loop as FL
    from servesim.engine.driver import entry_point
    from servesim.simulate import build

    fleet_build.SOLO = False  # (a fleet of one is routed too: the lone replica's work in this loop)
    FL.N_INTS = P + 20 + len(ADV)  # (the loop's ints, then the counters)
    b = build(scenario_from_dict(bench.scenario(n, requests, router, 8.5)))
    f = b.replica
    box = {}
    if not plain:
        t0 = time.perf_counter()
        f8, i8 = np.zeros(1), np.zeros(1, dtype=np.int64)
        inner = entry_point(instrumented(), f.loads._ref, f.inbox.cfg, f.inbox.kst, f8, np.zeros(1, dtype=np.uint8),
                            i8, i8, i8, f8, i8, i8, i8, i8, f.replica_of, np.zeros((1, 2), dtype=np.int64))
        print(f"instrumented copies compiled in {time.perf_counter() - t0:.0f} s")

        def run(*a):
            box["ints"] = a[7]
            return inner(*a)

        f._loop_entry = run
    t = time.perf_counter()
    b.env.run()
    wall = time.perf_counter() - t
    print(f"{n:,} x {router}, {requests:,} requests: run {wall:.2f} s")
    if not plain:
        ints = box["ints"]
        c0, t1 = cycles(), time.perf_counter()
        time.sleep(0.2)
        hz = (cycles() - c0) / (time.perf_counter() - t1)
        routes, calls = int(ints[P + 5]), int(ints[P + 6])
        print(f"routings {routes:,}, engine calls {calls:,} (cycle counter {hz / 1e9:.2f} GHz)")
        for i, name in enumerate(LOOP):
            print(f"  {name:14s} {ints[P + i] / hz:7.3f} s")
        for i, name in enumerate(ADV):
            v = int(ints[P + 20 + i])
            print(f"    {name:14s} " + (f"{v:,}" if name in COUNTS else f"{v / hz:7.3f} s"))
    if "--digest" in sys.argv:
        h = hashlib.sha1()
        for col in ("arrival", "t_first_token", "t_finish", "num_output"):
            h.update(np.ascontiguousarray(getattr(f.table, col)).tobytes())
        h.update(f.replica_of.tobytes())
        print("digest", h.hexdigest())


if __name__ == "__main__":
    main()
