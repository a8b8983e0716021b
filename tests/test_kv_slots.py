"""Per-replica KV memory (issue 30): a pool keeps ``held``/``start`` in local slots (an
open-addressing map sized to the requests holding KV at once, kv/pool.py) instead of one entry per
request of the whole run. The map must be invisible: every kernel answer, every holding and every
run's results equal the direct arrays', at any slot count (growth) and through deletions."""

from __future__ import annotations

import numpy as np
import pytest

import servesim.kv.pool as pool
from servesim import scenario_from_dict
from servesim.jit import pure
from servesim.kv import kernels as K
from servesim.simulate import build, run_built
from tests.conftest import BASE, merge
from tests.test_compiled_engine import assert_identical


def _pools(kind, n, nb, bs, rng):
    kw = {}
    if kind == "elastic":
        kw = {"base_blocks": 2, "growth_blocks": 3}
    if kind == "static":
        kw = {"reserve_tokens": rng.integers(1, 3 * bs, n), "fit": "best"}
    return pool.make_kv(kind, nb, bs, n, **kw), pool.make_kv(kind, nb, bs, n, local=True, **kw)


@pytest.mark.parametrize("kind", ["paged", "elastic", "static"])
@pytest.mark.parametrize("seed", range(4))
def test_local_slots_answer_as_the_direct_arrays(kind, seed, monkeypatch):
    monkeypatch.setattr(pool, "_HASH_START", 2)  # grow from 2 slots: every doubling is exercised
    rng = np.random.default_rng(seed)
    n, nb, bs = 300, 64, 2
    direct, local = _pools(kind, n, nb, bs, rng)
    assert len(local.hkeys) == 128 and len(direct.hkeys) == 0
    alloc, decodes, commit, free = (pure(k) for k in (K.kv_allocate, K.kv_allocate_decodes,
                                                      K.kv_commit_decodes, K.kv_free))
    run_used, check, slots_held = pure(K.kv_decode_run), pure(K.kv_check), pure(K.kv_slots_held)
    held_of = pure(pool.held_of)
    comp = [np.zeros(n, dtype=np.int32), np.zeros(n, dtype=np.int32)]
    live: list[int] = []
    most = 0
    for _ in range(3000):
        op = rng.integers(0, 5)  # admissions outnumber ends: the pool fills, then churns full
        if op <= 1 or not live:  # admit or grow a request
            r = int(rng.integers(0, n))
            k = int(rng.integers(1, 5))
            a = [alloc(kv, c, r, k) for kv, c in zip((direct, local), comp)]
            assert a[0] == a[1]
            if a[0]:
                for c in comp:
                    c[r] += k
                if r not in live:
                    live.append(r)
        elif op == 2:  # a decode step of some holders
            ids = np.array(rng.choice(live, min(len(live), 5), replace=False), dtype=np.int64)
            a = [decodes(kv, c, ids, len(ids)) for kv, c in zip((direct, local), comp)]
            assert a[0] == a[1]
            used = [np.zeros(6, dtype=np.int64), np.zeros(6, dtype=np.int64)]
            ks = [run_used(kv, c, ids, len(ids), 6, u) for kv, c, u in zip((direct, local), comp, used)]
            assert ks[0] == ks[1] and used[0].tolist() == used[1].tolist()
            if a[0] and kind != "static":
                for c in comp:
                    c[ids] += 1
                for kv, c in zip((direct, local), comp):
                    commit(kv, c, ids, len(ids))
        else:  # finish or preempt
            r = live.pop(int(rng.integers(0, len(live))))
            assert free(direct, r) == free(local, r)
            for c in comp:
                c[r] = 0
        most = max(most, int(local.hstate[1]))
        assert int(direct.s[0].free) == int(local.s[0].free)
        holders = np.array(live, dtype=np.int64)
        assert check(direct, comp[0], holders, len(holders)) == check(local, comp[1], holders, len(holders)) == 0
    for r in range(n):
        assert held_of(local, r) == direct.held[r]
        assert slots_held(local, r) == slots_held(direct, r)
        if kind == "static" and direct.held[r]:
            assert local.start[pure(pool.held_slot)(local, r)] == direct.start[r]
    assert int(local.hstate[1]) == int((direct.held > 0).sum())  # no entry for a request holding nothing
    assert most > 8 and int(local.hstate[0]) + 1 > 16  # the map grew


RUN = merge(BASE, {"stop": {"requests": 300}, "step_time": {"model": "roofline"},
                   "engine": {"max_num_seqs": 32},
                   "workload": {"arrival": {"process": "poisson", "rate": 60.0},
                                "prompt": {"dist": "lognormal", "mean": 200, "sigma": 1.0, "max": 2000},
                                "output": {"dist": "uniform", "min": 1, "max": 200}},
                   "sim": {"check_invariants": True}})


def _run(raw, local: bool, monkeypatch):
    monkeypatch.setattr(pool, "HASH_MIN", -1 if local else 1 << 40)
    monkeypatch.setattr(pool, "_HASH_START", 2)
    b = build(scenario_from_dict(raw))
    assert (len(b.replica.engines[0].kstate.hkeys) > 0) == local
    return run_built(b)


@pytest.mark.parametrize("engine", ["compiled", "python"])
@pytest.mark.parametrize("kv", ["paged", "elastic", "static"])
def test_a_run_with_local_slots_is_the_run_with_direct_arrays(engine, kv, monkeypatch):
    eng = {"kv_allocator": kv, "scheduler": "vllm" if kv == "paged" else "chunked"}
    if kv == "elastic":
        eng["kv"] = {"elastic": {"base_tokens": 32, "growth_tokens": 16}}
    raw = merge(RUN, {"engine": eng, "sim": {"engine": engine}})
    assert_identical(_run(raw, False, monkeypatch), _run(raw, True, monkeypatch))


def test_a_fleet_with_local_slots_is_the_fleet_with_direct_arrays(monkeypatch):
    raw = merge(RUN, {"hardware": {"replicas": 5}, "cluster": {"router": "least-tokens"},
                      "stop": {"requests": 600}, "workload": {"arrival": {"rate": 250.0}}})
    a, b = _run(raw, False, monkeypatch), _run(raw, True, monkeypatch)
    assert a.requests.equals(b.requests)
