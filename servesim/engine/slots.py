"""Per-replica request slots: a fleet engine's requests in arrays of its own, so that a replica's
running requests are neighbours in memory.

Why: an engine call reads and writes its batch's per-request columns (``computed``, ``output``,
``num_output``, ``t_last``, ``prompt``, ``status``, ``blocked`` ...). Indexed by request id over
the fleet's one request table, a replica's running requests are ~N ids apart in an N-replica
fleet -- a cache line each, per column, cold by the engine's next call -- where a lone replica's
running requests are neighbours in id (benchmarks/RESULTS.md, issue 30). With slots a
1,024-replica fleet of 1M requests runs 6-8 % faster (same results; 2026-12-06 section there).

So the compiled routed loop (engine/fleet_loop.py) gives each engine its own per-request arrays
(the ``ReplicaState`` columns that are per request, sched/state.py) and each request routed there
the engine's next *slot*: its row in them, in the order the engine receives its requests. The
kernels are unchanged -- an engine's request ids are its slots, and ``st.gid[slot]`` the request
id in the table. A slot takes the request's inputs (arrival, prompt, output, class) when it is
routed (:func:`take_slot`); the engine's results go back into the request table when the engine
finishes (:meth:`Slots.scatter`, from ``Engine._finish``), before anything reads the table.
The engine's KV pool indexes the blocks each request holds (``held``, kv/pool.py) by slot
directly too: past ``HASH_MIN`` requests a pool keeps them in an open-addressing map keyed by
request id (a probe of ``hkeys``, then ``held``: two scattered lines a batched request), sized
for a run's request ids; with slots it is an array of the slots' length, grown with them.
Slots are not reused: an engine's slots are the requests it was sent, so they keep the order of
the request ids (the routed order is (time, id) order), and every policy that compares ids
decides as on the table. The arrays start at the engine's share of the run plus a margin and
double when full: the loop returns (``X_GROW``) before routing there, Python copies them into
arrays twice the size (:func:`give`) and the engine's EngineRef is made again over them.

Where it applies (:func:`applies`): the compiled routed loop over compiled engines (one pointer a
call), before any request is routed, no warm-up request (an engine compares its pulls with that
request's id), no prefix cache or tier fetches (their structures are keyed by request id), no
closed loop, no static pool (its per-request reservations are indexed by request id). Results
are those of the table-indexed engines, bit for bit (tests/test_fleet_scale.py and
tests/test_fleet_slots.py compare the compiled loop with the Python loop, which keeps the
table's ids).
"""

from __future__ import annotations

import numpy as np

from servesim.engine.inbox import route_in
from servesim.jit import kernel
from servesim.kv.pool import compiled_kv

ENABLED = True  # False: engines index the request table even in the compiled loop (tests compare)

#: the per-request state columns an engine keeps in its slots, and their fill (the request
#: table's and sched/state.py request_arrays' initial values)
FILL = (("arrival", np.nan), ("prompt", 0), ("output", 0), ("klass", 0), ("computed", 0), ("num_output", 0),
        ("t_sched", np.nan), ("t_first", np.nan), ("t_finish", np.nan), ("t_last", np.nan), ("preempt", 0),
        ("status", 0), ("reject", 0), ("blocked", 0.0), ("swapped", False), ("rank", 0), ("q_next", -1),
        ("in_next", -1), ("gid", -1))
#: what the engine writes: copied into the table at its finish
RESULTS = ("computed", "num_output", "t_sched", "t_first", "t_finish", "t_last", "preempt", "status", "reject",
           "blocked")
MARGIN = 64  # slots beyond the engine's share (and an eighth of it) to start with


@kernel
def take_slot(st, rid, arrival, prompt, output, klass):
    """The engine's next slot for request ``rid`` (the table's columns given), with its inputs."""
    slot = st.s.n_local
    st.gid[slot] = rid
    st.arrival[slot] = arrival[rid]
    st.prompt[slot] = prompt[rid]
    st.output[slot] = output[rid]
    st.klass[slot] = klass[rid]
    st.s.n_local = slot + 1
    return slot


@kernel
def route_in_slot_ref(e, rid, arrival, prompt, output, klass):
    """``route_in`` of request ``rid`` at its slot (Python's routing: ``Engine.route_in``)."""
    route_in(e.conf.cfg, e.state, take_slot(e.state, rid, arrival, prompt, output, klass))


@kernel
def set_ref(refs, e, ref):
    """``refs[e] = ref`` (a fleet's typed list of EngineRefs): numba's own ``__setitem__`` from
    Python compiles at its first call in every process (0.5 s), this kernel once."""
    refs[e] = ref


def applies(fleet) -> bool:
    """Whether the fleet's engines can take slots now (the module docstring)."""
    if not ENABLED or fleet.warmup_id >= 0 or fleet.closed:
        return False
    table_arrival = fleet.table.arrival
    for eng in fleet.engines:
        st = eng.st
        if (eng.path != "compiled" or getattr(eng, "_ref", None) is None or eng.slots is not None or eng.routed
                or len(st.gid) or len(st.fetch_at) or eng.cfg.report_ended or eng.cfg.warmup_id >= 0
                or getattr(eng.kstate, "prefix", 1) or len(getattr(eng.kstate, "reserve", (0,)))
                or st.arrival is not table_arrival):
            return False
    return True


def give_fleet(fleet) -> bool:
    """Slots for every engine of ``fleet`` where :func:`applies`; True if given."""
    if not applies(fleet):
        return False
    share = -(-fleet.table.n // len(fleet.engines))
    cap = max(1, min(fleet.table.n, share + share // 8 + MARGIN))
    for e, eng in enumerate(fleet.engines):
        eng.slots = Slots(eng.st)
        give(eng, cap)
        set_ref(fleet._refs, e, eng._ref)
    return True


def give(eng, cap: int) -> None:
    """Engine ``eng``'s slot arrays at ``cap`` slots: the slots taken so far copied, the rest at
    their fill; the engine's EngineRef made again over them (``Engine._bind``)."""
    st = eng.st
    n = eng.s.get_i("n_local")
    new = {}
    for f, fill in FILL:
        old = getattr(st, f)
        a = np.full((cap,) + old.shape[1:], fill, dtype=old.dtype)
        a[:n] = old[:n]
        new[f] = a
    kv = eng.kstate  # its ``held`` by slot, directly (no request holds blocks when slots are first given)
    held = np.zeros(cap, dtype=kv.held.dtype)
    if len(kv.hkeys) == 0:
        held[:n] = kv.held[:n]
    eng.kstate = kv._replace(held=held, hkeys=np.zeros(0, dtype=kv.hkeys.dtype),
                             hstate=np.zeros(0, dtype=kv.hstate.dtype))
    if eng.kv is kv:
        eng.kv = eng.kstate
    eng.kkv = compiled_kv(eng.kstate)
    eng._bind(st._replace(**new))


def grow(eng) -> None:
    """Twice the slots (the loop's ``X_GROW``, or Python's routing to a full engine)."""
    give(eng, max(1, 2 * len(eng.st.gid)))


class Slots:
    """An engine's link to the request table while its requests live in slots."""

    def __init__(self, table_state) -> None:
        self.table = table_state  # the engine's state as built: its columns are the request table's
        self._entry = None

    def route_in(self, eng, rid: int) -> None:
        """``Engine.route_in`` of request ``rid`` (Python's routing): a slot, then ``route_in``."""
        if eng.s.get_i("n_local") >= len(eng.st.gid):
            grow(eng)
        t = self.table
        if self._entry is None:
            from servesim.engine.driver import entry_point

            self._entry = entry_point(route_in_slot_ref, eng._ref, 0, t.arrival, t.prompt, t.output, t.klass)
        self._entry(eng._ref, rid, t.arrival, t.prompt, t.output, t.klass)

    def scatter(self, eng) -> None:
        """The engine's results into the request table (every slot taken), once, when it
        finishes; Python's view of the engine (``eng.st``) then reads the table again, its queue
        links, running set, batch and routed inbox renamed to request ids -- what is read after
        the run (engine/waits.py closes the waits still open at the end by walking the queues).
        The kernels' view keeps the slots: a finished engine is not advanced again."""
        st, t = eng.st, self.table
        n = eng.s.get_i("n_local")
        ids = st.gid[:n]

        def named(x):
            out = np.full_like(x, -1)
            m = x >= 0
            out[m] = ids[x[m]]
            return out

        for f in RESULTS + ("swapped", "rank"):
            getattr(t, f)[ids] = getattr(st, f)[:n]
        t.q_next[ids] = named(st.q_next[:n])
        t.in_next[ids] = named(st.in_next[:n])
        st.q_head[:] = named(st.q_head)
        st.q_tail[:] = named(st.q_tail)
        m = eng.s.get_i("run_len")
        st.run[:m] = named(st.run[:m])
        m = eng.s.get_i("b_len")
        st.b_ids[:m] = named(st.b_ids[:m])
        for f in ("in_head", "in_tail"):
            x = eng.s.get_i(f)
            if x >= 0:
                eng.s.set_i(f, int(ids[x]))
        eng.slots = None
        eng.st = st._replace(**{f: getattr(t, f) for f, _ in FILL if f != "gid"}, gid=np.zeros(0, dtype=np.int64))
        eng.in_next = t.in_next
