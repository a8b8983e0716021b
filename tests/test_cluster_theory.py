"""N identical replicas fed N x the rate behave like one replica at the rate (theory tests).

Splitting a Poisson stream at random gives each replica an independent Poisson stream of 1/N
the rate, so a fleet's latencies are a lone replica's in distribution: the means must agree
within their statistical error over seeds. Round robin gives each replica every N-th arrival --
Erlang-N gaps, more regular than Poisson -- so its queueing can only be lower: TPOT and E2E
agree within the error, TTFT (where the waiting for a boundary shows) is no higher and within a
stated margin.
"""

from __future__ import annotations

import numpy as np
import pytest

from servesim import scenario_from_dict
from servesim.simulate import simulate
from tests.conftest import BASE, merge

METRICS = ("ttft", "tpot", "e2e")


def _raw(n: int, rate: float, seed: int, router: str, per_replica: int) -> dict:
    raw = merge(BASE, {"seed": seed, "stop": {"requests": per_replica * n, "warmup_requests": per_replica * n // 10},
                       "engine": {"max_num_seqs": 32}, "step_time": {"model": "roofline"},
                       "workload": {"arrival": {"process": "poisson", "rate": rate * n},
                                    "prompt": {"dist": "lognormal", "mean": 400, "sigma": 0.8, "max": 4000},
                                    "output": {"dist": "lognormal", "mean": 150, "sigma": 0.8, "max": 1000}}})
    if n > 1:
        raw = merge(raw, {"hardware": {"replicas": n}, "cluster": {"router": router}})
    return raw


def _means(n, rate, router, seeds, per_replica):
    rows = []
    for seed in seeds:
        s = simulate(scenario_from_dict(_raw(n, rate, seed, router, per_replica))).summary
        rows.append([s["latency_s"][m]["mean"] for m in METRICS] + [s["throughput"]["req_per_s"] / n])
    x = np.array(rows)
    return x.mean(axis=0), x.std(axis=0, ddof=1) / np.sqrt(len(x))


def _close(a, sa, b, sb, rel=0.02) -> bool:
    return abs(a - b) <= 3.0 * np.hypot(sa, sb) + rel * abs(b)


def _check(router, n, rate, seeds, per_replica):
    m1, s1 = _means(1, rate, router, seeds, per_replica)
    mn, sn = _means(n, rate, router, seeds, per_replica)
    got = dict(zip(METRICS + ("per_replica_rps",), zip(mn, sn, m1, s1)))
    for name in ("tpot", "e2e", "per_replica_rps"):
        a, sa, b, sb = got[name]
        assert _close(a, sa, b, sb), (router, name, got)
    a, sa, b, sb = got["ttft"]
    if router == "random":
        assert _close(a, sa, b, sb), got
    else:  # round robin: regular arrivals wait less for a boundary
        assert a <= b + 3.0 * np.hypot(sa, sb) and a >= 0.75 * b, got


@pytest.mark.parametrize("router", ["random", "round-robin"])
def test_n_replicas_at_n_times_the_rate_match_one(router):
    _check(router, n=4, rate=4.0, seeds=range(6), per_replica=300)


@pytest.mark.slow
@pytest.mark.parametrize("router", ["random", "round-robin"])
@pytest.mark.parametrize("rate", [2.0, 6.0])
def test_n_replicas_at_n_times_the_rate_match_one_long(router, rate):
    _check(router, n=8, rate=rate, seeds=range(16), per_replica=1000)
