"""The parts policies are built from: admission of the queue head, victims, running passes.

A scheduling policy (sched/policies.py) is a composition: a queue discipline (queues.py), an
admission rule, a victim rule and a batch rule. This module holds the shared machinery, written
once for every policy:

* :func:`admit_head` -- may the next waiting request run now, with how many tokens? One rule with
  the knobs that tell the policies apart: batch slots per class (``class_slots``; evicting lower
  classes for a slot when ``preempt_lower``), the token cap of this pass (the budget, or a chunk),
  splitting (``chunked``; whole prompts only in hybrid batching), how much KV to reserve
  (the first chunk, or the whole prompt with ``whole_prompt_kv``), a KV tier fetch under way.
* :func:`victim` -- who is preempted when running requests outgrow the pool: the newest (vLLM),
  the lowest class then newest (Halo), or SGLang's retract order.
* :func:`allocate_or_preempt`, :func:`preempt`, :func:`admit_one` -- the transitions, with swap
  accounting (``engine.preemption: swap``: KV parked in host memory over the host link; both
  transfers stall the iteration they happen in, as vLLM v0's synchronous swap does).
* :func:`running_pass`, :func:`decode_pass`, :func:`partial_prefills` -- the passes over the
  running set batch rules combine.

KV is reached only through the KV manager's kernels (kv/kernels.py): ``kv_allocate`` and friends;
on the uncompiled path they are bound to a Python KV manager (prefix caching, tiers), which is
why the prefix-reuse lookups below exist even though the compiled allocators never hit.
"""

from __future__ import annotations

import numpy as np

from servesim.jit import kernel
from servesim.kv.pcache import px_lookup, px_stable_steps
from servesim.kv.kernels import (STATIC, held_of, kv_allocate, kv_allocate_decodes, kv_blocks_needed, kv_free,
                                  kv_free_blocks)
from servesim.request import RUNNING
from servesim.sched.queues import enqueue, q_pop_front, queue_of, requeue, waiting_ids
from servesim.sched.reserve import chunk_cap, fits, take
from servesim.sched.state import (
    C_TIER,
    ONE,
    V_LOWEST_CLASS,
    V_NEWEST,
    V_RETRACT,
    known_tokens,
    mark_admitted,
    mark_preempted,
    need_of,
    resume_wait,
    suspend_wait,
)

READY, ASIDE, NO_ROOM = 1, 0, -1  # what ready() found
# admit_head: > 0 tokens admitted; ASIDE_HEAD; or why the head waits
ASIDE_HEAD, NO_SLOTS, NO_BUDGET, NO_FETCH_ROOM, NO_KV = 0, -1, -2, -3, -4


# --------------------------------------------------------------------- prefix-cache hooks
@kernel(inline=True)
def kv_prefix_lookup(kv, computed, rid, now):
    """Known tokens of ``rid`` with reusable KV (prefix cache, lower tiers) and when that KV is on
    the GPU. The count allocators cache nothing: (0, 0.0). The prefix cache (kv/pcache.py) sets
    ``computed[rid]`` to the hit and may start a tier fetch."""
    if kv.prefix:
        return px_lookup(kv, computed, rid, now)
    return np.int64(0), 0.0


@kernel(inline=True)
def kv_holds(kv, rid):
    return held_of(kv, rid) > 0


@kernel(inline=True)
def kv_held_blocks(kv, rid):
    """Blocks ``rid`` holds: what preempting it gives back to the pool."""
    return held_of(kv, rid)


@kernel(inline=True)
def kv_blocks_to_take(kv, computed, rid, n):
    """Free blocks ``kv_allocate(kv, computed, rid, n)`` takes: paged and elastic the growth of
    its holding; static its whole reservation the first time (which also needs a hole that
    large), nothing after. Lower-class preemption sizes its victims by this, so that it asks of
    every allocator what that allocator will take (make_room)."""
    if kv.kind == STATIC:
        return np.int64(kv.reserve[rid]) if held_of(kv, rid) == 0 else np.int64(0)
    need = np.int64(kv_blocks_needed(kv, np.int64(computed[rid]) + n)) - held_of(kv, rid)
    return need if need > 0 else np.int64(0)


@kernel(inline=True)
def kv_stable_steps(kv, computed, ids, nb, k):
    """Of a fast-path run's ``k`` steps, how many can run before a policy decision could change
    without an event. The count allocators: all of them. A prefix cache cuts before a step
    whose new blocks evict a block a blocked waiting request's lookup found (kv/pcache.py)."""
    if kv.prefix:
        return px_stable_steps(kv, computed, ids, nb, k)
    return k


# ---------------------------------------------------------------------------------- batch
@kernel(inline=True)
def batch_add(st, rid, n):
    i = st.s.b_len
    st.b_ids[i] = rid
    st.b_new[i] = n
    st.s.b_len = i + 1


@kernel
def batch_remove(st, rid):
    """Take ``rid`` out of the batch being formed (it was preempted after being scheduled);
    returns its tokens."""
    j = 0
    tokens = 0
    for i in range(st.s.b_len):
        if st.b_ids[i] == rid:
            tokens += st.b_new[i]
        else:
            st.b_ids[j] = st.b_ids[i]
            st.b_new[j] = st.b_new[i]
            j += 1
    st.s.b_len = j
    return tokens


@kernel
def begin_batch(cfg, st, now):
    st.s.b_len = 0
    st.s.budget = cfg.budget
    st.s.extra = 0.0
    st.s.preempted = 0
    if st.s.n_fetching:
        land_fetches(cfg, st, now)


# ------------------------------------------------------------------------ blocks and swaps
@kernel(inline=True)
def blocks_of(cfg, tokens):
    return -(-np.int64(tokens) // cfg.block_size)


@kernel(inline=True)
def block_slots(cfg, tokens):
    """Token slots in the whole blocks that hold ``tokens`` tokens (swaps move whole blocks)."""
    return blocks_of(cfg, tokens) * cfg.block_size


@kernel(inline=True)
def swap_seconds(cfg, tokens):
    """Time to move ``tokens`` tokens of KV over the host link (one direction)."""
    return tokens * cfg.kv_bytes_per_token / cfg.host_bw


# ----------------------------------------------------------------------------- transitions
@kernel
def preempt(cfg, st, kv, victim, now):
    """Evict ``victim`` (by swap when configured and host space is left, else recompute); if it
    was scheduled in the batch being formed, take it out and refund its tokens."""
    st.s.budget += batch_remove(st, victim)
    swap = False
    if cfg.swap:
        slots = block_slots(cfg, st.computed[victim])
        if st.s.swap_used + slots <= cfg.swap_capacity:
            swap = True
            st.s.swap_outs += 1
            st.s.swap_used += slots
            st.s.extra += swap_seconds(cfg, slots)
    kv_free(kv, victim)
    mark_preempted(st, victim, now, swap)
    if cfg.victim == V_RETRACT:  # SGLang: a retracted request waits at the back of the queue
        enqueue(cfg, st, victim)
    else:
        requeue(cfg, st, victim)
    st.s.preempted = 1
    st.s.latch = 0


@kernel
def admit_one(cfg, st, rid, n, now):
    """Waiting -> running with ``n`` tokens this iteration; a swapped request is swapped back in
    first (its transfer stalls this iteration)."""
    if st.swapped[rid]:
        slots = block_slots(cfg, st.computed[rid])
        st.s.extra += swap_seconds(cfg, slots)
        st.s.swap_used -= slots
        st.swapped[rid] = False
    mark_admitted(st, rid, now)
    batch_add(st, rid, n)
    st.s.budget -= n


# -------------------------------------------------------------------------------- victims
@kernel
def victim(cfg, st, rid):
    """Who is preempted when running requests run out of KV."""
    run_len = st.s.run_len
    if cfg.victim == V_NEWEST:  # vLLM: the newest running request (maybe the requester)
        return st.run[run_len - 1]
    if cfg.victim == V_LOWEST_CLASS:  # the lowest class (as admitted), newest first
        best = 0
        for i in range(run_len):
            if st.rank[st.run[i]] >= st.rank[st.run[best]]:
                best = i
        return st.run[best]
    # SGLang's retract order: fewest output tokens, then longest prompt, then newest; among
    # decoding requests when there are any
    any_decoding = False
    for i in range(run_len):
        if st.num_output[st.run[i]] > 0:
            any_decoding = True
    best = -1
    for i in range(run_len):
        r = st.run[i]
        if any_decoding and st.num_output[r] == 0:
            continue
        if best < 0:
            best = i
            continue
        b = st.run[best]
        if (st.num_output[r] < st.num_output[b] or (st.num_output[r] == st.num_output[b] and (
                st.prompt[r] > st.prompt[b] or (st.prompt[r] == st.prompt[b] and i > best)))):
            best = i
    return st.run[best]


@kernel(inline=True)
def allocate_or_preempt(cfg, st, kv, rid, n, now):
    """Allocate ``n`` tokens for running ``rid``, preempting victims while the pool is short.
    False if ``rid`` itself became the victim. Before any running request is preempted, waiting
    requests that hold blocks from a landed tier fetch give them back (their KV stays in the prefix
    cache): else a running request that cannot grow beside them is preempted, readmitted at the
    front with a first chunk that fits, and preempted again at its next chunk -- a livelock, while
    the holders never reach the head. (Inlined: it runs once per running request per
    iteration, and each kernel call that takes ``kv`` pays a reference-count update per array.)"""
    while not kv_allocate(kv, st.computed, rid, n):
        if st.s.held_waiting and reclaim_waiting_holders(cfg, st, kv, np.int64(-1)):
            continue  # blocks that waiting requests only hold come back first
        v = victim(cfg, st, rid)
        preempt(cfg, st, kv, v, now)
        if v == rid:
            return False
    return True


# ---------------------------------------------------------------------------- running passes
@kernel
def running_pass(cfg, st, kv, now):
    """Every running request gets the tokens it still needs, oldest first, within the budget
    (vLLM's running queue). The common case -- all decoding, the pool can grow them all -- is one
    all-or-nothing allocation. Returns True if the batch is decodes only."""
    run_len = st.s.run_len
    if run_len == 0:
        return True
    all_one = True
    for i in range(run_len):
        if need_of(st, st.run[i]) != 1:
            all_one = False
            break
    if run_len <= st.s.budget and all_one and kv_allocate_decodes(kv, st.computed, st.run, run_len):
        for i in range(run_len):
            batch_add(st, st.run[i], 1)
        st.s.budget -= run_len
        return True
    return running_one_by_one(cfg, st, kv, now)


@kernel
def running_one_by_one(cfg, st, kv, now):
    """The running pass when the pool is short or prefills are in flight: each request in turn,
    preempting victims as needed. ``tmp_ids``/``tmp_need`` hold the pass's snapshot."""
    run_len = st.s.run_len
    for i in range(run_len):
        r = st.run[i]
        st.tmp_ids[i] = r
        st.tmp_need[i] = need_of(st, r)
    all_decode = True
    for i in range(run_len):
        rid = st.tmp_ids[i]
        nd = st.tmp_need[i]
        if st.status[rid] != RUNNING:  # preempted earlier in this pass
            continue
        n = nd if nd < st.s.budget else st.s.budget
        if n <= 0:
            continue
        if not allocate_or_preempt(cfg, st, kv, rid, n, now):
            continue
        batch_add(st, rid, n)
        st.s.budget -= n
        if n != 1 or nd != 1:
            all_decode = False
    return all_decode


@kernel
def decode_pass(cfg, st, kv, now):
    """Every running request that needs one token gets it (oldest first, within the budget)."""
    m = 0
    for i in range(st.s.run_len):
        r = st.run[i]
        if need_of(st, r) == 1 and m < st.s.budget:
            st.tmp_ids[m] = r
            m += 1
    if m == 0:
        return
    if kv_allocate_decodes(kv, st.computed, st.tmp_ids, m):
        for i in range(m):
            batch_add(st, st.tmp_ids[i], 1)
        st.s.budget -= m
        return
    for i in range(m):
        rid = st.tmp_ids[i]
        if st.status[rid] != RUNNING:
            continue
        if allocate_or_preempt(cfg, st, kv, rid, ONE, now):
            batch_add(st, rid, 1)
            st.s.budget -= 1


@kernel(inline=True)
def has_need(st, decodes):
    """Whether a running request needs one token (``decodes``) or more (prefill work)."""
    for i in range(st.s.run_len):
        nd = need_of(st, st.run[i])
        if (nd == 1) == decodes:
            return True
    return False


@kernel
def partial_prefills(cfg, st, kv, cap, now):
    """Running requests with prompt left get chunks of it, oldest first, at most ``cap`` tokens
    in all. Returns the cap left."""
    m = 0
    for i in range(st.s.run_len):
        r = st.run[i]
        nd = need_of(st, r)
        if nd > 1:
            st.tmp_ids[m] = r
            st.tmp_need[m] = nd
            m += 1
    for i in range(m):
        if cap <= 0:
            break
        rid = st.tmp_ids[i]
        if st.status[rid] != RUNNING:
            continue
        nd = st.tmp_need[i]
        n = nd if nd < cap else cap
        if cfg.sglang_admission:  # the chunk fits what is not reserved; never preempts for it
            n = chunk_cap(cfg, st, kv, n)
            if not kv_allocate(kv, st.computed, rid, n):
                continue
            take(cfg, st, rid, n, n == nd)
        elif not allocate_or_preempt(cfg, st, kv, rid, n, now):
            continue
        batch_add(st, rid, n)
        st.s.budget -= n
        cap -= n
    return cap


# -------------------------------------------------------------------------------- admission
@kernel
def ready(cfg, st, kv, rid, now):
    """Ask the KV manager what of ``rid``'s KV is reusable. READY; or ASIDE when its KV is on
    the way from a lower tier (set aside until then, its wait charged to the transfer); or
    NO_ROOM when transfers under way have claimed the room it would need. A fetch holds blocks
    while the request waits, so one starts only while the pool can hold this request whole *and*
    the rest of every request already fetching (else fetched requests could fill the pool)."""
    if st.swapped[rid]:
        return READY  # its own KV comes back by swap-in
    known = known_tokens(st, rid)
    if st.s.n_fetching:
        claimed = blocks_of(cfg, known)
        for i in range(st.s.n_fetching):
            claimed += st.fetch_need[st.fetching[i]]
        if claimed > kv_free_blocks(kv):
            return NO_ROOM
    hit, ready_at = kv_prefix_lookup(kv, st.computed, rid, now)
    if ready_at <= now:
        return READY
    st.fetching[st.s.n_fetching] = rid
    st.s.n_fetching += 1
    st.fetch_at[rid] = ready_at
    need = blocks_of(cfg, known) - blocks_of(cfg, hit)
    st.fetch_need[rid] = need if need > 0 else 0
    if st.preempt[rid] == 0:  # a resumed request's wait is charged to its preemption
        suspend_wait(st, rid, now, C_TIER)
    return ASIDE


@kernel
def land_fetches(cfg, st, now):
    """Requests whose KV reached the GPU rejoin the front of their queue (the earliest arrival
    first)."""
    while True:  # the latest-arriving landed request first, so the earliest ends at the front
        pick = -1
        for i in range(st.s.n_fetching):
            r = st.fetching[i]
            if st.fetch_at[r] <= now:
                if pick < 0:
                    pick = i
                else:
                    p = st.fetching[pick]
                    if st.arrival[r] > st.arrival[p] or (st.arrival[r] == st.arrival[p] and r > p):
                        pick = i
        if pick < 0:
            return
        rid = st.fetching[pick]
        st.s.n_fetching -= 1
        st.fetching[pick] = st.fetching[st.s.n_fetching]
        st.fetch_at[rid] = np.nan
        st.fetch_need[rid] = 0
        if st.preempt[rid] == 0:
            resume_wait(st, rid, now, C_TIER)
        requeue(cfg, st, rid)
        st.s.held_waiting += 1  # (it waits holding the blocks its fetch filled)


@kernel(inline=True)
def fetch_horizon(st):
    t = np.inf
    for i in range(st.s.n_fetching):
        a = st.fetch_at[st.fetching[i]]
        if a < t:
            t = a
    return t


@kernel
def release_idle_holders(cfg, st, kv, head_rid):
    """Requests can wait with KV blocks in hand (a tier fetch that landed, then a preemption
    pushed an older request ahead of them). If the head cannot fit while nothing runs and nothing
    is scheduled, no block would ever be freed: release the other waiting holders' blocks (their
    KV stays in the prefix cache; they look it up again when their turn comes). True if any."""
    if st.s.run_len or st.s.b_len:
        return False  # running requests will free blocks
    return reclaim_waiting_holders(cfg, st, kv, head_rid)


@kernel
def reclaim_waiting_holders(cfg, st, kv, keep_rid):
    """Free the blocks that waiting requests hold (but ``keep_rid``'s, and those of fetches still
    under way), newest first. Their KV stays in the prefix cache, so a holder whose blocks were not
    reused finds it again when its turn comes. True if any block came back. Leaves
    ``st.s.held_waiting`` at the holders kept (landed fetches add to it), so that callers on hot
    paths walk the queues only while someone may hold blocks."""
    ids = np.empty(cfg.n, dtype=np.int64)
    m = waiting_ids(cfg, st, ids)
    released = False
    kept = 0
    for j in range(m - 1, -1, -1):  # newest first
        rid = ids[j]
        if not kv_holds(kv, rid) or st.swapped[rid] or (st.s.n_fetching and not np.isnan(st.fetch_at[rid])):
            continue
        if rid == keep_rid:
            kept += 1
            continue
        kv_free(kv, rid)
        st.s.q_work += np.int64(st.computed[rid])  # (it waits in a queue: its work grows)
        st.computed[rid] = 0
        released = True
    st.s.held_waiting = kept
    return released


@kernel(inline=True)
def lower_count(st, g):
    """Running requests of classes below ``g`` (as admitted)."""
    c = 0
    for i in range(st.s.run_len):
        if st.rank[st.run[i]] > g:
            c += 1
    return c


@kernel
def make_room(cfg, st, kv, rid, g, n, slots, now):
    """Preempt lower-class requests so that ``rid`` (class ``g``) gets ``slots`` more batch
    slots and ``n`` tokens of KV -- only if enough victims exist; then allocate. True if ``rid``
    has its slot and its KV. Victims: lowest class first, newest first."""
    if not cfg.preempt_lower:
        return False
    victims = np.empty(st.s.run_len, dtype=np.int64)
    nv = 0
    for c in range(st.K.shape[0] - 1, g, -1):
        for i in range(st.s.run_len - 1, -1, -1):
            r = st.run[i]
            if st.rank[r] == c:
                victims[nv] = r
                nv += 1
    if slots > nv:
        return False
    # the blocks the allocator will take for it against those free plus the victims' holdings
    # (a static reservation, an elastic holding: not the blocks their tokens would fill, which
    # grew with every decode step and made the decision depend on how far the victims had got)
    short = kv_blocks_to_take(kv, st.computed, rid, n) - kv_free_blocks(kv)
    chosen = slots
    for j in range(slots):
        short -= kv_held_blocks(kv, victims[j])
    for j in range(slots, nv):
        if short <= 0:
            break
        chosen += 1
        short -= kv_held_blocks(kv, victims[j])
    if short > 0:
        return False
    for j in range(chosen):
        preempt(cfg, st, kv, victims[j], now)
    return kv_allocate(kv, st.computed, rid, n)


@kernel
def admit_head(cfg, st, kv, rid, g, now, cap, hybrid):
    """Whether the queue head ``rid`` (class ``g``) runs this iteration: the tokens it computes
    (> 0, its KV allocated), ASIDE_HEAD (its KV is on the way: set aside), or why it waits
    (NO_SLOTS, NO_BUDGET, NO_FETCH_ROOM, NO_KV). ``cap``: tokens this pass may still add."""
    while True:
        over = 0  # batch slots to free for it by evicting lower classes
        if st.s.run_len >= st.class_slots[g]:
            # its class budget is full; only the hard cap (max_num_seqs) is contested by eviction,
            # so a budget below the cap stays full whatever is evicted (budgets never evict)
            over = st.s.run_len - cfg.max_seqs + 1
            if over <= 0 or st.class_slots[g] < cfg.max_seqs or not (
                    cfg.preempt_lower and lower_count(st, g) >= over):
                return NO_SLOTS
        if cap <= 0:
            return NO_BUDGET
        r = ready(cfg, st, kv, rid, now)
        if r == ASIDE:
            return ASIDE_HEAD
        if r == NO_ROOM:
            return NO_FETCH_ROOM
        whole = need_of(st, rid)
        n = whole
        if n > cap:
            if hybrid and n <= cfg.budget:
                return NO_BUDGET  # whole prompts only
            if not cfg.chunked:
                return NO_BUDGET
            n = cap
        size = whole if cfg.whole_prompt_kv else n
        if cfg.sglang_admission:  # a reservation check, then KV for this chunk only
            if fits(cfg, st, kv, rid, whole) and kv_allocate(kv, st.computed, rid, n):
                take(cfg, st, rid, n, n == whole)
                return n
            # Nothing running: nothing will free KV, so KV that waiting requests hold (fetched
            # from a lower tier) is reclaimed, as the other admissions do (below). And SGLang's
            # batch_is_full latch is set only while someone runs (its rule with the hierarchical
            # cache, scheduler.py get_new_batch_prefill): an empty batch never shrinks, so a latch
            # set then would never clear. (Both were stalls with lower tiers.)
            if st.s.run_len == 0 and release_idle_holders(cfg, st, kv, rid):
                continue
            st.s.latch = 1 if st.s.run_len > 0 else 0
            return NO_KV
        if over == 0 and kv_allocate(kv, st.computed, rid, size):
            return n
        if cfg.preempt_lower and st.s.held_waiting and reclaim_waiting_holders(cfg, st, kv, rid):
            continue  # blocks that waiting requests only hold go before lower classes' running work
        if make_room(cfg, st, kv, rid, g, size, over, now):
            return n
        if over == 0 and release_idle_holders(cfg, st, kv, rid):
            continue  # retry the head with the released blocks
        return NO_KV
