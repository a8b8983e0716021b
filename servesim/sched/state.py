"""Replica state as named arrays: what the engine kernel and the policy parts share.

Everything one replica knows lives in a :class:`ReplicaState` -- a NamedTuple of numpy arrays --
plus :class:`Scalars` (one record of mutable scalars, ``st.s``) and :class:`EngineCfg` (frozen
scalars: the policy's parts and knobs). Kernels (``servesim.jit``) read and write these in place,
compiled or as plain Python, so one source serves both engines::

    per request (row = request id)   arrival prompt output klass computed num_output
                                      t_sched t_first t_finish t_last preempt status reject
                                      blocked[8] swapped rank q_next [fetch_at fetch_need]
    queues                            q_head/q_tail/q_len[6]: classes P0..P4 (FIFO uses 0),
                                      MEMBERS (a static batch being formed)
    running set, batch                run[cap] (admission order), b_ids/b_new[cap]
    blockage clocks                   K[class, cause], cause_now[class], cause_next[class]
    inbox                             cursor over the open-loop rows (by time), a heap of sent
                                      closed-loop rows; per closed-loop group its next row --
                                      or, in a fleet (``cfg.routed``), the rows a router sent
                                      here, a FIFO linked through ``in_next`` (engine/cluster.py)
    recorder buffers                  one row per executed step; ITL (value, weight) pairs

Blockage clocks: every waiting second of a request has exactly one cause. At each iteration
boundary the policy names, per SLA class, what blocks a waiting request of that class; the
engine integrates this into cumulative clocks ``K[class, cause]``. A request of class ``g`` that
waits from ``a`` to ``b`` was blocked ``K[g, c](b) - K[g, c](a)`` seconds by cause ``c``: O(classes)
per iteration instead of O(waiting), and the causes sum to the wait by construction. The row
stores ``-K(a)`` on arrival and adds ``K(b)`` on admission. Waits after a preemption are charged to
``PREEMPTED``; a request waiting for its KV from a lower tier has a clock of its own
(``suspend_wait`` / ``resume_wait``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from servesim.jit import kernel
from servesim.request import NUM_CAUSES, NUM_CLASSES, RUNNING, WAITING, Cause

MEMBERS = NUM_CLASSES  # the queue of a static batch being formed
NUM_QUEUES = NUM_CLASSES + 1
MAX_RUN_STEPS = 1 << 14  # bound on one fast-path run (the size of its per-step scratch arrays)
STEP_BUFFER = 1 << 15  # recorder rows kept before a flush (> MAX_RUN_STEPS: room for a whole run)
NUM_SIGNALS = 8  # recorder signals (servesim.metrics.collect.BinnedSeries.SIGNALS)

C_KV, C_BUDGET, C_SLOTS = int(Cause.KV_BLOCKS), int(Cause.TOKEN_BUDGET), int(Cause.BATCH_SLOTS)
C_HIGHER, C_STATIC, C_TIER = int(Cause.HIGHER_CLASS), int(Cause.STATIC_BATCH), int(Cause.TIER_TRANSFER)
C_PREEMPTED, C_ITERATION = int(Cause.PREEMPTED), int(Cause.ITERATION)

# policy parts (EngineCfg codes); the four built-in policies are compositions (sched/policies.py)
Q_FIFO, Q_CLASSES = 0, 1  # queue discipline
B_RUNNING_FIRST, B_STALL_FREE, B_HYBRID, B_PREFILL_FIRST, B_CHUNK_ONLY, B_STATIC = range(6)  # batch rule
V_NEWEST, V_LOWEST_CLASS, V_RETRACT = 0, 1, 2  # victim rule

# Typed constants for kernel calls: a literal argument (``f(x, 1)``, ``f(x, False)``) makes numba
# compile a specialization of ``f`` for that literal, on top of the int64/bool one.
ONE, ZERO = np.int64(1), np.int64(0)
YES, NO = np.bool_(True), np.bool_(False)

# A request preempted this many times ends the run with E_LIVELOCK (engine/driver.py says why):
# no configuration that makes progress comes near it (a preemption recomputes or swaps the whole
# request), and the request table counts preemptions in int16.
MAX_PREEMPTIONS = 10_000
E_LIVELOCK = 9  # (engine/kernel_checks.py numbers the other engine errors, 1-8)

SCALARS = np.dtype([
    ("now", "f8"),          # the replica's clock: the current iteration boundary
    ("clock_t", "f8"),      # blockage clocks settled up to here
    ("itl_from", "f8"),     # inter-token gaps of steps ending before this are warm-up
    ("cpu_s", "f8"),        # engine CPU overhead inside busy time
    ("extra_s", "f8"),      # policy time (swaps) inside busy time
    ("run_len", "i8"),      # running requests
    ("ended", "i8"),        # finished + rejected
    ("budget", "i8"),       # token budget left in the batch being formed
    ("extra", "f8"),        # swap seconds of the batch being formed
    ("preempted", "i8"),    # the batch being formed preempted someone
    ("swap_used", "i8"),    # token slots parked in host memory
    ("swap_outs", "i8"),    # preemptions by swap since the driver last looked (the rest recompute)
    ("last_prefill", "i8"),  # chunk_only: the previous iteration was a prefill iteration
    ("n_fetching", "i8"),   # requests waiting for KV from a lower tier
    ("cursor", "i8"),       # open loop: next arrival row
    ("arrived", "i8"),      # requests arrived so far (the arrival cap counts them)
    ("inbox_shut", "i8"),   # the arrival cap was reached: nothing else arrives
    ("heap_len", "i8"),     # closed loop: pending arrivals
    ("in_head", "i8"),      # routed inbox (a fleet): first and last row sent here, not yet pulled
    ("in_tail", "i8"),
    ("end_head", "i8"),     # routed, report_ended: requests ended since the driver last looked
    ("end_tail", "i8"),
    ("wake", "f8"),         # idle: when the replica next has something to do (inf: never)
    ("idle", "i8"),         # waiting with an empty batch since the last boundary (advance resumes there)
    ("rows", "i8"),         # recorder rows buffered
    ("itl_len", "i8"),      # ITL (value, weight) pairs buffered
    ("b_len", "i8"),        # batch size
    ("b_pure", "i8"),       # every request in the batch computes one token and samples one
    ("b_stable", "i8"),     # ... and the policy would repeat the batch if nothing happened
    ("b_steps", "i8"),      # multi-step burst length
    ("b_horizon", "f8"),    # the policy's decision may change at this time without an event
    ("inflight", "i8"),     # an iteration (or decode run) is under way: INFLIGHT_MIXED / _RUN
    ("t_end", "f8"),        # ... and ends then
    ("run_k", "i8"),        # ... steps of the decode run under way
    ("ratio", "f8"),        # SGLang admission: the new-token ratio (sched/reserve.py)
    ("off_total", "f8"),    # ... the prefill pass's reserved tokens, with outputs
    ("off_cur", "f8"),      # ... and without
    ("latch", "i8"),        # ... an admission failed: none until the running batch shrinks
    ("segments", "i8"),     # loop segments run (progress)
    ("error", "i8"),        # nonzero: an invariant failed (code) -- the driver raises
    ("error_arg", "i8"),
    ("hold", "f8"),         # a fleet's closed loops: plan at no boundary at or after this in the
                            # next advance call (another engine commits there first:
                            # engine/cluster.py); advance resets it to inf
    ("q_work", "i8"),       # tokens still to compute (work_left) of every request in a waiting
                            # queue (MEMBERS included) or the routed inbox: kept where a request
                            # enters or leaves one (sched/queues.py, engine/inbox.py) or its
                            # computed changes while it waits (a prefix-cache lookup, released
                            # blocks), so that the least-tokens router's read of a replica
                            # (engine/inbox.py outstanding_work) walks only its running set, not
                            # every queue (issue 30); sim.check_invariants holds it to the walk
    ("n_local", "i8"),      # per-replica request slots (engine/slots.py): the slots taken so far
    ("p_len", "i8"),        # cfg.lag: requests in p_ids (their last sampled tokens not yet delivered)
    ("held_waiting", "i8"),  # at least the waiting requests holding KV blocks from a landed tier
                             # fetch (0: none; sched/parts.py reclaim_waiting_holders keeps it)
])


class EngineCfg(NamedTuple):
    """Frozen scalars of one replica: the policy's parts and every knob the kernels read."""

    queue: int
    batch_rule: int
    victim: int
    whole_prompt_kv: bool  # admission allocates KV for the whole prompt, not the first chunk
    sglang_admission: bool  # SGLang's conservative admission (sched/reserve.py)
    ratio_init: float  # ... its new-token ratio: initial, floor, decay per decode batch
    ratio_min: float
    ratio_step: float
    chunked: bool  # prompts may be split over iterations
    max_seqs: int
    budget: int  # max_num_batched_tokens
    chunk: int  # chunk cap (chunked policy)
    steps: int  # num_scheduler_steps
    micro: int  # static: requests prefilled per iteration
    batch_cap: int  # static: requests per batch
    aging_s: float  # 0: no aging
    preempt_lower: bool
    swap: bool
    swap_capacity: int  # token slots of host swap space
    kv_bytes_per_token: int  # one token's KV on this GPU (swap transfers)
    host_bw: float  # host link bytes/s (swap transfers)
    block_size: int
    max_model_len: int
    max_slots: int  # the most token slots one request can ever hold
    fast: bool  # the fast path
    closed: bool  # closed-loop groups (clients send their next request when one ends)
    max_arrivals: int  # the arrival cap (stop.requests over several closed loops); n: none
    warmup_id: int  # -1: no warm-up
    stop_time: float
    stop_when_drained: bool  # every request has arrived: the run ends once all have ended
    cpu_c: float
    cpu_p: float
    check: bool  # invariant checks every iteration
    n: int
    routed: bool = False  # a fleet's replica: arrivals come from a router (the routed inbox)
    report_ended: bool = False  # routed: list ended requests for the driver (closed loops)
    lag: bool = False  # vLLM 0.6's asynchronous output processing: an iteration's tokens reach the
    #                    clients when the engine's next call returns (engine/delivery.py deliver_pending)


class ReplicaState(NamedTuple):
    s: object  # a Scalars record (np.record, or a Python mirror on the object path)
    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    klass: np.ndarray
    computed: np.ndarray
    num_output: np.ndarray
    t_sched: np.ndarray
    t_first: np.ndarray
    t_finish: np.ndarray
    t_last: np.ndarray
    preempt: np.ndarray
    status: np.ndarray
    reject: np.ndarray
    blocked: np.ndarray
    swapped: np.ndarray
    rank: np.ndarray
    q_next: np.ndarray
    fetch_at: np.ndarray
    fetch_need: np.ndarray
    q_head: np.ndarray
    q_tail: np.ndarray
    q_len: np.ndarray
    run: np.ndarray
    b_ids: np.ndarray
    b_new: np.ndarray
    b_ctx: np.ndarray
    tmp_ids: np.ndarray
    tmp_need: np.ndarray
    fetching: np.ndarray
    class_slots: np.ndarray
    K: np.ndarray
    cause_now: np.ndarray
    cause_next: np.ndarray
    heap_t: np.ndarray
    heap_id: np.ndarray
    think: np.ndarray
    group_of: np.ndarray
    g_next: np.ndarray
    g_hi: np.ndarray
    used: np.ndarray
    dts: np.ndarray
    ends: np.ndarray
    frag: np.ndarray
    rb_start: np.ndarray
    rb_end: np.ndarray
    rb_vals: np.ndarray
    rb_itlw: np.ndarray
    itl_v: np.ndarray
    itl_w: np.ndarray
    in_next: np.ndarray  # routed inbox / ended list links, per request (shared by a fleet)
    gid: np.ndarray  # per-replica request slots (engine/slots.py): each slot's request id; empty: none
    p_ids: np.ndarray  # cfg.lag: the requests whose tokens of the last iteration await delivery (engine/delivery.py)


# ------------------------------------------------------------------------------ transitions
@kernel(inline=True)
def clocks_into(st, rid, t, sign):
    """``blocked[rid] += sign * K[g](t)``, K read as the row plus the running stretch of its
    class's current cause (copy, bump, then add: the reference's float order)."""
    g = st.klass[rid]
    c_now = st.cause_now[g]
    for c in range(st.K.shape[1]):
        v = st.K[g, c]
        if c == c_now:
            v += t - st.s.clock_t
        st.blocked[rid, c] += sign * v


@kernel(inline=True)
def settle_clocks(st, t):
    dt = t - st.s.clock_t
    if dt > 0:
        for g in range(st.K.shape[0]):
            st.K[g, st.cause_now[g]] += dt
    st.s.clock_t = t


@kernel(inline=True)
def set_causes(st, now):
    """What blocks each class from now on is ``cause_next`` (the policy's answer)."""
    changed = False
    for g in range(st.cause_now.shape[0]):
        if st.cause_now[g] != st.cause_next[g]:
            changed = True
    if changed:
        settle_clocks(st, now)
        for g in range(st.cause_now.shape[0]):
            st.cause_now[g] = st.cause_next[g]


@kernel(inline=True)
def uniform_cause(st, cause):
    for g in range(st.cause_next.shape[0]):
        st.cause_next[g] = cause


@kernel(inline=True)
def start_waiting(st, rid):
    """A fresh arrival begins to wait (its clock starts at its arrival time)."""
    clocks_into(st, rid, st.arrival[rid], -1.0)
    st.status[rid] = WAITING


@kernel(inline=True)
def suspend_wait(st, rid, now, cause):
    """A waiting request leaves its class's shared cause for one of its own (its KV is being
    fetched from a lower tier): settle its class-clock share so far, start its own clock."""
    clocks_into(st, rid, now, 1.0)
    st.blocked[rid, cause] -= now


@kernel(inline=True)
def resume_wait(st, rid, now, cause):
    st.blocked[rid, cause] += now
    clocks_into(st, rid, now, -1.0)


@kernel(inline=True)
def run_add(st, rid):
    st.run[st.s.run_len] = rid
    st.s.run_len += 1


@kernel(inline=True)
def run_remove(st, rid):
    j = 0
    for i in range(st.s.run_len):
        if st.run[i] != rid:
            st.run[j] = st.run[i]
            j += 1
    st.s.run_len = j


@kernel(inline=True)
def mark_admitted(st, rid, now):
    """Waiting -> running. Ends the wait: settle its blocked seconds."""
    if np.isnan(st.t_sched[rid]):
        st.t_sched[rid] = now
        clocks_into(st, rid, now, 1.0)
    else:  # resumed after a preemption
        st.blocked[rid, C_PREEMPTED] += now
    st.swapped[rid] = False
    st.status[rid] = RUNNING
    run_add(st, rid)


@kernel(inline=True)
def mark_preempted(st, rid, now, swap):
    """Running -> waiting (KV already freed by the caller). By recompute: it will prefill
    everything it knows again. By swap: its computed tokens are kept (its KV is in host memory)."""
    if swap:
        st.swapped[rid] = True
    else:
        st.computed[rid] = 0
    st.preempt[rid] += 1
    if st.preempt[rid] >= MAX_PREEMPTIONS and st.s.error == 0:
        st.s.error = E_LIVELOCK
        st.s.error_arg = rid
    st.status[rid] = WAITING
    st.blocked[rid, C_PREEMPTED] -= now
    run_remove(st, rid)


@kernel(inline=True)
def known_tokens(st, rid):
    """Tokens whose ids are known (prompt + outputs so far): what a prefill must cover."""
    return np.int64(st.prompt[rid]) + np.int64(st.num_output[rid])


@kernel(inline=True)
def work_left(st, rid):
    """Tokens ``rid`` still has to compute, prefill and decode: ``prompt + output - computed`` (a
    preempted request's recomputation included). The unit of the least-tokens router's load
    (engine/inbox.py ``outstanding_work``) and of ``st.s.q_work``."""
    return np.int64(st.prompt[rid]) + np.int64(st.output[rid]) - np.int64(st.computed[rid])


@kernel(inline=True)
def need_of(st, rid):
    """Tokens ``rid`` must still compute before it samples again (1 for a decode)."""
    return np.int64(st.prompt[rid]) + np.int64(st.num_output[rid]) - np.int64(st.computed[rid])


# ---------------------------------------------------------------------------------- building
def new_scalars() -> np.recarray:
    arr = np.zeros(1, dtype=SCALARS).view(np.recarray)
    arr[0].b_horizon = np.inf
    arr[0].b_steps = 1
    arr[0].in_head = arr[0].in_tail = arr[0].end_head = arr[0].end_tail = -1
    arr[0].wake = np.inf
    arr[0].hold = np.inf
    return arr


class ScalarsMirror:
    """The scalars as a plain Python object, for the uncompiled path (attribute access on an
    ``np.record`` costs ~1 µs; here ~30 ns). :meth:`sync` writes it back to the record."""

    __slots__ = SCALARS.names

    def __init__(self, rec) -> None:
        for name in SCALARS.names:
            v = rec[name]
            setattr(self, name, float(v) if SCALARS[name].kind == "f" else int(v))

    def sync(self, rec) -> None:
        for name in SCALARS.names:
            rec[name] = getattr(self, name)


def new_state(table, *, s, run_cap: int, object_kv: bool, heap_cap: int, think: np.ndarray,
              group_of: np.ndarray, g_next: np.ndarray, g_hi: np.ndarray,
              class_slots: np.ndarray, itl_cap: int = 1 << 14, run_steps: int = MAX_RUN_STEPS,
              step_buffer: int = STEP_BUFFER, shared: "RequestArrays | None" = None) -> ReplicaState:
    """Arrays for a replica over request ``table`` (servesim.request.RequestTable): its columns
    are shared, not copied, so results land in the table the metrics read. ``shared``: the
    per-request working arrays of a fleet (every request lives in one replica, so the replicas
    of a fleet share them instead of holding one each)."""
    n = table.n
    fetch_n = n if object_kv else 0
    cap = run_cap + 1
    per = shared if shared is not None else request_arrays(n, object_kv, routed=False)
    return ReplicaState(
        s=s,
        arrival=table.arrival, prompt=table.prompt, output=table.output, klass=table.klass,
        computed=table.computed, num_output=table.num_output, t_sched=table.t_first_sched,
        t_first=table.t_first_token, t_finish=table.t_finish, t_last=table.t_last_token,
        preempt=table.preemptions, status=table.status, reject=table.reject_reason, blocked=table.blocked,
        swapped=per.swapped, rank=per.rank, q_next=per.q_next,
        fetch_at=per.fetch_at, fetch_need=per.fetch_need,
        q_head=np.full(NUM_QUEUES, -1, dtype=np.int64), q_tail=np.full(NUM_QUEUES, -1, dtype=np.int64),
        q_len=np.zeros(NUM_QUEUES, dtype=np.int64),
        run=np.zeros(cap, dtype=np.int64), b_ids=np.zeros(cap, dtype=np.int64),
        b_new=np.zeros(cap, dtype=np.int64), b_ctx=np.zeros(cap, dtype=np.int64),
        tmp_ids=np.zeros(cap, dtype=np.int64), tmp_need=np.zeros(cap, dtype=np.int64),
        fetching=np.zeros(fetch_n, dtype=np.int64),
        class_slots=np.asarray(class_slots, dtype=np.int64),  # per queue (MEMBERS last)
        K=np.zeros((NUM_CLASSES, NUM_CAUSES)), cause_now=np.full(NUM_CLASSES, C_ITERATION, dtype=np.int64),
        cause_next=np.full(NUM_CLASSES, C_ITERATION, dtype=np.int64),
        heap_t=np.zeros(max(heap_cap, 1)), heap_id=np.zeros(max(heap_cap, 1), dtype=np.int64),
        think=np.asarray(think, dtype=np.float64), group_of=np.asarray(group_of, dtype=np.int16),
        g_next=np.asarray(g_next, dtype=np.int64), g_hi=np.asarray(g_hi, dtype=np.int64),
        used=np.zeros(run_steps + 1, dtype=np.int64), dts=np.zeros(run_steps + 1),
        ends=np.zeros(run_steps + 1), frag=np.zeros((3, run_steps + 1)),
        rb_start=np.zeros(step_buffer), rb_end=np.zeros(step_buffer),
        rb_vals=np.zeros((NUM_SIGNALS, step_buffer)), rb_itlw=np.zeros(step_buffer, dtype=np.int64),
        itl_v=np.zeros(itl_cap + 2 * cap), itl_w=np.zeros(itl_cap + 2 * cap, dtype=np.int64),
        in_next=per.in_next, gid=np.zeros(0, dtype=np.int64), p_ids=np.zeros(cap, dtype=np.int64),
    )


class RequestArrays(NamedTuple):
    """A replica's per-request working arrays (beyond the request table's columns)."""

    swapped: np.ndarray
    rank: np.ndarray
    q_next: np.ndarray
    fetch_at: np.ndarray
    fetch_need: np.ndarray
    in_next: np.ndarray


def request_arrays(n: int, object_kv: bool, routed: bool) -> RequestArrays:
    """Per-request working arrays for ``n`` requests; ``routed``: with the routed-inbox links."""
    fetch_n = n if object_kv else 0
    return RequestArrays(swapped=np.zeros(n, dtype=np.bool_), rank=np.zeros(n, dtype=np.int8),
                         q_next=np.full(n, -1, dtype=np.int32), fetch_at=np.full(fetch_n, np.nan),
                         fetch_need=np.zeros(fetch_n, dtype=np.int64),
                         in_next=np.full(n if routed else 0, -1, dtype=np.int64))


# ------------------------------------------------------------------- the compiled container
# Compiled kernels receive the state as a numba StructRef -- one pointer -- rather than the
# NamedTuple, whose ~50 arrays numba would pass (and LLVM optimise) as hundreds of scalar
# arguments at every call: that made compilation take minutes. The uncompiled path keeps the
# NamedTuple (fast attribute access in Python). Same field names, same kernels.
from servesim.jit import struct_ref  # noqa: E402

ReplicaStateType, ReplicaStateRef, make_state_ref = struct_ref(
    "ReplicaStateType", "ReplicaStateRef", list(ReplicaState._fields), "make_state_ref", __name__, __file__)


def compiled_state(st: ReplicaState):
    return make_state_ref(*st)
