"""Batch rules: how a policy combines running work and admissions into one iteration.

:func:`schedule` is called at every iteration boundary. It fills the batch (``b_ids``/``b_new``:
request ``b_ids[i]`` computes ``b_new[i]`` tokens), may admit, preempt and allocate KV, and says
per SLA class what blocks a waiting request of that class (``cause_next``). It also says whether
the batch is a pure decode batch the policy would repeat if nothing happened (``b_stable``: the
engine then fast-forwards it), when its decision may change without an event (``b_horizon``),
and how many decode steps a multi-step burst runs (``b_steps``).

The batch rules (``EngineCfg.batch_rule``):

``RUNNING_FIRST`` (vLLM; Halo's priority policy)
    running requests first, oldest first (decodes, and the rest of a chunked prompt), then
    admissions in queue order while slots, budget and KV allow; nobody is admitted in an
    iteration that preempted (unless the preemption emptied everything: vLLM's next, empty step
    would admit). With the CLASSES discipline a blocked head of class ``g`` may evict lower
    classes (``make_room``).
``STALL_FREE`` / ``HYBRID`` (Sarathi-Serve, SGLang mixed chunks; hybrid-only ablation)
    decodes first, then prefill chunks (running partial prefills, then admissions) within
    ``chunk`` tokens including the decodes (stall-free), or within the whole budget with whole
    prompts only (hybrid).
``PREFILL_FIRST`` / ``CHUNK_ONLY`` (SGLang's default; chunked-prefills-only ablation)
    an iteration is prefill chunks or decodes, never both; prefill first whenever it can, or
    alternating with decodes while both have work.
``STATIC`` (Spark: request-level batches)
    when idle, take up to ``batch_cap`` FIFO requests whose reservations fit; prefill them
    (``micro`` at a time); decode them together until every member has finished.

The policies' prose, timelines and knobs: docs/schedulers.md.
"""

from __future__ import annotations

import numpy as np

from servesim.jit import kernel
from servesim.kv.kernels import kv_allocate_decodes, kv_free_blocks
from servesim.request import RUNNING

from servesim.sched.parts import (
    ASIDE_HEAD,
    NO_BUDGET,
    NO_KV,
    NO_SLOTS,
    admit_head,
    admit_one,
    allocate_or_preempt,
    batch_add,
    begin_batch,
    blocks_of,
    decode_pass,
    fetch_horizon,
    has_need,
    partial_prefills,
    running_one_by_one,
    running_pass,
)
from servesim.sched.reserve import begin_reserve, ratio_after_decode
from servesim.sched.queues import (
    QUEUED,
    aging_horizon,
    head,
    n_queued,
    num_waiting,
    q_pop_front,
    q_push_back,
    q_push_front,
    q_take,
)
from servesim.sched.state import (
    B_CHUNK_ONLY,
    B_HYBRID,
    B_PREFILL_FIRST,
    B_RUNNING_FIRST,
    B_STALL_FREE,
    B_STATIC,
    C_BUDGET,
    C_HIGHER,
    C_ITERATION,
    C_KV,
    C_SLOTS,
    C_STATIC,
    MEMBERS,
    NO,
    Q_CLASSES,
    YES,
    need_of,
    uniform_cause,
    work_left,
)


TRACK_BUDGET = np.int64(-1)  # admit_waiting: the cap is whatever the budget allows
MEMBERS_Q = np.int64(MEMBERS)

@kernel(inline=True)
def cause_of(code):
    if code == NO_SLOTS:
        return C_SLOTS
    if code == NO_BUDGET:
        return C_BUDGET
    return C_KV


@kernel
def blocked_causes(cfg, st, g, e, cause):
    """Per class: the blocked head's class gets its cause; every other class with waiting
    requests is behind it (higher_class); a class with nobody waiting would be considered before
    the head if it ranks higher (iteration), else behind it (higher_class)."""
    if cfg.queue != Q_CLASSES:
        uniform_cause(st, cause)
        return
    for k in range(st.cause_next.shape[0]):
        if k == g:
            st.cause_next[k] = cause
        elif st.q_len[k] > 0 or k >= e:
            st.cause_next[k] = C_HIGHER
        else:
            st.cause_next[k] = C_ITERATION


@kernel
def admit_waiting(cfg, st, kv, now, cap, hybrid):
    """Admit queue heads while they fit, at most ``cap`` tokens (``cap < 0``: whatever the token
    budget allows, refunds from preemptions during admission included); sets ``cause_next`` to
    why the queue stopped. Returns whether anyone was admitted."""
    admitted = False
    cut = False
    track = cap < 0
    if not track and st.s.budget < cap:
        cap = st.s.budget
    while n_queued(st) > 0:
        rid, q, e = head(cfg, st, now)
        if cut:  # the pass's tokens went to the prompt it cut; a refund from a victim it evicted
            r = NO_BUDGET  # for that prompt's KV does not admit another (one partial prompt a pass)
        else:
            w0 = work_left(st, rid)
            r = admit_head(cfg, st, kv, rid, q, now, st.s.budget if track else cap, hybrid)
            st.s.q_work += work_left(st, rid) - w0  # (its lookup set its computed while it waits)
        if r < 0:
            blocked_causes(cfg, st, q, e, cause_of(r))
            return admitted
        q_take(st, q, rid)
        if r == ASIDE_HEAD:  # its KV is on the way from a lower tier
            continue
        if cfg.queue == Q_CLASSES:
            st.rank[rid] = e  # it keeps the rank it was admitted with while it runs
        admit_one(cfg, st, rid, r, now)
        cap -= r
        admitted = True
        cut = r < need_of(st, rid)
    uniform_cause(st, C_ITERATION)
    return admitted


@kernel
def end_batch(cfg, st, decode_only, now):
    """Set the batch's flags: pure decode (the fast path may repeat it), horizon, burst."""
    pure = decode_only and st.s.b_len > 0
    horizon = np.inf
    if cfg.aging_s > 0.0 and n_queued(st) > 0:
        h = aging_horizon(cfg, st, now)
        if h < horizon:
            horizon = h
    if st.s.n_fetching:
        h = fetch_horizon(st)
        if h < horizon:
            horizon = h
    st.s.b_horizon = horizon
    st.s.b_pure = 1 if pure else 0
    st.s.b_stable = 1 if pure else 0
    st.s.b_steps = cfg.steps if pure else 1


@kernel(inline=True)
def preempted_stop(st):
    """No admissions after a preemption while anything is scheduled or running."""
    return st.s.preempted and (st.s.b_len > 0 or st.s.run_len > 0)


@kernel
def schedule_running_first(cfg, st, kv, now):
    all_decode = running_pass(cfg, st, kv, now)
    admitted = False
    if preempted_stop(st):
        uniform_cause(st, C_KV if num_waiting(st) else C_ITERATION)
    else:
        admitted = admit_waiting(cfg, st, kv, now, TRACK_BUDGET, NO)
    end_batch(cfg, st, all_decode and not admitted and not st.s.preempted, now)


@kernel
def prefill_chunks(cfg, st, kv, now, cap, hybrid, mixed):
    """Prefill tokens, at most ``cap``: running partial prefills first, then admissions.
    Returns whether anyone was admitted; sets ``cause_next``."""
    cap = cap if cap < st.s.budget else st.s.budget
    if cfg.sglang_admission:
        begin_reserve(cfg, st, mixed)
    if st.s.run_len and cap > 0:
        cap = partial_prefills(cfg, st, kv, cap, now)
    if preempted_stop(st) or (cfg.sglang_admission and st.s.latch):  # (SGLang's batch_is_full latch)
        uniform_cause(st, C_KV if num_waiting(st) else C_ITERATION)
        return False
    return admit_waiting(cfg, st, kv, now, cap, hybrid)


@kernel
def schedule_chunked(cfg, st, kv, now):
    if cfg.sglang_admission and st.s.run_len == 0 and num_waiting(st) == 0:
        st.s.ratio = cfg.ratio_init  # idle: the new-token ratio starts over
    decode_round = schedule_chunk_batch(cfg, st, kv, now)
    if cfg.sglang_admission:
        if decode_round and st.s.b_len:  # a decode batch was formed
            ratio_after_decode(cfg, st, st.s.preempted != 0)
        if n_queued(st) > 0 and not st.s.latch:
            # the reservation shrinks as outputs grow and the ratio decays: a waiting request may
            # fit after any decode step, without an event -- no fast-forwarding past it
            st.s.b_stable = 0


@kernel
def decode_steps_done(cfg, st, k):
    """A fast-path run advanced ``k`` decode steps on one scheduling decision: the per-step policy
    state the skipped boundaries would have updated (SGLang's ratio decays once per decode batch)."""
    if cfg.sglang_admission:
        for _ in range(k - 1):
            ratio_after_decode(cfg, st, NO)


@kernel
def schedule_chunk_batch(cfg, st, kv, now):
    """The chunked batch rules; returns whether the batch is a decode round (no prefill work)."""
    rule = cfg.batch_rule
    if rule == B_STALL_FREE or rule == B_HYBRID:
        decode_pass(cfg, st, kv, now)
        decoded = st.s.b_len
        used = cfg.budget - st.s.budget
        cap = (cfg.chunk if rule == B_STALL_FREE else cfg.budget) - used
        prefill_chunks(cfg, st, kv, now, cap, rule == B_HYBRID, YES)
        end_batch(cfg, st, st.s.b_len == decoded and not st.s.preempted, now)
        return st.s.b_len == decoded
    # prefill_first / chunk_only: prefill and decode iterations never mix
    if rule == B_CHUNK_ONLY and st.s.last_prefill and has_need(st, True):
        decode_pass(cfg, st, kv, now)
        if st.s.b_len:  # (unless every decode was preempted: then a prefill iteration after all)
            st.s.last_prefill = 0
            uniform_cause(st, C_BUDGET if (num_waiting(st) or has_need(st, False)) else C_ITERATION)
            end_batch(cfg, st, not st.s.preempted, now)
            st.s.b_stable = 0  # the next iteration is a prefill turn
            return True
    prefill_chunks(cfg, st, kv, now, cfg.chunk, NO, NO)
    if st.s.b_len:
        st.s.last_prefill = 1
        end_batch(cfg, st, NO, now)
        return False
    st.s.last_prefill = 0
    decode_pass(cfg, st, kv, now)
    if st.s.b_len == 0 and st.s.preempted and num_waiting(st):
        # every decode was retracted: their KV is back, so a prefill iteration after all (an
        # empty batch with nothing running would wait for an event that may never come)
        prefill_chunks(cfg, st, kv, now, cfg.chunk, NO, NO)
        if st.s.b_len:
            st.s.last_prefill = 1
            end_batch(cfg, st, NO, now)
            return False
    end_batch(cfg, st, not st.s.preempted, now)
    return True


@kernel
def form_static_batch(cfg, st, kv):
    """The engine is idle: take up to ``batch_cap`` FIFO requests whose reservations
    (``prompt + output - 1`` slots) fit the pool."""
    free = kv_free_blocks(kv)
    reserved = 0
    while st.q_len[0] > 0 and st.q_len[MEMBERS] < cfg.batch_cap:
        rid = st.q_head[0]
        blocks = blocks_of(cfg, np.int64(st.prompt[rid]) + np.int64(st.output[rid]) - 1)
        if reserved + blocks > free:
            break
        q_push_back(st, MEMBERS, q_pop_front(st, 0))
        reserved += blocks


@kernel
def static_prefill(cfg, st, kv, now):
    """One prefill iteration of a static batch: unfinished prompts of running members first, then
    new members, at most ``micro`` requests and the token budget."""
    count = 0
    run_len = st.s.run_len
    for i in range(run_len):
        st.tmp_ids[i] = st.run[i]
    for i in range(run_len):
        rid = st.tmp_ids[i]
        nd = need_of(st, rid)
        if nd <= 1 or count >= cfg.micro or st.s.budget <= 0 or st.status[rid] != RUNNING:
            continue
        n = nd if nd < st.s.budget else st.s.budget
        if allocate_or_preempt(cfg, st, kv, rid, n, now):
            batch_add(st, rid, n)
            st.s.budget -= n
            count += 1
    while st.q_len[MEMBERS] > 0 and count < cfg.micro and st.s.budget > 0:
        rid = st.q_head[MEMBERS]
        w0 = work_left(st, rid)
        r = admit_head(cfg, st, kv, rid, MEMBERS_Q, now, st.s.budget, NO)
        st.s.q_work += work_left(st, rid) - w0  # (its lookup set its computed while it waits)
        if r == ASIDE_HEAD:
            q_pop_front(st, MEMBERS)
            continue
        if r == NO_KV:
            # the allocator reserves more than the formation's estimate (e.g. static
            # max_model_len extents): the batch ends here, the rest return to the queue, in order
            while st.q_len[MEMBERS] > 0:
                last = st.q_tail[MEMBERS]
                q_take(st, MEMBERS, last)
                q_push_front(st, 0, last)
            break
        if r < 0:
            break
        q_pop_front(st, MEMBERS)
        admit_one(cfg, st, rid, r, now)
        count += 1


@kernel
def schedule_static(cfg, st, kv, now):
    if st.s.run_len == 0 and st.q_len[MEMBERS] == 0 and st.s.n_fetching == 0:
        form_static_batch(cfg, st, kv)
    prefilled = st.s.run_len > 0
    for i in range(st.s.run_len):
        if need_of(st, st.run[i]) != 1:
            prefilled = False
    if st.q_len[MEMBERS] > 0 or (st.s.run_len > 0 and not prefilled):
        static_prefill(cfg, st, kv, now)
    if st.s.b_len == 0 and prefilled:
        # decode phase: every member has its first token; all decode together
        uniform_cause(st, C_STATIC)
        if kv_allocate_decodes(kv, st.computed, st.run, st.s.run_len):
            for i in range(st.s.run_len):
                batch_add(st, st.run[i], 1)
            end_batch(cfg, st, YES, now)
            return
        # an allocator that grows in steps of its own ran short: preempt the newest member
        running_one_by_one(cfg, st, kv, now)
        end_batch(cfg, st, NO, now)
        return
    busy = st.s.b_len > 0 or st.s.n_fetching > 0
    uniform_cause(st, C_STATIC if busy else C_ITERATION)
    end_batch(cfg, st, NO, now)


@kernel
def schedule(cfg, st, kv, now):
    """The policy: fill the next iteration's batch (see the module docstring)."""
    begin_batch(cfg, st, now)
    rule = cfg.batch_rule
    if rule == B_RUNNING_FIRST:
        schedule_running_first(cfg, st, kv, now)
    elif rule == B_STATIC:
        schedule_static(cfg, st, kv, now)
    else:
        schedule_chunked(cfg, st, kv, now)
