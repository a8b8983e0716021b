"""Queueing theory: with one slot and a constant step, a replica is a single-server FCFS queue.

``max_num_seqs: 1``, 1-token prompts, constant step ``s``: a request occupies the server for one
iteration per output token (its prefill produces the first token). With fixed 1-token outputs the
service time is deterministic (M/D/1); with geometric outputs it is ``s`` times a geometric count
(M/G/1). The mean wait in queue is the Pollaczek-Khinchine formula
``Wq = lambda E[S^2] / (2 (1 - rho))``. We compare the mean queueing delay over independent seeds
with a tolerance of a few standard errors of that mean, never with pinned digits.
"""

from __future__ import annotations

import numpy as np
import pytest

from servesim.simulate import simulate
from tests.conftest import scenario

S = 0.01


def mean_wait(rate: float, output: dict, n: int, seeds: range) -> np.ndarray:
    sc = scenario(
        stop={"requests": n, "warmup_requests": n // 10},
        engine={"max_num_seqs": 1},
        step_time={"model": "constant", "seconds": S},
        workload={"arrival": {"process": "poisson", "rate": rate},
                  "prompt": {"dist": "fixed", "value": 1}, "output": output},
    )
    return np.array([simulate(sc, seed=s).summary["latency_s"]["queue"]["mean"] for s in seeds])


def pk_wait(rate: float, es: float, es2: float) -> float:
    rho = rate * es
    return rate * es2 / (2 * (1 - rho))


def check(waits: np.ndarray, expected: float, z: float = 4.0) -> None:
    sem = waits.std(ddof=1) / np.sqrt(len(waits))
    assert abs(waits.mean() - expected) < z * sem + 0.01 * expected, (waits.mean(), expected, sem)


def test_md1_fast():
    rate = 50.0  # rho = 0.5
    check(mean_wait(rate, {"dist": "fixed", "value": 1}, 4000, range(6)), pk_wait(rate, S, S * S))


def test_mg1_geometric_fast():
    p = 0.25  # mean 4 tokens: E[S] = 4s, E[S^2] = s^2 (2 - p) / p^2
    rate = 12.5  # rho = 0.5
    es, es2 = S / p, S * S * (2 - p) / p**2
    check(mean_wait(rate, {"dist": "geometric", "mean": 1 / p}, 4000, range(6)), pk_wait(rate, es, es2))


@pytest.mark.slow
@pytest.mark.parametrize("rho", [0.3, 0.7, 0.85])
def test_md1_load_sweep(rho):
    rate = rho / S
    check(mean_wait(rate, {"dist": "fixed", "value": 1}, 40000, range(8)), pk_wait(rate, S, S * S))


@pytest.mark.slow
@pytest.mark.parametrize("rho", [0.4, 0.8])
def test_mg1_load_sweep(rho):
    p = 0.2
    es, es2 = S / p, S * S * (2 - p) / p**2
    rate = rho / es
    check(mean_wait(rate, {"dist": "geometric", "mean": 1 / p}, 40000, range(8)), pk_wait(rate, es, es2))
