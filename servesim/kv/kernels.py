"""KV allocators without prefix caching (paged, elastic, static) as kernels over one state.

Every rule of the three count/extent allocators is written once here, as plain functions over a
:class:`KVState` (see :mod:`servesim.jit`: compiled with numba, or run as Python by ``pure``).
The engine core calls the ``kv_*`` kernels directly on the state (the KV factory returns it);
tests drive the same kernels through thin Python faces (tests/kv_faces.py).

The state, its constants and constructors are in :mod:`servesim.kv.pool`; the static allocator's
hole kernels in :mod:`servesim.kv.extents`. Both are re-exported here.

A prefix cache whose requests have no chains (``kv.counted``, kv/pcache.py) takes the paged
rules here: nothing is ever cached there, so block ids cannot matter.

Calling conventions: ``computed`` is the request table's int32 column; ``ids`` an int64 array
of which the first ``nb`` entries count (unique ids); ``used`` an int64 array of at least
``k_max`` entries. Kernels return codes instead of raising: :func:`check_message` turns a
:func:`kv_check` code into today's AssertionError text.

Decode runs: during a run each scheduled request gains one token slot per step. A holding that
grows by ``chunk`` blocks whenever the slot count ``s`` passes ``threshold + m * period``
(paged: 0, block_size, 1; elastic: base*bs, growth*bs, growth) needs its next chunk at one
*first crossing* step and every ``period`` steps after it, so the demand of a whole run is a
histogram of first crossings repeated with a stride: O(nb + k), not O(nb * k).
"""

from __future__ import annotations

import numpy as np

from servesim.jit import kernel
from servesim.kv.pcache import px_allocate, px_counted_free, px_counted_hold, px_free, px_grow, px_step_usage
from servesim.kv.pcheck import check_text, px_check
from servesim.kv.runs import _first_step, _repeat_every, blocks_for, run_demand_into, slots_per_step  # noqa: F401 (re-exported)

# the pool state and the static holes live in their own modules; every name stays importable here
from servesim.kv.extents import (extent_alloc, extent_largest, extent_release, extent_unusable,  # noqa: F401
                                 extents_check)
from servesim.kv.pool import (BAD_EXTENTS, BEST, COUNTS, ELASTIC, EXTENTS_SUM, FIRST, FITS, KINDS,  # noqa: F401
                              NEGATIVE, OK, OVERLAP, PAGED, PAST_RESERVATION, PSCALARS, RELEASE_FULL,
                              RELEASE_OVERLAP, SCALARS, STATIC, STATIC_COUNTS, UNDER_RESERVATION, KVState,
                              KVStateRef, KVStateType, compiled_kv, copy_kv, held_drop, held_of, held_put,
                              held_slot, make_kv, make_kv_ref, scalars)


# ------------------------------------------------------------------------------ block counts
@kernel
def kv_blocks_needed(kv, slots):
    """Blocks a paged or elastic request holding ``slots`` token slots holds (0 for 0): paged
    ``ceil(slots / bs)``; elastic the base reservation grown in chunks of ``growth`` blocks."""
    if kv.kind == ELASTIC:
        return _elastic_hold_pos(kv, slots) if slots > 0 else 0
    return blocks_for(slots, kv.block_size)


@kernel
def _elastic_hold_pos(kv, slots):
    """Elastic holding of a positive slot count (the decode path, which has no zero case)."""
    bs = kv.block_size
    over = slots - kv.base * bs
    if over < 0:
        over = 0
    return kv.base + kv.growth * blocks_for(over, kv.growth * bs)


@kernel
def kv_free_blocks(kv):
    return kv.s[0].free


@kernel
def kv_used_blocks(kv):
    return kv.num_blocks - kv.s[0].free


@kernel
def kv_max_slots(kv):
    """The most token slots one request can ever hold (the engine rejects longer requests).

    paged: the whole pool; elastic: the longest sequence whose grown reservation fits (0 if not
    even the base does); static: a request is admissible when its reservation fits the empty
    pool, so the pool minus one slot, or 0 when no request's reservation fits."""
    if kv.kind == PAGED:
        return kv.num_blocks * kv.block_size
    if kv.kind == ELASTIC:
        if kv.num_blocks < kv.base:
            return 0
        return (kv.base + (kv.num_blocks - kv.base) // kv.growth * kv.growth) * kv.block_size
    for i in range(len(kv.reserve)):
        if kv.reserve[i] <= kv.num_blocks:
            return kv.num_blocks * kv.block_size - 1
    return 0


# ---------------------------------------------------------------------------- allocation
@kernel(inline=True)
def kv_allocate(kv, computed, rid, n):
    """Room for ``n`` more tokens of request ``rid`` on top of ``computed[rid]``; False if the
    pool cannot provide it (then only static's ``next_need``/``failed`` change).

    paged/elastic: take the blocks the new slot count needs beyond those held. static: the first
    allocation reserves the request's whole extent; later ones only check it fits."""
    if kv.prefix and not kv.counted:
        return px_allocate(kv, computed, rid, n)
    slots = int(computed[rid]) + n
    if kv.kind == STATIC:
        return _static_allocate(kv, rid, slots)
    need = kv_blocks_needed(kv, slots) - held_of(kv, rid)
    if need <= 0:
        return True
    if need > kv.s[0].free:
        return False
    if kv.counted:
        px_counted_hold(kv, computed, rid)
    kv.held[held_put(kv, rid)] += need
    kv.s[0].free -= need
    return True


@kernel
def _static_allocate(kv, rid, slots):
    s = kv.s[0]
    held = held_of(kv, rid)
    if held == 0:
        n = int(kv.reserve[rid])
        s.next_need = n
        if n > kv.num_blocks or slots > n * kv.block_size:
            return False
        start = extent_alloc(kv.hole_start, kv.hole_len, kv.s, kv.fit, n)
        if start < 0:
            s.failed += 1  # enough free blocks maybe, but no hole: external fragmentation
            return False
        i = held_put(kv, rid)
        kv.start[i] = start
        kv.held[i] = n
        held = n
    return slots <= held * kv.block_size


@kernel
def kv_allocate_decodes(kv, computed, ids, nb):
    """One more token for each of ``ids[:nb]``, all or nothing.

    paged: the blocks ``ceil((c + 1) / bs)`` beyond those held, summed (a request holding more
    than that counts negatively, as the vectorized rule always did). elastic: the positive part of
    each request's growth. static: decodes write into the reservation, so only check it fits."""
    if nb == 0:
        return True
    if kv.prefix and not kv.counted:
        return px_grow(kv, computed, ids, nb, 1, False)
    bs = kv.block_size
    held = kv.held
    if kv.kind == STATIC:
        for i in range(nb):
            r = ids[i]
            if int(computed[r]) + 1 > held_of(kv, r) * bs:
                return False
        return True
    if kv.kind == PAGED:
        total = 0
        for i in range(nb):
            r = ids[i]
            total += blocks_for(int(computed[r]) + 1, bs) - held_of(kv, r)
        if total > kv.s[0].free:
            return False
        if total != 0:
            for i in range(nb):
                r = ids[i]
                want = blocks_for(int(computed[r]) + 1, bs)
                if want > held_of(kv, r):
                    held[held_put(kv, r)] = want
            kv.s[0].free -= total
        return True
    top = 0
    total = 0
    for i in range(nb):
        r = ids[i]
        need = _elastic_hold_pos(kv, int(computed[r]) + 1) - held_of(kv, r)
        if i == 0 or need > top:
            top = need
        if need > 0:
            total += need
    if top <= 0:
        return True
    if total > kv.s[0].free:
        return False
    for i in range(nb):
        r = ids[i]
        need = _elastic_hold_pos(kv, int(computed[r]) + 1) - held_of(kv, r)
        if need > 0:
            held[held_put(kv, r)] += need
    kv.s[0].free -= total
    return True


@kernel
def kv_free(kv, rid):
    """Request ``rid`` finished or was preempted: release its blocks. Returns 0, or (static) an
    extent_release code when its reservation overlaps a free hole (a corrupted state; then
    nothing changes). Callers that trust the state may ignore it."""
    if kv.prefix and not kv.counted:
        px_free(kv, kv.computed, rid)
        return 0
    if kv.counted:
        px_counted_free(kv, rid)
    i = held_slot(kv, rid)
    if i < 0:
        return 0
    if kv.kind == STATIC:
        n = int(kv.held[i])
        if n == 0:
            return 0
        code = extent_release(kv.hole_start, kv.hole_len, kv.s, int(kv.start[i]), n)
        if code != 0:
            return code
        kv.start[i] = -1
        held_drop(kv, i)
        return 0
    kv.s[0].free += kv.held[i]
    held_drop(kv, i)
    return 0


# ------------------------------------------------------------------------------ decode runs
@kernel
def kv_run_used(kv, computed, ids, nb, k_max, used):
    """Blocks in use during each of ``k_max`` decode steps of ``ids[:nb]`` (paged, elastic),
    step 1 already allocated, whether or not the pool can serve them all."""
    used0 = kv.num_blocks - kv.s[0].free
    used[0] = used0
    if k_max <= 1:
        return
    bs = kv.block_size
    threshold, period, chunk = 0, bs, 1
    if kv.kind == ELASTIC:
        threshold, period, chunk = kv.base * bs, kv.growth * bs, kv.growth
    for j in range(1, k_max):
        used[j] = 0
    for i in range(nb):
        f = _first_step(int(computed[ids[i]]) + 1, threshold, period)
        if f <= k_max:
            used[f - 1] += chunk
    _repeat_every(used[1:], k_max - 1, period)
    for j in range(1, k_max):
        used[j] += used[j - 1]


@kernel
def kv_decode_run(kv, computed, ids, nb, k_max, used):
    """The engine's fast path: how many consecutive decode steps ``k <= k_max`` of ``ids[:nb]``
    the pool serves (step 1 is already allocated), and ``used[j]`` = blocks in use in step j+1.

    paged/elastic: the leading steps whose blocks in use stay within the pool. static: decodes
    never allocate; a run is bounded by the smallest room left in a reservation (at least 1)."""
    used0 = kv.num_blocks - kv.s[0].free
    if kv.kind == STATIC:
        if k_max >= 1 and nb > 0:
            room = -1
            for i in range(nb):
                r = ids[i]
                left = held_of(kv, r) * kv.block_size - int(computed[r])
                if i == 0 or left < room:
                    room = left
            k_max = max(1, min(k_max, room))
        for j in range(k_max):
            used[j] = used0
        return k_max
    if k_max <= 1:
        for j in range(k_max):
            used[j] = used0
        return k_max
    kv_run_used(kv, computed, ids, nb, k_max, used)
    k = 0
    while k < k_max and used[k] <= kv.num_blocks:
        k += 1
    if kv.kind == PAGED and k == 0:
        k = 1
    return k


@kernel
def kv_commit_decodes(kv, computed, ids, nb):
    """After a decode run advanced ``computed[ids[:nb]]``, take the blocks its steps used.
    paged: each request holds exactly ``ceil(c / bs)``; elastic: grow (never shrink) to its
    reservation; static: nothing (decodes write into the reservation)."""
    if kv.kind == STATIC or nb == 0:
        return
    if kv.prefix and not kv.counted:
        px_grow(kv, computed, ids, nb, 0, True)
        return
    held = kv.held
    if kv.kind == PAGED:
        bs = kv.block_size
        extra = 0
        for i in range(nb):
            r = ids[i]
            j = held_put(kv, r)
            want = blocks_for(int(computed[r]), bs)
            extra += want - int(held[j])
            held[j] = want
        kv.s[0].free -= extra
        return
    extra = 0
    for i in range(nb):
        r = ids[i]
        need = _elastic_hold_pos(kv, int(computed[r])) - held_of(kv, r)
        if need > 0:
            held[held_put(kv, r)] += need
            extra += need
    kv.s[0].free -= extra


# ---------------------------------------------------------------------------------- metrics
@kernel
def kv_step_usage(kv, computed, holders, nh, ids, new, nb, k, used, out):
    """Token slots of the pool during each of the ``k`` steps that ``ids[:nb]`` computing
    ``new[:nb]`` tokens are about to run (after the policy's allocation, before ``computed``
    advances; ``holders[:nh]`` hold KV). ``k > 1``: a decode run (``new`` all 1) with ``used``
    from :func:`kv_decode_run`; ``used`` is ignored when ``k == 1``. Fills, for step ``j < k``::

        out[0, j]  internal slots       allocated - written - reserved-unused
        out[1, j]  reserved-unused      allocated blocks with no written slot yet, in slots
        out[2, j]  external slots       free slots in holes smaller than the next reservation
        out[3, j]  allocated slots      (only when out has >= 5 rows)
        out[4, j]  written slots        (only when out has >= 5 rows)

    See :mod:`servesim.kv.frag`. Paged blocks are mostly taken as slots are needed; a policy that
    takes a whole prompt's blocks at admission (``chunked``) holds blocks with no written slot:
    reserved unused, not internal (block_size 1: internal exactly 0). During a decode run the
    scheduled requests fill every block they take, so the reserved blocks stay as in step 1."""
    if kv.prefix:
        px_step_usage(kv, computed, ids, new, nb, k, used, out)
        return
    bs = kv.block_size
    used0 = kv.num_blocks - kv.s[0].free
    full = out.shape[0] >= 5
    if kv.kind == PAGED:
        written0 = 0
        touched = 0  # blocks holding a written slot during step 1
        for i in range(nh):
            c = int(computed[holders[i]])
            written0 += c
            touched += blocks_for(c, bs)
        for i in range(nb):
            c = int(computed[ids[i]])
            written0 += int(new[i])
            touched += blocks_for(c + int(new[i]), bs) - blocks_for(c, bs)
        reserved = (used0 - touched) * bs
        for j in range(k):
            a = (used0 if k == 1 else used[j]) * bs
            w = written0 + nb * j
            out[0, j] = a - w - reserved
            out[1, j] = reserved
            out[2, j] = 0
            if full:
                out[3, j] = a
                out[4, j] = w
        return
    written, touched = np.empty(k, dtype=np.int64), np.empty(k, dtype=np.int64)
    slots_per_step(computed, holders, nh, ids, new, nb, k, bs, written, touched)
    ext = 0
    if kv.kind == STATIC:
        ext = extent_unusable(kv.hole_len, kv.s, kv.s[0].next_need) * bs
    for j in range(k):
        if kv.kind == STATIC or k == 1:
            a = used0 * bs
        else:
            a = used[j] * bs
        w = written[j]
        reserved = a - touched[j] * bs
        out[0, j] = a - w - reserved
        out[1, j] = reserved
        out[2, j] = ext
        if full:
            out[3, j] = a
            out[4, j] = w


# ------------------------------------------------------------------------------- invariants
@kernel
def kv_check(kv, computed, holders, nh):
    """OK if the invariants hold, else the first violated one's code (:func:`check_message`):
    blocks held + free = total and no negative count; elastic: every holder holds at least its
    reservation; static: the free holes are sorted, disjoint, merged and add up to the free count,
    no holder wrote past its reservation and live reservations do not overlap. A prefix cache:
    its own invariants (kv/pcheck.py ``px_check``)."""
    if kv.prefix:
        return px_check(kv, computed)
    held_total = 0
    negative = False
    for r in range(len(kv.held)):
        held_total += int(kv.held[r])
        if kv.held[r] < 0:
            negative = True
    if kv.kind == STATIC:
        code = extents_check(kv.hole_start, kv.hole_len, kv.s, kv.num_blocks)
        if code != OK:
            return code
        if held_total + kv.s[0].free != kv.num_blocks:
            return STATIC_COUNTS
        for i in range(nh):
            h = holders[i]
            if int(computed[h]) > held_of(kv, h) * kv.block_size:
                return PAST_RESERVATION
        if nh > 1:
            starts = np.empty(nh, dtype=np.int64)
            for i in range(nh):
                j = held_slot(kv, holders[i])
                starts[i] = kv.start[j] if j >= 0 else -1
            order = np.argsort(starts)
            for i in range(nh - 1):
                a = holders[order[i]]
                if starts[order[i + 1]] < starts[order[i]] + held_of(kv, a):
                    return OVERLAP
        return OK
    if held_total + kv.s[0].free != kv.num_blocks:
        return COUNTS
    if kv.s[0].free < 0 or negative:
        return NEGATIVE
    if kv.kind == ELASTIC:
        for i in range(nh):
            h = holders[i]
            if held_of(kv, h) < kv_blocks_needed(kv, int(computed[h])):
                return UNDER_RESERVATION
    return OK


@kernel(inline=True)
def kv_slots_held(kv, rid):
    """Token slots ``rid`` holds (its blocks x ``block_size``), for the engine's check that every
    running request computes inside them (engine/kernel.py ``check_batch``); -1 where the pool's
    count is not known to say it: a prefix cache shares blocks between requests, and its lookups
    set ``computed`` to a hit before allocation places the blocks (kv/pcache.py), so a false
    alarm there is not ruled out and the check is skipped (px_check, in :func:`kv_check`, holds
    its own invariants). The Python reference managers bind their own
    (tests/reference_kv/adapters.py)."""
    if kv.prefix:
        return np.int64(-1)
    return held_of(kv, rid) * np.int64(kv.block_size)


def holes(kv) -> list[tuple[int, int]]:
    """The free holes as (start, length) pairs, of a KVState (or anything with its hole_start,
    hole_len and s fields)."""
    hs, hl = kv.hole_start, kv.hole_len
    n = max(0, min(int(kv.s[0].nholes), len(hs)))
    return [(int(a), int(b)) for a, b in zip(hs[:n], hl[:n])]


def check_message(kv: KVState, code: int) -> str:
    """The AssertionError text of a :func:`kv_check` code (or an extents_check code)."""
    text = check_text(code)
    if text is not None:
        return text
    if code == BAD_EXTENTS:
        return f"bad free extent list {holes(kv)}"
    if code == EXTENTS_SUM:
        return "free extents do not add up to the free count"
    if code == COUNTS:
        held_total = int(kv.held.astype(np.int64).sum())
        return f"KV invariant violated: held {held_total} + free {int(kv.s[0].free)} != total {kv.num_blocks}"
    return {
        NEGATIVE: "KV invariant violated: negative block count",
        UNDER_RESERVATION: "KV invariant violated: a sequence holds less than its reservation",
        STATIC_COUNTS: "KV invariant violated: reserved + free != total",
        PAST_RESERVATION: "KV invariant violated: a request wrote past its reservation",
        OVERLAP: "KV invariant violated: overlapping reservations",
    }.get(code, f"KV invariant violated: unknown check code {code}")
