"""Deliberately broken policy parts, KV managers and engine kernels: each breaks one named
invariant (servesim/testing/invariants.py), and tests/test_invariants_fail.py shows the checker
naming it. Written the way a user writes parts (servesim/sched/custom.py): Python functions with
the signature of the kernel they replace, on a policy class named by import path
(``engine.scheduler: tests.broken_parts:LifoHead``), or kernels bound with ``kernel_overrides``.

Each part is a small, plausible bug: a queue that loses or duplicates an entry, a silent
cancellation, a leaking or over-granting allocator, an admission that ignores the budget or the
batch cap, a negative step time, a request scheduled before it arrives, a finish stamped early, a
LIFO or a too-fast-aging queue discipline, a fragmentation count beyond the pool, a decision that
depends on how the engine stepped, a global RNG.
"""

from __future__ import annotations

import numpy as np

from servesim.engine import kernel as K
from servesim.jit import pure
from servesim.kv import kernels as kvk
from servesim.perf import kernels as pk
from servesim.request import REJECTED, Reject
from servesim.sched import parts, policies, queues
from servesim.sched.state import need_of as _need_of

schedule = pure(policies.schedule)  # the built-in batch rule, uncompiled (compiled KV state)
admit_head = pure(parts.admit_head)
admit_one = pure(parts.admit_one)
kv_allocate = pure(kvk.kv_allocate)
q_take = pure(queues.q_take)
q_push_back = pure(queues.q_push_back)
need_of = pure(_need_of)


class Faithful:
    """The built-in vllm batch rule bound as a user part: what the broken ones start from."""

    base = "vllm"
    parts = {"schedule": schedule}


# --------------------------------------------------------------------- requests_conserved
def drop_newest_waiting(cfg, st, kv, now):
    """schedule, then unlink the newest waiting request from its queue: it waits forever, in
    no queue (a list-splicing bug)."""
    schedule(cfg, st, kv, now)
    if st.q_len[0] > 1:
        q_take(st, 0, st.q_tail[0])


def requeue_a_running_request(cfg, st, kv, now):
    """schedule, then put the oldest running request back in the waiting queue while it keeps
    running (a preemption that forgot to take it out of the running set)."""
    schedule(cfg, st, kv, now)
    if st.s.run_len > 1 and st.q_len[0] == 0:
        q_push_back(st, 0, st.run[0])


class LosesRequests:
    base = "vllm"
    parts = {"schedule": drop_newest_waiting}


class DuplicatesRequests:
    base = "vllm"
    parts = {"schedule": requeue_a_running_request}


# --------------------------------------------------------------------- arrivals_accounted
def cancel_silently(cfg, st, kv, now):
    """schedule, then cancel the newest waiting request by marking it rejected itself, without
    telling the engine (which counts ended requests and drives closed loops)."""
    schedule(cfg, st, kv, now)
    if st.q_len[0] > 2:
        rid = st.q_tail[0]
        q_take(st, 0, rid)
        st.status[rid] = REJECTED
        st.reject[rid] = Reject.KV_CAPACITY
        st.t_finish[rid] = st.arrival[rid]


class CancelsSilently:
    base = "vllm"
    parts = {"schedule": cancel_silently}


# ---------------------------------------------------------------- KV: conserved, capacity
def leaky_free(kv, rid):
    """kv_free that forgets to return the blocks to the free count."""
    kv.held[rid] = 0
    return 0


def grant_without_blocks(kv, computed, rid, n):
    """kv_allocate that says yes without taking any block."""
    return True


def broken_demote_loses():
    """kv/ptiers.py's ``tier_demote`` that drops every other block sent down without storing or
    counting it (the block counts as sent)."""
    import numpy as np

    from servesim.jit import pure
    from servesim.kv.ptiers import tier_demote

    inner = pure(tier_demote)
    calls = [0]

    def demote(kv, hs, n):
        for h in hs[:n]:
            calls[0] += 1
            if calls[0] % 2 == 0:
                kv.ps[0].demoted += 1
                continue
            inner(kv, np.array([h]), 1)

    return demote


def broken_demote_never_evicts():
    """A ``tier_demote`` whose first tier stores every block and never evicts (no capacity check)."""
    from servesim.kv.ptiers import INSERTED, REFRESHED

    def demote(kv, hs, n):
        for h in hs[:n]:
            kv.ps[0].demoted += 1
            if kv.t_in[0, h]:
                kv.t_stat[0, REFRESHED] += 1
                continue
            kv.t_in[0, h] = True
            kv.t_size[0] += 1
            kv.t_stat[0, INSERTED] += 1

    return demote


# ------------------------------------------------------------------------- batch_limits
_admit_head = admit_head


def admit_ignoring_budget(cfg, st, kv, rid, g, now, cap, hybrid):
    """admit_head told the whole budget is always left."""
    return _admit_head(cfg, st, kv, rid, g, now, np.int64(1 << 30), hybrid)


class IgnoresBudget:
    base = "vllm"
    parts = {"admit_head": admit_ignoring_budget}


def admit_past_the_cap(cfg, st, kv, now):
    """schedule, then admit one more waiting request when the batch is full."""
    schedule(cfg, st, kv, now)
    if st.s.run_len >= cfg.max_seqs and st.q_len[0] > 0 and st.s.budget > 0:
        rid = st.q_head[0]
        n = min(int(st.prompt[rid]), int(st.s.budget))
        if kv_allocate(kv, st.computed, rid, n):
            q_take(st, 0, rid)
            admit_one(cfg, st, rid, n, now)
            st.s.b_pure = 0
            st.s.b_stable = 0


class IgnoresBatchCap:
    base = "vllm"
    parts = {"schedule": admit_past_the_cap}


def admit_without_kv(cfg, st, kv, now):
    """schedule, then admit the waiting head the built-in left waiting while a batch slot and
    budget remain (for want of KV), without allocating it any block: a policy that reads a
    full pool as room."""
    schedule(cfg, st, kv, now)
    if 0 < st.s.run_len < cfg.max_seqs and st.q_len[0] > 0 and st.s.budget > 0:
        rid = st.q_head[0]
        n = min(int(need_of(st, rid)), int(st.s.budget))
        if n > 0:
            q_take(st, 0, rid)
            admit_one(cfg, st, rid, n, now)
            st.s.b_pure = 0
            st.s.b_stable = 0


class AdmitsPastThePool:
    base = "vllm"
    parts = {"schedule": admit_without_kv}


# ------------------------------------------------------------- a compiled kernel called raw
def admit_head_calling_the_kernel(cfg, st, kv, rid, queue, now, cap, hybrid):
    """Calls the built-in compiled kernel itself, not ``servesim.jit.pure`` of it: numba cannot
    type the Python state it is handed (docs/testing.md, "Calling a built-in part")."""
    return parts.admit_head(cfg, st, kv, rid, queue, now, cap, hybrid)


class CallsTheKernel:
    base = "vllm"
    parts = {"admit_head": admit_head_calling_the_kernel}


# ------------------------------------------------------------------------ time_monotone
def negative_step(tab, new, ctx, nb):
    """A step-time model that returns a negative time for a batch of two or more."""
    return -0.001 if nb > 1 else 0.01


# ---------------------------------------------------------------------------- causality
def schedule_the_future(cfg, st, kv, now):
    """schedule, then pull the next request that has not arrived yet into the batch."""
    schedule(cfg, st, kv, now)
    c = st.s.cursor
    if c < cfg.n and st.arrival[c] > now and st.s.run_len < cfg.max_seqs and st.s.budget >= st.prompt[c]:
        if kv_allocate(kv, st.computed, c, int(st.prompt[c])):
            st.s.cursor = c + 1
            st.s.arrived += 1
            st.status[c] = 1  # WAITING, then admitted
            admit_one(cfg, st, c, int(st.prompt[c]), now)
            st.s.b_pure = 0
            st.s.b_stable = 0


class SchedulesTheFuture:
    base = "vllm"
    parts = {"schedule": schedule_the_future}


_finish = pure(K.finish)


def finish_stamped_at_admission(cfg, st, kv, done, nd):
    """The engine's finish, stamping the finish time with the admission time."""
    _finish(cfg, st, kv, done, nd)
    for i in range(nd):
        st.t_finish[done[i]] = st.t_sched[done[i]]


# ------------------------------------------------------------------ fifo, priority_order
def lifo_head(cfg, st, now):
    """The newest waiting request first (a stack instead of a queue)."""
    if st.q_len[0] == 0:
        return np.int64(-1), np.int64(0), np.int64(0)
    rid = st.q_tail[0]
    return rid, np.int64(0), np.int64(st.klass[rid])


class LifoHead:
    base = "vllm"
    parts = {"head": lifo_head}


def aging_head(speedup: float):
    """The priority policy's queue discipline with aging ``speedup`` times faster than
    engine.options.aging_s says (1.0: the documented rule, rewritten by hand)."""

    def head(cfg, st, now):
        best, best_q, best_e, best_a = -1, 0, 0, 0.0
        aging = cfg.aging_s / speedup
        for q in range(queues.QUEUED):
            if st.q_len[q] == 0:
                continue
            rid = int(st.q_head[q])
            g = int(st.klass[rid])
            e = g if aging <= 0.0 or g == 0 else max(0, g - int((now - st.arrival[rid]) // aging))
            a = float(st.arrival[rid])
            if best < 0 or e < best_e or (e == best_e and (a < best_a or (a == best_a and rid < best))):
                best, best_q, best_e, best_a = rid, q, e, a
        return np.int64(best), np.int64(best_q), np.int64(best_e)

    return head


class DocumentedAging:
    base = "priority"
    parts = {"head": aging_head(1.0)}


class AgingTooFast:
    base = "priority"
    parts = {"head": aging_head(2.0)}


def oldest_head_any_class(cfg, st, now):
    """FCFS across every class queue: the oldest head first, classes ignored."""
    best, best_q = -1, 0
    for q in range(queues.QUEUED):
        if st.q_len[q] and (best < 0 or st.arrival[st.q_head[q]] < st.arrival[best]):
            best, best_q = int(st.q_head[q]), q
    return np.int64(best), np.int64(best_q), np.int64(st.klass[best] if best >= 0 else 0)


class IgnoresClasses:
    base = "priority"
    parts = {"head": oldest_head_any_class}


# ------------------------------------------------------------------ fragmentation_bounded
_step_usage = pure(kvk.kv_step_usage)


def waste_beyond_the_pool(kv, computed, holders, nh, ids, new, nb, k, used, out):
    """kv_step_usage that counts internal waste twice the pool."""
    _step_usage(kv, computed, holders, nh, ids, new, nb, k, used, out)
    out[0, :k] += 2 * kv.num_blocks * kv.block_size


# ------------------------------------------------------------------------ fast_path_exact
def admit_on_every_third_segment(cfg, st, kv, now):
    """Admissions only when the engine's segment counter is a multiple of 3, yet the batch
    still says it is stable: the decision depends on how the engine stepped (a decode run is
    one segment, single stepping many), not on the state of the requests."""
    if st.s.segments % 3 != 0 and st.s.run_len > 0:
        head, tail, n = st.q_head[0], st.q_tail[0], st.q_len[0]
        st.q_head[0], st.q_tail[0], st.q_len[0] = -1, -1, 0
        schedule(cfg, st, kv, now)
        if n and st.q_len[0]:  # requests preempted meanwhile went to the front: keep them there
            st.q_next[st.q_tail[0]] = head
            st.q_tail[0] = tail
            st.q_len[0] += n
        elif n:
            st.q_head[0], st.q_tail[0], st.q_len[0] = head, tail, n
        if n:
            st.cause_next[:] = 7  # (waiting for the iteration boundary)
        return
    schedule(cfg, st, kv, now)


class SteppingDependent:
    base = "vllm"
    parts = {"schedule": admit_on_every_third_segment}


# ---------------------------------------------------------------- compiled_equals_reference
_decode_seconds = pure(pk.decode_seconds)


def decode_one_ulp_slower(tab, num_seqs, context_sum, steps, out):
    """The decode step time, one part in 10^12 slower (a numba/Python disagreement)."""
    _decode_seconds(tab, num_seqs, context_sum, steps, out)
    out[:steps] *= 1.0 + 1e-12


# --------------------------------------------------------------------------- reproducible
def random_waiting_head(cfg, st, now):
    """Any waiting request, picked with numpy's global RNG (never seeded by servesim)."""
    n = int(st.q_len[0])
    if n == 0:
        return np.int64(-1), np.int64(0), np.int64(0)
    rid = int(st.q_head[0])
    for _ in range(int(np.random.randint(n))):
        rid = int(st.q_next[rid])
    return np.int64(rid), np.int64(0), np.int64(st.klass[rid])


class GlobalRandomHead:
    base = "vllm"
    parts = {"head": random_waiting_head}


# --------------------------------------------------------------------- worker_independent
def hash_spread_head(cfg, st, now):
    """The waiting request whose id hashes lowest as a string: a spread meant to be
    deterministic, but Python salts string hashes per process (PYTHONHASHSEED), so another
    worker process picks differently -- while two runs in one process agree."""
    best, best_key = -1, 0
    rid = int(st.q_head[0])
    while rid >= 0:
        key = hash(str(rid))
        if best < 0 or key < best_key:
            best, best_key = rid, key
        rid = int(st.q_next[rid])
    return np.int64(best), np.int64(0), np.int64(st.klass[best] if best >= 0 else 0)


class HashSpreadHead:
    base = "vllm"
    parts = {"head": hash_spread_head}
