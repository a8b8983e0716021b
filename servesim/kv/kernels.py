"""KV allocators without prefix caching (paged, elastic, static) as kernels over one state.

Every rule of the three count/extent allocators is written once here, as plain functions over a
:class:`KVState` (see :mod:`servesim.jit`: compiled with numba, or run as Python by ``pure``).
The engine core calls the ``kv_*`` kernels directly on the state (the KV factory returns it);
tests drive the same kernels through thin Python faces (tests/kv_faces.py).

State (one record per pool, one row per request)::

    kind, block_size, num_blocks       PAGED / ELASTIC / STATIC; pool geometry
    base, growth                       elastic: blocks reserved at start, added per growth step
    fit                                static: FIRST or BEST fit placement of reservations
    s[0].free                          blocks an allocation could take now
    s[0].next_need, s[0].failed        static: size of the latest reservation attempt (external
                                       fragmentation is measured against it); attempts that found
                                       no hole large enough
    s[0].nholes                        static: free holes, as hole_start/hole_len[:nholes]
    held[rid]                          blocks request ``rid`` holds (or reserved, static)
    start[rid], reserve[rid]           static: first block of its reservation (-1: none), blocks
                                       it reserves on admission (length 0 for other kinds)

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

from typing import NamedTuple

import numpy as np

from servesim.jit import bisect_left, kernel, struct_ref
from servesim.kv.pcache import check_text, px_allocate, px_check, px_free, px_grow, px_step_usage
from servesim.kv.runs import _first_step, _repeat_every, run_demand_into, slots_per_step  # noqa: F401 (re-exported)

PAGED, ELASTIC, STATIC = 0, 1, 2
KINDS = {"paged": PAGED, "elastic": ELASTIC, "static": STATIC}
FIRST, BEST = 0, 1
FITS = {"first": FIRST, "best": BEST}

# kv_check codes (check_message gives the text)
OK = 0
BAD_EXTENTS = 1  # a free hole is empty, out of order, touching the previous one, or past the pool
EXTENTS_SUM = 2  # hole lengths do not add up to the free count
COUNTS = 3  # held + free != total (paged, elastic)
NEGATIVE = 4  # a negative block count
UNDER_RESERVATION = 5  # elastic: a sequence holds less than its reservation
STATIC_COUNTS = 6  # static: reserved + free != total
PAST_RESERVATION = 7  # static: a request wrote past its reservation
OVERLAP = 8  # static: two live reservations overlap
# extent_release codes
RELEASE_OVERLAP = 1  # the released extent overlaps a free hole
RELEASE_FULL = 2  # no room for another hole (cannot happen with make_kv's capacity)

# Mutable scalars: a one-element array whose items are np.record (attribute syntax in Python as in
# numba). Kernels take the array and use ``kv.s[0].free``: passing an array from Python costs a
# fraction of passing a record (numba types a record argument on its slow path).
SCALARS = np.dtype((np.record, np.dtype([("free", np.int64), ("next_need", np.int64), ("failed", np.int64),
                                         ("nholes", np.int64)], align=True)))


PSCALARS = np.dtype((np.record, np.dtype([
    ("evictions", np.int64), ("stale_hits", np.int64), ("watch_gen", np.int64), ("watch_t", np.float64),
    ("watch_any", np.int64), ("ev_head", np.int64), ("ev_tail", np.int64), ("hm_size", np.int64), ("dropped", np.int64), ("demoted", np.int64),
    ("n_hold", np.int64), ("evlog_n", np.int64)], align=True)))


class _NO:
    """The empty arrays of a pool without a prefix cache (never written: every prefix kernel
    runs only where ``kv.prefix``), one per type so every pool has one layout."""

    ps = np.zeros(1, dtype=PSCALARS)
    i32, i64, i8, f64, b = (np.zeros(0, dtype=t) for t in (np.int32, np.int64, np.int8, np.float64, np.bool_))
    i32_2, i64_2, f64_2, b_2 = (np.zeros((0, 0), dtype=t) for t in (np.int32, np.int64, np.float64, np.bool_))


class KVState(NamedTuple):
    """One KV pool (see the module docstring). Every field always has the same type, so the
    kernels have one compiled specialization: unused arrays are empty, not absent."""

    kind: int
    block_size: int
    num_blocks: int
    base: int
    growth: int
    fit: int
    s: np.ndarray  # mutable scalars: SCALARS[1], used as kv.s[0].free etc.
    held: np.ndarray  # int32[n]
    start: np.ndarray  # int32[n] (static) or int32[0]
    reserve: np.ndarray  # int32[n] (static) or int32[0]
    hole_start: np.ndarray  # int64[cap] (static) or int64[0]
    hole_len: np.ndarray  # int64[cap] (static) or int64[0]
    # -- the prefix cache (kv/pcache.py, kv/ptiers.py; ``prefix`` 1, kind PAGED): block ids, hashes,
    # free queues, lower tiers, hot-prefix preload. Empty (``prefix`` 0) for the other pools; the
    # layout is built by kv/pstate.py, which documents every field.
    prefix: int = 0
    evict: int = 0
    hot_min: int = 0
    hot_max: int = 0
    hot_window: float = 0.0
    block_bytes: int = 0
    ps: np.ndarray = _NO.ps
    computed: np.ndarray = _NO.i32
    prompt: np.ndarray = _NO.i32
    num_output: np.ndarray = _NO.i32
    klass: np.ndarray = _NO.i8
    off: np.ndarray = _NO.i64
    chain: np.ndarray = _NO.i32
    uniq: np.ndarray = _NO.i64
    cache_blk: np.ndarray = _NO.i32
    watch: np.ndarray = _NO.i64
    ref: np.ndarray = _NO.i32
    bhash: np.ndarray = _NO.i32
    bclass: np.ndarray = _NO.i8
    ready: np.ndarray = _NO.f64
    qnext: np.ndarray = _NO.i32
    qprev: np.ndarray = _NO.i32
    qid: np.ndarray = _NO.i8
    onext: np.ndarray = _NO.i32
    oprev: np.ndarray = _NO.i32
    qends: np.ndarray = _NO.i32_2
    qsize: np.ndarray = _NO.i64
    protect: np.ndarray = _NO.i64
    nhit: np.ndarray = _NO.i32
    reg: np.ndarray = _NO.i32
    oends: np.ndarray = _NO.i32_2
    load_ready: np.ndarray = _NO.f64
    seen: np.ndarray = _NO.b
    hit_of: np.ndarray = _NO.i32
    pend: np.ndarray = _NO.i32
    pend_blk: np.ndarray = _NO.i32
    h_arr: np.ndarray = _NO.i64
    h_pos: np.ndarray = _NO.i32
    cnt: np.ndarray = _NO.i64_2
    tier_hits: np.ndarray = _NO.i64_2
    fwait: np.ndarray = _NO.f64
    fwaits: np.ndarray = _NO.i64
    t_cap: np.ndarray = _NO.i64
    t_size: np.ndarray = _NO.i64
    t_ends: np.ndarray = _NO.i32_2
    t_next: np.ndarray = _NO.i32_2
    t_prev: np.ndarray = _NO.i32_2
    t_in: np.ndarray = _NO.b_2
    t_hits: np.ndarray = _NO.i64_2
    t_stat: np.ndarray = _NO.i64_2
    l_bw: np.ndarray = _NO.f64
    l_lat: np.ndarray = _NO.f64
    l_free: np.ndarray = _NO.f64_2
    l_cnt: np.ndarray = _NO.i64_2
    l_time: np.ndarray = _NO.f64_2
    counts: np.ndarray = _NO.i32
    ev_t: np.ndarray = _NO.f64
    ev_rid: np.ndarray = _NO.i64
    ev_len: np.ndarray = _NO.i64
    hm_next: np.ndarray = _NO.i32
    hm_prev: np.ndarray = _NO.i32
    hm_in: np.ndarray = _NO.b
    hm_ends: np.ndarray = _NO.i32_2
    evlog: np.ndarray = _NO.i64
    # links shared by every replica of a fleet (kv_tiers[i].shared_link, kv/ptiers.py): link i's
    # row in the fleet's slot array (-1: a link of its own, in l_free), the slot array and the
    # latest request time per shared row (both the same arrays in every engine), and how far a
    # fetch came before one already served (0 when the engines keep time order)
    l_sid: np.ndarray = _NO.i64
    l_sfree: np.ndarray = _NO.f64_2
    l_slast: np.ndarray = _NO.f64
    l_late: np.ndarray = _NO.f64

    @property
    def prefix_caching(self) -> bool:
        """As the KV manager contract says: whether this pool is a prefix cache."""
        return bool(self.prefix)


def scalars(free: int, next_need: int = 0) -> np.ndarray:
    """A fresh one-element array of mutable scalars (SCALARS)."""
    arr = np.zeros(1, dtype=SCALARS)
    arr[0].free = free
    arr[0].next_need = next_need
    return arr


def _name(value, names: dict, field: str) -> int:
    if isinstance(value, str):
        if value not in names:
            raise ValueError(f"{field} {value!r} is not one of {', '.join(repr(k) for k in names)}")
        return names[value]
    if int(value) not in names.values():
        raise ValueError(f"{field} {value!r} is not one of {sorted(names.values())}")
    return int(value)


def make_kv(kind, num_blocks: int, block_size: int, n_requests: int, *, base_blocks: int = 0,
            growth_blocks: int = 0, reserve_tokens: np.ndarray | None = None, fit="first") -> KVState:
    """An empty pool of ``num_blocks`` blocks of ``block_size`` token slots for ``n_requests``
    requests. ``kind``: PAGED/ELASTIC/STATIC or its name. Elastic takes ``base_blocks`` and
    ``growth_blocks``; static takes ``reserve_tokens[rid]`` (slots request ``rid`` reserves on
    admission) and ``fit`` (FIRST/BEST or "first"/"best")."""
    kind = _name(kind, KINDS, "kv kind")
    num_blocks, block_size, n = int(num_blocks), int(block_size), int(n_requests)
    if kind == ELASTIC:
        if num_blocks < 1 or block_size < 1 or base_blocks < 1 or growth_blocks < 1:
            raise ValueError(f"need num_blocks, block_size, base_blocks, growth_blocks >= 1, got "
                             f"{num_blocks}, {block_size}, {base_blocks}, {growth_blocks}")
    elif num_blocks < 1 or block_size < 1:
        raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
    if n < 0:
        raise ValueError(f"n_requests {n} must be >= 0")
    none32, none64 = np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int64)
    if kind != STATIC:
        grow = kind == ELASTIC
        return KVState(kind, block_size, num_blocks, int(base_blocks) if grow else 0,
                       int(growth_blocks) if grow else 0, FIRST, scalars(num_blocks),
                       np.zeros(n, dtype=np.int32), none32, none32, none64, none64)
    fit = _name(fit, FITS, "fit")
    if reserve_tokens is None or len(reserve_tokens) != n:
        raise ValueError(f"static KV needs reserve_tokens for each of the {n} requests")
    tokens = np.asarray(reserve_tokens, dtype=np.int64)
    if n and tokens.min() < 1:
        raise ValueError(f"reserve_tokens must be >= 1, got {int(tokens.min())}")
    reserve = (-(-tokens // block_size)).astype(np.int32)  # blocks
    fitting = reserve[reserve <= num_blocks]
    next_need = int(fitting.min()) if len(fitting) else num_blocks + 1
    cap = min(n, num_blocks) + 1  # holes are separated by live reservations (one per request)
    hole_start, hole_len = np.zeros(cap, dtype=np.int64), np.zeros(cap, dtype=np.int64)
    rec = scalars(num_blocks, next_need)
    hole_len[0] = num_blocks
    rec[0].nholes = 1
    return KVState(kind, block_size, num_blocks, 0, 0, fit, rec, np.zeros(n, dtype=np.int32),
                   np.full(n, -1, dtype=np.int32), reserve, hole_start, hole_len)


# Compiled kernels receive the pool as a numba StructRef (one reference-counted pointer), as they
# do the replica state: a NamedTuple argument costs a reference-count update of each of its six
# arrays at every kernel call that takes it, and in an iteration of chunked prefill those calls
# (one per request admitted, chunked or finished) were most of the time. Same field names, same
# kernels; the uncompiled path keeps the NamedTuple.
KVStateType, KVStateRef, make_kv_ref = struct_ref("KVStateType", "KVStateRef", list(KVState._fields), "make_kv_ref",
                                                 __name__, __file__)


def compiled_kv(kv: KVState):
    """The pool as compiled kernels take it (sharing ``kv``'s arrays)."""
    return make_kv_ref(*kv)


def copy_kv(kv: KVState) -> KVState:
    """An independent copy (arrays and scalars)."""
    return kv._replace(s=kv.s.copy(), held=kv.held.copy(), start=kv.start.copy(), reserve=kv.reserve.copy(),
                       hole_start=kv.hole_start.copy(), hole_len=kv.hole_len.copy())


# ------------------------------------------------------------------------------ block counts
@kernel
def kv_blocks_needed(kv, slots):
    """Blocks a paged or elastic request holding ``slots`` token slots holds (0 for 0): paged
    ``ceil(slots / bs)``; elastic the base reservation grown in chunks of ``growth`` blocks."""
    bs = kv.block_size
    if kv.kind == ELASTIC:
        if slots <= 0:
            return 0
        over = slots - kv.base * bs
        if over > 0:
            return kv.base + kv.growth * (-(-over // (kv.growth * bs)))
        return kv.base
    return -(-slots // bs)


@kernel
def _elastic_hold_pos(kv, slots):
    """Elastic holding of a positive slot count (the decode path, which has no zero case)."""
    bs = kv.block_size
    over = slots - kv.base * bs
    if over < 0:
        over = 0
    return kv.base + kv.growth * (-(-over // (kv.growth * bs)))


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


# ------------------------------------------------------------------------- static extents
@kernel
def extent_alloc(hole_start, hole_len, sc, fit, n):
    """Start of a new extent of ``n >= 1`` blocks taken from the free holes, or -1 when no hole
    is large enough. First fit: the lowest hole that is large enough; best fit: the smallest,
    ties to the lowest address. Holes stay sorted by start."""
    s = sc[0]
    nh = s.nholes
    i = -1
    if fit == FIRST:
        for j in range(nh):
            if hole_len[j] >= n:
                i = j
                break
    else:
        best = -1
        for j in range(nh):
            if hole_len[j] >= n and (best < 0 or hole_len[j] < best):
                best = hole_len[j]
                i = j
    if i < 0:
        return -1
    start = hole_start[i]
    if hole_len[i] == n:
        for j in range(i, nh - 1):
            hole_start[j] = hole_start[j + 1]
            hole_len[j] = hole_len[j + 1]
        s.nholes = nh - 1
    else:
        hole_start[i] += n
        hole_len[i] -= n
    s.free -= n
    return start


@kernel
def extent_release(hole_start, hole_len, sc, start, n):
    """Return ``[start, start + n)`` to the free holes, merged with adjacent ones. 0, or
    RELEASE_OVERLAP (it overlaps a free hole) / RELEASE_FULL, and then nothing changes."""
    s = sc[0]
    nh = s.nholes
    i = bisect_left(hole_start[:nh], start)
    if i > 0 and hole_start[i - 1] + hole_len[i - 1] > start:
        return RELEASE_OVERLAP
    if i < nh and start + n > hole_start[i]:
        return RELEASE_OVERLAP
    merge_left = i > 0 and hole_start[i - 1] + hole_len[i - 1] == start
    merge_right = i < nh and hole_start[i] == start + n
    if merge_left and merge_right:
        hole_len[i - 1] += n + hole_len[i]
        for j in range(i, nh - 1):
            hole_start[j] = hole_start[j + 1]
            hole_len[j] = hole_len[j + 1]
        s.nholes = nh - 1
    elif merge_left:
        hole_len[i - 1] += n
    elif merge_right:
        hole_start[i] = start
        hole_len[i] += n
    else:
        if nh == len(hole_start):
            return RELEASE_FULL
        for j in range(nh, i, -1):
            hole_start[j] = hole_start[j - 1]
            hole_len[j] = hole_len[j - 1]
        hole_start[i] = start
        hole_len[i] = n
        s.nholes = nh + 1
    s.free += n
    return 0


@kernel
def extent_unusable(hole_len, sc, n):
    """Free blocks in holes smaller than ``n``: free memory that cannot hold an ``n``-block extent."""
    s = sc[0]
    total = 0
    for j in range(s.nholes):
        if hole_len[j] < n:
            total += hole_len[j]
    return total


@kernel
def extent_largest(hole_len, sc):
    s = sc[0]
    best = 0
    for j in range(s.nholes):
        if hole_len[j] > best:
            best = hole_len[j]
    return best


@kernel
def extents_check(hole_start, hole_len, sc, size):
    """OK, or BAD_EXTENTS / EXTENTS_SUM (see the codes)."""
    s = sc[0]
    nh = s.nholes
    if nh < 0 or nh > len(hole_start):
        return BAD_EXTENTS
    prev_end = -1
    total = 0
    for j in range(nh):
        if hole_len[j] <= 0 or hole_start[j] <= prev_end or hole_start[j] + hole_len[j] > size:
            return BAD_EXTENTS
        prev_end = hole_start[j] + hole_len[j]
        total += hole_len[j]
    if total != s.free:
        return EXTENTS_SUM
    return OK


# ---------------------------------------------------------------------------- allocation
@kernel(inline=True)
def kv_allocate(kv, computed, rid, n):
    """Room for ``n`` more tokens of request ``rid`` on top of ``computed[rid]``; False if the
    pool cannot provide it (then only static's ``next_need``/``failed`` change).

    paged/elastic: take the blocks the new slot count needs beyond those held. static: the first
    allocation reserves the request's whole extent; later ones only check it fits."""
    if kv.prefix:
        return px_allocate(kv, computed, rid, n)
    slots = int(computed[rid]) + n
    if kv.kind == STATIC:
        return _static_allocate(kv, rid, slots)
    need = kv_blocks_needed(kv, slots) - int(kv.held[rid])
    if need <= 0:
        return True
    if need > kv.s[0].free:
        return False
    kv.held[rid] += need
    kv.s[0].free -= need
    return True


@kernel
def _static_allocate(kv, rid, slots):
    s = kv.s[0]
    if kv.held[rid] == 0:
        n = int(kv.reserve[rid])
        s.next_need = n
        if n > kv.num_blocks or slots > n * kv.block_size:
            return False
        start = extent_alloc(kv.hole_start, kv.hole_len, kv.s, kv.fit, n)
        if start < 0:
            s.failed += 1  # enough free blocks maybe, but no hole: external fragmentation
            return False
        kv.start[rid] = start
        kv.held[rid] = n
    return slots <= int(kv.held[rid]) * kv.block_size


@kernel
def kv_allocate_decodes(kv, computed, ids, nb):
    """One more token for each of ``ids[:nb]``, all or nothing.

    paged: the blocks ``ceil((c + 1) / bs)`` beyond those held, summed (a request holding more
    than that counts negatively, as the vectorized rule always did). elastic: the positive part of
    each request's growth. static: decodes write into the reservation, so only check it fits."""
    if nb == 0:
        return True
    if kv.prefix:
        return px_grow(kv, computed, ids, nb, 1, False)
    bs = kv.block_size
    if kv.kind == STATIC:
        for i in range(nb):
            r = ids[i]
            if int(computed[r]) + 1 > int(kv.held[r]) * bs:
                return False
        return True
    if kv.kind == PAGED:
        total = 0
        for i in range(nb):
            r = ids[i]
            total += -(-(int(computed[r]) + 1) // bs) - int(kv.held[r])
        if total > kv.s[0].free:
            return False
        if total != 0:
            for i in range(nb):
                r = ids[i]
                want = -(-(int(computed[r]) + 1) // bs)
                if want > kv.held[r]:
                    kv.held[r] = want
            kv.s[0].free -= total
        return True
    top = 0
    total = 0
    for i in range(nb):
        r = ids[i]
        need = _elastic_hold_pos(kv, int(computed[r]) + 1) - int(kv.held[r])
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
        need = _elastic_hold_pos(kv, int(computed[r]) + 1) - int(kv.held[r])
        if need > 0:
            kv.held[r] += need
    kv.s[0].free -= total
    return True


@kernel
def kv_free(kv, rid):
    """Request ``rid`` finished or was preempted: release its blocks. Returns 0, or (static) an
    extent_release code when its reservation overlaps a free hole (a corrupted state; then
    nothing changes). Callers that trust the state may ignore it."""
    if kv.prefix:
        px_free(kv, kv.computed, rid)
        return 0
    if kv.kind == STATIC:
        n = int(kv.held[rid])
        if n == 0:
            return 0
        code = extent_release(kv.hole_start, kv.hole_len, kv.s, int(kv.start[rid]), n)
        if code != 0:
            return code
        kv.held[rid] = 0
        kv.start[rid] = -1
        return 0
    kv.s[0].free += kv.held[rid]
    kv.held[rid] = 0
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
                left = int(kv.held[r]) * kv.block_size - int(computed[r])
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
    if kv.prefix:
        px_grow(kv, computed, ids, nb, 0, True)
        return
    if kv.kind == PAGED:
        bs = kv.block_size
        extra = 0
        for i in range(nb):
            r = ids[i]
            want = -(-int(computed[r]) // bs)
            extra += want - int(kv.held[r])
            kv.held[r] = want
        kv.s[0].free -= extra
        return
    extra = 0
    for i in range(nb):
        r = ids[i]
        need = _elastic_hold_pos(kv, int(computed[r])) - int(kv.held[r])
        if need > 0:
            kv.held[r] += need
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
            touched += (c + bs - 1) // bs
        for i in range(nb):
            c = int(computed[ids[i]])
            written0 += int(new[i])
            touched += (c + int(new[i]) + bs - 1) // bs - (c + bs - 1) // bs
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
    its own invariants (kv/pcache.py ``px_check``)."""
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
            if int(computed[h]) > int(kv.held[h]) * kv.block_size:
                return PAST_RESERVATION
        if nh > 1:
            starts = np.empty(nh, dtype=np.int64)
            for i in range(nh):
                starts[i] = kv.start[holders[i]]
            order = np.argsort(starts)
            for i in range(nh - 1):
                a, b = holders[order[i]], holders[order[i + 1]]
                if kv.start[b] < kv.start[a] + kv.held[a]:
                    return OVERLAP
        return OK
    if held_total + kv.s[0].free != kv.num_blocks:
        return COUNTS
    if kv.s[0].free < 0 or negative:
        return NEGATIVE
    if kv.kind == ELASTIC:
        for i in range(nh):
            h = holders[i]
            if kv.held[h] < kv_blocks_needed(kv, int(computed[h])):
                return UNDER_RESERVATION
    return OK


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
