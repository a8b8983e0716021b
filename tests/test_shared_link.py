"""A KV tier's link shared by every replica of a fleet (``kv_tiers[i].shared_link``,
kv/ptiers.py ``link_transfer``; tests/reference_kv/tiers.py in the Python reference): one contended resource. Fetches reach it in time order (the fleet loop advances an engine only up
to the next other engine's event), so its channels serve them first come first served -- as one
SimPy resource would -- and two replicas on one link wait longer than each alone, by what an
M/D/1 queue predicts."""

from __future__ import annotations

import numpy as np
import pytest

from servesim.kv import factory
from tests.reference_kv import tiers as T
from tests.reference_kv.build import build_reference
from tests.reference_kv.tiers import Channels, Link
from servesim.simulate import build, run_built
from tests.test_compiled_engine import assert_identical
from tests.test_kv_sim import SESSIONS, sc


def two_turns(n: int, rate: float, replicas: int, shared: bool, bw_gb_s: float, engine=None, run_on="compiled",
              sim=None, **patch):
    """Two-turn sessions: a second turn comes back after a 20 s think, when its session's blocks
    have left the GPU pool (400 blocks), and fetches its context (6 blocks of 1 MiB) from L3."""
    return sc(SESSIONS, stop={"requests": n}, engine={"enable_prefix_caching": True, "num_gpu_blocks_override": 400,
                                                   **(engine or {})},
              workload={"arrival": {"process": "poisson", "rate": rate},
                        "sessions": {"turns": {"dist": "fixed", "value": 2}, "think_s": 20.0}},
              cluster={"groups": [{"replicas": replicas}], "router": "affinity"},
              kv_tiers=[{"kind": "remote", "capacity_gib": 8, "name": "L3", "bandwidth_gb_s": bw_gb_s,
                         "latency_s": 0.0, "shared_link": shared}], sim={"engine": run_on, **(sim or {})}, **patch)


def simulate(scenario, reference=False):
    """A run on the compiled kernels (or the Python reference manager, tests/reference_kv/prefix.py + tests/reference_kv/tiers.py,
    whose every fetch the ``fetches`` fixture sees)."""
    old = factory.OBJECT_REFERENCE
    factory.OBJECT_REFERENCE = build_reference if reference else None
    try:
        b = build(scenario)
    finally:
        factory.OBJECT_REFERENCE = old
    return run_built(b)


@pytest.fixture
def fetches(monkeypatch):
    """Every fetch of a reference run: (channels object, requested at, bytes, completed at, bw, latency)."""
    log = []
    orig = T.Link.fetch

    def fetch(self, nbytes, now):
        end = orig(self, nbytes, now)
        log.append((self.slots, now, nbytes, end, self.bw, self.latency))
        return end

    monkeypatch.setattr(T.Link, "fetch", fetch)
    return log


def fcfs(requests: np.ndarray, service: np.ndarray) -> np.ndarray:
    """Completion times of one first-come-first-served server (Lindley's recursion)."""
    free, out = 0.0, np.empty(len(requests))
    for i, (t, s) in enumerate(zip(requests, service)):
        free = max(t, free) + s
        out[i] = free
    return out


def test_links_sharing_channels_queue_behind_each_other():
    slots = Channels(1)
    a, b = Link("a", 100.0, 0.0, 1, slots), Link("b", 100.0, 0.0, 1, slots)
    assert a.fetch(100, 0.0) == 1.0
    assert b.fetch(100, 0.5) == 2.0  # waits for a's transfer under way
    assert (a.queue_s, b.queue_s, a.fetches, b.fetches) == (0.0, 0.5, 1, 1)  # counters stay per replica
    alone = Link("c", 100.0, 0.0, 1)
    assert alone.fetch(100, 0.5) == 1.5
    b.fetch(10, 0.2)  # requested before one already served: the users are not in time order
    assert b.out_of_order_s == pytest.approx(0.3)
    with pytest.raises(ValueError, match="2 channels, not 1"):
        Link("d", 1.0, 0.0, 1, Channels(2))


def test_a_shared_link_serves_every_replica_first_come_first_served(fetches):
    # queues at both replicas (2 sequences each): each admits, and fetches, at its own boundaries
    # long after arrivals -- without the time-order bound their fetches interleave out of order
    args = (400, 14.0, 2, True, 0.05)
    kw = dict(engine={"max_num_seqs": 2}, sim={"check_invariants": True})
    r = simulate(two_turns(*args, run_on="python", **kw), reference=True)
    assert len({id(x[0]) for x in fetches}) == 1 and len(fetches) > 40  # one resource for both replicas
    t = np.array([x[1] for x in fetches])
    assert np.all(np.diff(t) >= 0)  # requested in time order across the replicas
    service = np.array([x[5] + x[2] / x[4] for x in fetches])
    ends = np.array([x[3] for x in fetches])
    assert np.array_equal(ends, fcfs(t, service))  # = one FCFS server over all replicas' fetches
    l3 = r.summary["kv"]["tiers"]["L3"]
    assert l3["shared_link"] and l3["fetches"] == len(fetches)
    assert l3["queue_s"] == pytest.approx(float((ends - service - t).sum()))
    # the compiled kernels (one slot array in every engine's pool) give the same run; without the
    # fleet loop's time-order bound (Fleet.coupled) their invariant check fails (TIER_ORDER)
    assert_identical(r, simulate(two_turns(*args, **kw)))
    # replicas with links of their own: two resources, and less waiting
    fetches.clear()
    own = simulate(two_turns(400, 14.0, 2, False, 0.05, engine={"max_num_seqs": 2}, run_on="python"), reference=True)
    assert len({id(x[0]) for x in fetches}) == 2
    o3 = own.summary["kv"]["tiers"]["L3"]
    assert not o3["shared_link"]
    assert o3["queue_s"] / o3["fetches"] < l3["queue_s"] / l3["fetches"]


def _md1(log, bw):
    """(measured mean wait, M/D/1 prediction) for the fetches of one run, per link."""
    a = np.array([(x[1], x[2], x[3]) for x in log])
    links = len({id(x[0]) for x in log})
    s = a[:, 1] / (bw * 1e9)
    assert np.ptp(s) == 0  # deterministic service: every fetch moves the same 6 blocks
    lam = len(a) / np.ptp(a[:, 0]) / links
    rho = lam * s[0]
    return float((a[:, 2] - a[:, 0] - s).mean()), rho * s[0] / (2 * (1 - rho)), rho


@pytest.mark.slow
def test_two_replicas_on_one_link_wait_as_md1_predicts(fetches):
    """Second turns reach L3 at (nearly) Poisson times, each moving 6 MiB at 0.1 GB/s (63 ms):
    alone, a replica's link runs at rho ~0.25; shared by two, ~0.5. M/D/1's mean wait
    rho S / (2 (1 - rho)) predicts each (measured: 10.7 vs 10.3 ms alone, 33.2 vs 30.4 ms shared);
    tolerance 25 % (the fetches start at iteration boundaries, several at once at times)."""
    simulate(two_turns(2000, 4.0, 1, False, 0.1, run_on="python"), reference=True)
    alone, alone_pred, rho1 = _md1(fetches, 0.1)
    fetches.clear()
    simulate(two_turns(4000, 8.0, 2, True, 0.1, run_on="python"), reference=True)
    shared, shared_pred, rho2 = _md1(fetches, 0.1)
    assert 0.2 < rho1 < 0.3 and 0.4 < rho2 < 0.6
    assert alone == pytest.approx(alone_pred, rel=0.25)
    assert shared == pytest.approx(shared_pred, rel=0.25)
    assert shared > 2 * alone  # M/D/1: 2.95x
