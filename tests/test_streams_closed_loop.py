"""Closed loops per stream, with ramp-up: the engine's inbox (servesim/engine/kernel.py: closed-loop
groups with their own clients, open-loop rows, the arrival cap)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from servesim.errors import ScenarioError
from servesim.request import ClosedGroup
from servesim.scenario import scenario_from_dict
from servesim.simulate import scenario_workload, simulate
from servesim.workload.streams import stream
from tests.conftest import BASE, merge, scenario

CLOSED = {"process": "closed", "clients": 4, "think_s": 0.05, "think_dist": "exponential"}


def frame_cols(res):
    df = res.requests
    return df[["arrival_s", "first_token_s", "finish_s", "status", "preemptions"]]


@pytest.mark.parametrize("extra_group", [False, True], ids=["one group", "status look-up"])
def test_stream_inbox_equals_the_engine_closed_loop(extra_group):
    """One group starting every client at 0 is exactly the engine's own closed loop, whether the
    inbox knows it is alone or looks up which group each end belongs to."""
    sc = scenario(stop={"requests": 300}, workload={"arrival": CLOSED})
    w = scenario_workload(sc)
    n = len(w)
    think = stream(sc.seed, "think").exponential(0.05, n)
    groups = [ClosedGroup(0, n, 4, np.zeros(4), think)]
    if extra_group:
        groups.append(ClosedGroup(n, n, 1, np.zeros(1), np.zeros(0)))
    mine = simulate(sc, workload=dataclasses.replace(w, closed_groups=tuple(groups)))
    ref = simulate(sc)
    pd.testing.assert_frame_equal(frame_cols(mine), frame_cols(ref))


def _in_flight_max(df: pd.DataFrame) -> int:
    """Most requests of ``df`` between arrival and end at any instant (ends before arrivals at
    the same instant: a client's next request may arrive as its last one ends)."""
    end = df["finish_s"].fillna(df["arrival_s"])  # a rejection ends at its arrival
    ev = pd.DataFrame({"t": np.concatenate([df["arrival_s"], end]),
                       "d": np.concatenate([np.ones(len(df)), -np.ones(len(df))])})
    ev = ev.sort_values(["t", "d"], kind="stable")
    return int(ev["d"].cumsum().max())


def _three_streams(requests=600, warmup=0, sim=None, **extra):
    raw = merge(BASE, {"stop": {"requests": requests, "warmup_requests": warmup},
                       "engine": {"max_num_seqs": 64}, "sim": sim or {}})
    raw["workload"] = {"streams": [
        {"name": "agents", "class": "P1", "arrival": {"process": "closed", "clients": 3, "think_s": 0.02},
         "prompt": {"dist": "fixed", "value": 32}, "output": {"dist": "fixed", "value": 8}},
        {"name": "batch", "class": "P3", "arrival": {"process": "closed", "clients": 5, "ramp_up_s": 0.5},
         "prompt": {"dist": "uniform", "min": 8, "max": 64}, "output": {"dist": "uniform", "min": 2, "max": 12}},
        {"name": "web", "class": "P0", "arrival": {"process": "poisson", "rate": 20.0},
         "prompt": {"dist": "fixed", "value": 16}, "output": {"dist": "fixed", "value": 4}},
    ], **extra}
    return scenario_from_dict(raw, "test")


def test_each_closed_stream_keeps_its_own_concurrency():
    res = simulate(_three_streams())
    df = res.requests
    arrived = df[df["arrival_s"].notna()]
    assert len(arrived) == 600  # stop.requests caps all streams together
    assert res.summary["requests"]["arrived"] == 600
    for name, clients in (("agents", 3), ("batch", 5)):
        mine = arrived[arrived["stream"] == name]
        assert _in_flight_max(mine) == clients
        assert len(mine) > 50
    # the batch clients start 0.1 s apart (ramp 0.5 s / 5 clients)
    first = df[df["stream"] == "batch"]["arrival_s"].to_numpy()[:5]
    np.testing.assert_allclose(first, [0.0, 0.1, 0.2, 0.3, 0.4])
    # rows never sent have no arrival time and are not counted as arrived
    assert df["arrival_s"].isna().sum() == len(df) - 600
    assert (df[df["arrival_s"].isna()]["status"] == "pending").all()
    assert set(res.summary["by_stream"]) == {"agents", "batch", "web"}


def test_ramp_up_in_the_single_stream_form():
    sc = scenario(stop={"requests": 200}, workload={"arrival": {**CLOSED, "clients": 8, "ramp_up_s": 0.8}})
    res = simulate(sc)
    df = res.requests
    np.testing.assert_allclose(df["arrival_s"].to_numpy()[:8], np.arange(8) * 0.1)  # rows 0..7: clients 0..7
    assert 4 < _in_flight_max(df) <= 8  # clients think between requests
    assert res.summary["requests"]["completed"] == 200


def test_warmup_needs_arrival_order():
    with pytest.raises(ScenarioError, match="stop.warmup_requests 10: with several closed-loop streams"):
        _three_streams(warmup=10)


def test_compiled_equals_python_with_closed_groups():
    """Ramped and per-stream closed loops and the arrival cap run compiled, as in Python."""
    ramped = {"stop": {"requests": 120}, "workload": {"arrival": {**CLOSED, "ramp_up_s": 1.0}}}
    for engine in ("compiled", "python"):
        assert simulate(scenario(**ramped, sim={"engine": engine})).summary["requests"]["completed"] == 120
    pd.testing.assert_frame_equal(frame_cols(simulate(scenario(**ramped, sim={"engine": "compiled"}))),
                                  frame_cols(simulate(scenario(**ramped, sim={"engine": "python"}))))
    pd.testing.assert_frame_equal(frame_cols(simulate(_three_streams(300, sim={"engine": "compiled"}))),
                                  frame_cols(simulate(_three_streams(300, sim={"engine": "python"}))))


# ------------------------------------------------------------------------ inbox properties
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402



class KernelInbox:
    """The engine's inbox kernels (uncompiled) over a bare replica state, for unit properties."""

    def __init__(self, arrival, groups, max_requests):
        from servesim.engine import kernel as K
        from servesim.jit import pure
        from servesim.sched.state import EngineCfg, new_scalars, new_state

        n = len(arrival)
        self.arrival = arrival
        table = type("T", (), {})()  # the columns new_state reads
        table.n, table.arrival = n, arrival
        for name in ("prompt", "output", "computed", "num_output"):
            setattr(table, name, np.zeros(n, dtype=np.int32))
        table.klass = np.zeros(n, dtype=np.int8)
        for name in ("t_first_sched", "t_first_token", "t_finish", "t_last_token"):
            setattr(table, name, np.full(n, np.nan))
        table.preemptions = np.zeros(n, dtype=np.int16)
        table.status = np.zeros(n, dtype=np.int8)
        table.reject_reason = np.zeros(n, dtype=np.int8)
        table.blocked = np.zeros((n, 8))
        think = np.zeros(n)
        group_of = np.full(n, -1, dtype=np.int16)
        for gi, g in enumerate(groups):
            think[g.lo:g.hi] = g.think_s
            group_of[g.lo:g.hi] = gi
        rec = new_scalars()
        self.st = new_state(table, s=rec[0], run_cap=1, object_kv=False, heap_cap=sum(g.clients for g in groups) + 1,
                            think=think, group_of=group_of, g_next=np.array([g.lo for g in groups], dtype=np.int64),
                            g_hi=np.array([g.hi for g in groups], dtype=np.int64), class_slots=np.ones(6, dtype=np.int64))
        fields = {f: 0 for f in EngineCfg._fields}
        fields.update(closed=bool(groups), max_arrivals=n if max_requests is None else max_requests, n=n,
                      stop_time=np.inf, aging_s=0.0, cpu_c=0.0, cpu_p=0.0, host_bw=1.0)
        self.cfg = EngineCfg(**fields)
        self._next, self._due, self._ended = pure(K.next_arrival), pure(K.due_arrivals), pure(K.request_ended)
        push = pure(K.heap_push)
        for gi, g in enumerate(groups):
            first = min(g.clients, g.hi - g.lo)
            for c in range(first):
                arrival[g.lo + c] = float(g.start_s[c])
                push(self.st, float(g.start_s[c]), g.lo + c)
            self.st.g_next[gi] = g.lo + first
        self.st.s.cursor = max((g.hi for g in groups), default=0)

    def next_time(self):
        return self._next(self.cfg, self.st)

    def pop_until(self, t):
        return self._due(self.cfg, self.st, t)

    def request_ended(self, rid, t):
        self._ended(self.cfg, self.st, rid, t)


@st.composite
def inbox_cases(draw):
    groups, lo = [], 0
    for _ in range(draw(st.integers(0, 3))):
        rows = draw(st.integers(1, 12))
        clients = draw(st.integers(1, 5))
        ramp = draw(st.sampled_from([0.0, 0.3]))
        think = draw(st.lists(st.sampled_from([0.0, 0.05, 0.2]), min_size=rows, max_size=rows))
        groups.append(ClosedGroup(lo, lo + rows, clients, np.arange(clients) * ramp / clients, np.array(think)))
        lo += rows
    n_open = draw(st.integers(0 if groups else 1, 10))
    open_times = np.sort(draw(st.lists(st.floats(0, 3), min_size=n_open, max_size=n_open)))
    service = draw(st.lists(st.sampled_from([0.0, 0.01, 0.1, 0.7]), min_size=lo + n_open, max_size=lo + n_open))
    cap = draw(st.one_of(st.none(), st.integers(1, lo + n_open)))
    return groups, np.concatenate([np.full(lo, np.nan), open_times]), np.array(service), cap


@settings(max_examples=150, deadline=None)
@given(inbox_cases())
def test_stream_inbox_properties(case):
    """Drive the inbox as an engine would (each request ends ``service`` after it arrives):
    every row arrives at most once, in time order ((time, id) within a pull), closed rows in their group's order, a
    group never has more requests out than clients, the cap holds, unsent rows keep no time."""
    groups, arrival, service, cap = case
    arrival = arrival.copy()
    status = np.zeros(len(arrival), dtype=np.int8)
    inbox = KernelInbox(arrival, groups, cap)
    ends: list[tuple[float, int]] = []
    arrived: list[tuple[float, int]] = []
    out = {i: 0 for i in range(len(groups))}
    group_of = {r: i for i, g in enumerate(groups) for r in range(g.lo, g.hi)}
    now = 0.0
    while True:
        t_next = min(inbox.next_time(), min(ends)[0] if ends else np.inf)
        if t_next == np.inf:
            break
        now = t_next
        while ends and min(ends)[0] <= now:  # ends first, as the engine finishes before it pulls
            t, rid = min(ends)
            ends.remove((t, rid))
            status[rid] = 3
            if rid in group_of:
                out[group_of[rid]] -= 1
            inbox.request_ended(rid, t)
        if inbox.next_time() <= now:
            ids = inbox.pop_until(now)
            got = [(float(arrival[r]), r) for r in ids.tolist()]
            assert got == sorted(got)  # one pull: (time, id) order
            for rid in ids.tolist():
                assert arrival[rid] <= now
                arrived.append((float(arrival[rid]), rid))
                ends.append((now + service[rid], rid))
                if rid in group_of:
                    out[group_of[rid]] += 1
                    assert out[group_of[rid]] <= groups[group_of[rid]].clients
    ids = [rid for _, rid in arrived]
    assert len(ids) == len(set(ids))
    times = [t for t, _ in arrived]
    assert times == sorted(times)  # a row sent during a pull at t arrives at t or later
    for g in groups if cap is None else ():  # (a cap may cancel rows already sent for later)
        mine = sorted(rid for rid in ids if g.lo <= rid < g.hi)
        assert mine == list(range(g.lo, g.lo + len(mine)))  # a group sends its rows in order
    expected = len(arrival) if cap is None else min(cap, len(arrival))
    if cap is not None:
        assert len(ids) == expected  # closed loops keep sending until the cap, open rows all come
    else:
        assert len(ids) == len(arrival)
    sent = np.zeros(len(arrival), dtype=bool)
    sent[ids] = True
    assert np.isnan(arrival[~sent]).all() and not np.isnan(arrival[sent]).any()
