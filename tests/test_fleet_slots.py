"""Per-replica request slots (engine/slots.py): the compiled routed loop's engines keep their
requests in arrays of their own and give the table-indexed engines' results, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from servesim import scenario_from_dict
from servesim.engine import slots as SL
from servesim.simulate import build, run_built
from tests.conftest import BASE, merge
from tests.test_fleet_scale import LOADED


def _run(raw: dict, compiled: bool, given: list):
    b = build(scenario_from_dict(raw))
    b.replica.compiled_loop = compiled
    res = run_built(b)
    given.append(b.replica)
    return res, b


@pytest.mark.parametrize("margin", [SL.MARGIN, -95], ids=["share", "growing"])
@pytest.mark.parametrize("extra", [{}, {"stop": {"requests": None, "duration_s": 0.8}},
                                   {"engine": {"max_num_seqs": 4}}], ids=["drain", "duration", "queued"])
def test_slots_equal_the_table_ids(monkeypatch, margin, extra):
    """Slots (compiled loop) against the Python loop (request ids): the same requests frame,
    summary and request table -- with slots that start tiny and double many times (``growing``),
    a duration stop (requests routed after the loop, through ``Engine.route_in``; waits still
    open at the end closed through the renamed queues) and queues that fill."""
    monkeypatch.setattr(SL, "MARGIN", margin)
    gave = []
    real = SL.give_fleet
    monkeypatch.setattr(SL, "give_fleet", lambda f: gave.append(real(f)) or gave[-1])
    raw = merge(merge(BASE, LOADED), merge({"cluster": {"router": "least-tokens"}}, extra))
    fleets: list = []
    (fast, bf), (slow, bs) = _run(raw, True, fleets), _run(raw, False, fleets)
    assert gave == [True]
    assert len(fast.requests) >= 300
    assert fast.requests.equals(slow.requests)
    assert {k: v for k, v in fast.summary.items() if k != "wall_s"} == \
        {k: v for k, v in slow.summary.items() if k != "wall_s"}
    for col in ("computed", "num_output", "t_first_sched", "t_first_token", "t_finish", "t_last_token",
                "preemptions", "status", "reject_reason", "blocked"):
        assert np.array_equal(getattr(bf.table, col), getattr(bs.table, col), equal_nan=True), col
    assert all(e.slots is None for e in bf.replica.engines)  # (scattered at the finish)


def test_slots_not_given_with_a_warmup_request():
    """An engine compares its pulls with the warm-up request's id: no slots then."""
    raw = merge(merge(BASE, LOADED), {"cluster": {"router": "least-tokens"}, "stop": {"warmup_requests": 40}})
    b = build(scenario_from_dict(raw))
    assert b.replica._loop_compiles()
    assert not SL.applies(b.replica)
