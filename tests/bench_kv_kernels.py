"""Micro-benchmark of the KV kernels (not a test): ns per call, compiled kernels called from
compiled code and from Python, the kernel-backed classes and the frozen pre-kernel classes.

    python tests/bench_kv_kernels.py
"""

from __future__ import annotations

import time

import numba
import numpy as np

import tests.kv_reference as ref
from servesim.kv import kernels as K
from tests.kv_faces import ElasticKV
from tests.kv_faces import PagedKV
from tests.kv_faces import StaticKV

NB, K_RUN = 128, 1000


@numba.njit
def loop_allocate(kv, computed, reps):
    ok = 0
    for i in range(reps):
        rid = i % 128
        ok += K.kv_allocate(kv, computed, rid, 1)
        K.kv_free(kv, rid)
    return ok


@numba.njit
def loop_allocate_decodes(kv, computed, ids, nb, reps):
    ok = 0
    for _ in range(reps):
        ok += K.kv_allocate_decodes(kv, computed, ids, nb)
    return ok


@numba.njit
def loop_decode_run(kv, computed, ids, nb, k, used, reps):
    s = 0
    for _ in range(reps):
        s += K.kv_decode_run(kv, computed, ids, nb, k, used)
    return s


@numba.njit
def loop_step_usage(kv, computed, ids, nb, k, used, out, reps):
    new = np.ones(nb, dtype=np.int64)
    for _ in range(reps):
        K.kv_step_usage(kv, computed, ids, nb, ids, new, nb, k, used, out)


def timeit(fn, reps):
    fn()
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, time.perf_counter() - t)
    return best / reps * 1e9


def state(kind, n, computed):
    kw = {"base_blocks": 4, "growth_blocks": 2} if kind == "elastic" else {}
    if kind == "static":
        kw = {"reserve_tokens": np.full(n, 4096)}
    return K.make_kv(kind, 1 << 22, 16, n, **kw)


def main():
    n = NB
    rng = np.random.default_rng(1)
    computed = rng.integers(1, 2000, n).astype(np.int32)
    ids = np.arange(n, dtype=np.int64)
    print(f"{'':28s}{'paged':>12s}{'elastic':>12s}{'static':>12s}   (ns per call)")
    rows = {}
    for kind in ("paged", "elastic", "static"):
        kv = state(kind, n, computed)
        for r in range(n):
            K.kv_allocate(kv, computed, r, 1)
        used = np.empty(K_RUN, dtype=np.int64)
        out = np.empty((3, K_RUN))
        reps = 200_000
        loop_allocate(kv, computed, 10)
        rows.setdefault("kv_allocate+kv_free (in njit)", []).append(
            timeit(lambda: loop_allocate(kv, computed, reps), 1) / reps)
        loop_allocate_decodes(kv, computed, ids, n, 1)
        r2 = 20_000
        rows.setdefault("kv_allocate_decodes nb=128", []).append(
            timeit(lambda: loop_allocate_decodes(kv, computed, ids, n, r2), 1) / r2)
        loop_decode_run(kv, computed, ids, n, K_RUN, used, 1)
        r3 = 2_000
        rows.setdefault("kv_decode_run nb=128 k=1000", []).append(
            timeit(lambda: loop_decode_run(kv, computed, ids, n, K_RUN, used, r3), 1) / r3)
        K.kv_decode_run(kv, computed, ids, n, K_RUN, used)
        loop_step_usage(kv, computed, ids, n, K_RUN, used, out, 1)
        rows.setdefault("kv_step_usage nb=128 k=1000", []).append(
            timeit(lambda: loop_step_usage(kv, computed, ids, n, K_RUN, used, out, r3), 1) / r3)
        rows.setdefault("kv_allocate from Python", []).append(
            timeit(lambda: K.kv_allocate(kv, computed, 5, 0), 50_000))
        rows.setdefault("kv_decode_run from Python", []).append(
            timeit(lambda: K.kv_decode_run(kv, computed, ids, n, K_RUN, used), 2_000))
    for name, vals in rows.items():
        print(f"{name:28s}" + "".join(f"{v:12.0f}" for v in vals))

    print(f"\nclasses: kernel-backed / frozen pre-kernel (ns per call), nb={n}, k={K_RUN}")
    for kind in ("paged", "elastic", "static"):
        res = []
        for cls in ("new", "old"):
            mod = ref if cls == "old" else None
            c = computed.copy()
            if kind == "paged":
                m = (ref.PagedKV if mod else PagedKV)(1 << 22, 16, c)
            elif kind == "elastic":
                m = (ref.ElasticKV if mod else ElasticKV)(1 << 22, 16, c, 4, 2)
            else:
                m = (ref.StaticKV if mod else StaticKV)(1 << 22, 16, c, np.full(n, 4096), "first")
            for r in range(n):
                m.allocate(r, 1)
            ones = np.ones(n, dtype=np.int64)
            k, used = m.decode_run(ids, K_RUN)

            def alloc_free():
                m.free(7)
                m.allocate(7, 1)

            res.append({
                "free+allocate": timeit(alloc_free, 20_000),
                "allocate_decodes": timeit(lambda: m.allocate_decodes(ids), 5_000),
                "decode_run": timeit(lambda: m.decode_run(ids, K_RUN), 1_000),
                "step_usage k=1": timeit(lambda: m.step_usage(ids, ones, 1), 5_000),
                "step_usage k=1000": timeit(lambda: m.step_usage(ids, ones, k, used), 1_000),
                "commit_decodes": timeit(lambda: m.commit_decodes(ids), 5_000),
            })
        print(f"  {kind}")
        for op in res[0]:
            print(f"    {op:20s}{res[0][op]:10.0f} /{res[1][op]:10.0f}")


if __name__ == "__main__":
    main()
