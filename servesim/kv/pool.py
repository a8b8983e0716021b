"""One KV pool's state: the :class:`KVState` every KV kernel takes (:mod:`servesim.kv.kernels`),
its constants (kinds, fits, check codes), its constructor :func:`make_kv` and the StructRef the
compiled kernels receive.

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
    hkeys, hstate                      a run of many requests (``n_requests > HASH_MIN``): held
                                       and start are indexed by a local slot, not the request id
                                       (:func:`held_slot`), see "Local slots" below

Local slots. A replica of a fleet sees its share of the run's requests, and at one time only
those holding KV; one int32 per request *of the whole run* per replica was 4.1 GB at 1,024
replicas x 1M requests (benchmarks/RESULTS.md, issue 30). Past ``HASH_MIN`` requests ``held`` and
``start`` are the values of an open-addressing map (linear probing, backward-shift deletion, no
tombstones) keyed by ``hkeys[slot] = rid + 1`` (0: empty): its capacity is a power of two >= twice
the most requests that can hold blocks at once (every holder holds >= 1 block: at most
``num_blocks``, and at most ``n_requests``), of which only the first ``hstate[0] + 1`` slots are
in use, doubled in place when half full (``hstate[1]``: entries). The arrays are anonymous
memory maps, whose pages cost memory only once written (``np.zeros`` may take heap memory that
calloc clears: 1,024 replicas paid ~150 MB for tables they barely used), so a replica pays for
the concurrency it reached. Requests
that hold nothing have no entry (their ``held`` reads 0). The values and every decision are
those of the direct arrays (tests/test_kv_slots.py).
"""

from __future__ import annotations

import mmap
import threading
from typing import NamedTuple

import numpy as np

from numba.core import cgutils, types
from numba.extending import intrinsic

from servesim.jit import kernel, struct_ref


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
    ("n_hold", np.int64), ("evlog_n", np.int64), ("tick", np.int64)], align=True)))


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
    counted: int = 0  # a prefix cache over chainless requests: paged counts (kv/pcache.py)
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
    # sglang eviction (kv/radix.py): parent hash and cached children per hash id, segment ends and
    # access stamps per block; empty under the other rules
    hpar: np.ndarray = _NO.i32
    nchild: np.ndarray = _NO.i32
    send: np.ndarray = _NO.b
    acc: np.ndarray = _NO.i64
    # links shared by every replica of a fleet (kv_tiers[i].shared_link, kv/ptiers.py): link i's
    # row in the fleet's slot array (-1: a link of its own, in l_free), the slot array and the
    # latest request time per shared row (both the same arrays in every engine), and how far a
    # fetch came before one already served (0 when the engines keep time order)
    l_sid: np.ndarray = _NO.i64
    l_sfree: np.ndarray = _NO.f64_2
    l_slast: np.ndarray = _NO.f64
    l_late: np.ndarray = _NO.f64
    # local slots (module docstring): empty for a pool indexed by request id
    hkeys: np.ndarray = _NO.i32
    hstate: np.ndarray = _NO.i64

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


HASH_MIN = 4096  # past this many requests a pool keeps held/start in local slots (tests set -1)
_HASH_MUL = 2654435761  # Knuth's multiplicative hash (odd: a permutation of rid mod any power of 2)
_HASH_START = 64  # slots in use at first


_ARENA = 64 << 20  # bytes per shared anonymous map (a map per pool: 16,384 replicas pass vm.max_map_count)
_arena: list = [None, 0]  # the current map, bytes handed out (bump allocation: never reused)
_arena_lock = threading.Lock()


def lazy_zeros(n: int, dtype=np.int32) -> np.ndarray:
    """``n`` zeros in anonymous mapped memory: a page costs memory once written, not before.
    Small arrays are page-aligned slices of one shared map, which its arrays keep alive."""
    size = -(-max(1, n * np.dtype(dtype).itemsize) // mmap.PAGESIZE) * mmap.PAGESIZE
    if size > _ARENA // 4:
        return np.frombuffer(mmap.mmap(-1, size), dtype=dtype, count=n)
    with _arena_lock:
        m, used = _arena
        if m is None or used + size > len(m):
            m, used = mmap.mmap(-1, _ARENA), 0
        _arena[0], _arena[1] = m, used + size
    return np.frombuffer(m, dtype=dtype, count=n, offset=used)


def _local_slots(n: int, num_blocks: int, local) -> tuple[np.ndarray, np.ndarray, int]:
    """(hkeys, hstate, length of held/start) of a pool for ``n`` requests: local slots when
    ``local`` (None: when ``n > HASH_MIN``), else none (empty arrays, length ``n``)."""
    if not (n > HASH_MIN if local is None else local):
        return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int64), n
    cap = 1 << max(1, 2 * max(1, min(n, num_blocks)) - 1).bit_length()
    hstate = np.array([min(cap, _HASH_START) - 1, 0], dtype=np.int64)
    return lazy_zeros(cap), hstate, cap


@kernel(inline=True)
def _home(key, m):
    """The slot a probe for ``key`` (request id + 1) starts from, in a table of ``m + 1`` slots."""
    return (np.int64(key - 1) * _HASH_MUL) & m


@kernel(inline=True)
def _probe(keys, m, key):
    """Linear probing from ``key``'s home slot (table size ``m + 1``, a power of two): the slot
    holding ``key``, else the first empty one. The one probe rule of the local-slot map: lookups,
    insertions and regrowth all walk it, so a key is always found where it was put."""
    i = _home(key, m)
    while keys[i] != key and keys[i] != 0:
        i = (i + 1) & m
    return i


@kernel(inline=True)
def held_slot(kv, rid):
    """Where ``rid``'s ``held``/``start`` live: ``rid`` itself, or its local slot (module
    docstring), -1 when it has none (it holds nothing)."""
    keys = kv.hkeys
    if len(keys) == 0:
        return np.int64(rid)
    i = _probe(keys, kv.hstate[0], rid + 1)
    return i if keys[i] != 0 else np.int64(-1)


@kernel(inline=True)
def held_of(kv, rid):
    """Blocks ``rid`` holds (or reserved, static)."""
    i = held_slot(kv, rid)
    if i < 0:
        return np.int64(0)
    return np.int64(kv.held[i])


@kernel
def _held_grow(kv):
    """Double the slots in use, entries placed again (the arrays are sized for the most)."""
    hs = kv.hstate
    old = hs[0] + 1
    keys = kv.hkeys[:old].copy()
    vals = kv.held[:old].copy()
    static = len(kv.start) > 0
    starts = kv.start[:old].copy() if static else vals
    kv.hkeys[:old] = 0
    kv.held[:old] = 0
    if static:
        kv.start[:old] = -1
    m = 2 * old - 1
    hs[0] = m
    for j in range(old):
        k = keys[j]
        if k == 0:
            continue
        i = _probe(kv.hkeys, m, k)  # (k is not yet in the cleared table: its first empty slot)
        kv.hkeys[i] = k
        kv.held[i] = vals[j]
        if static:
            kv.start[i] = starts[j]


@kernel
def held_put(kv, rid):
    """``rid``'s slot, made if it has none (the caller then writes a positive holding)."""
    keys = kv.hkeys
    if len(keys) == 0:
        return np.int64(rid)
    hs = kv.hstate
    key = rid + 1
    for _ in range(2):
        m = hs[0]
        i = _probe(keys, m, key)
        if keys[i] == key:
            return i
        if 2 * (hs[1] + 1) <= m + 1 or m + 1 >= len(keys):
            keys[i] = key
            hs[1] += 1
            return i
        _held_grow(kv)
    return np.int64(-1)  # not reached: the second pass has room


@kernel
def held_drop(kv, i):
    """Zero slot ``i``'s holding; with local slots remove its entry (backward shift: the entries
    after it in its probe run move up, so no lookup ever stops early)."""
    kv.held[i] = 0
    keys = kv.hkeys
    if len(keys) == 0:
        return
    static = len(kv.start) > 0
    hs = kv.hstate
    m = hs[0]
    keys[i] = 0
    if static:
        kv.start[i] = -1
    hs[1] -= 1
    j = i
    while True:
        j = (j + 1) & m
        k = keys[j]
        if k == 0:
            return
        h = _home(k, m)
        # the entry at j may fill the hole at i unless its home h lies cyclically in (i, j]
        if (i <= j and (h <= i or h > j)) or (i > j and h <= i and h > j):
            keys[i] = k
            kv.held[i] = kv.held[j]
            keys[j] = 0
            kv.held[j] = 0
            if static:
                kv.start[i] = kv.start[j]
                kv.start[j] = -1
            i = j


def make_kv(kind, num_blocks: int, block_size: int, n_requests: int, *, base_blocks: int = 0,
            growth_blocks: int = 0, reserve_tokens: np.ndarray | None = None, fit="first",
            local=None) -> KVState:
    """An empty pool of ``num_blocks`` blocks of ``block_size`` token slots for ``n_requests``
    requests. ``kind``: PAGED/ELASTIC/STATIC or its name. Elastic takes ``base_blocks`` and
    ``growth_blocks``; static takes ``reserve_tokens[rid]`` (slots request ``rid`` reserves on
    admission) and ``fit`` (FIRST/BEST or "first"/"best"). ``local``: keep ``held``/``start`` in
    local slots (module docstring); None: past ``HASH_MIN`` requests."""
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
    hkeys, hstate, nh = _local_slots(n, num_blocks, local)
    held = lazy_zeros(nh) if len(hkeys) else np.zeros(nh, dtype=np.int32)
    if kind != STATIC:
        grow = kind == ELASTIC
        return KVState(kind, block_size, num_blocks, int(base_blocks) if grow else 0,
                       int(growth_blocks) if grow else 0, FIRST, scalars(num_blocks),
                       held, none32, none32, none64, none64, hkeys=hkeys, hstate=hstate)
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
    # (with local slots ``start`` is read only where a slot is in use: no -1 fill)
    start = lazy_zeros(nh) if len(hkeys) else np.full(nh, -1, dtype=np.int32)
    return KVState(kind, block_size, num_blocks, 0, 0, fit, rec, held, start, reserve, hole_start, hole_len, hkeys=hkeys, hstate=hstate)


# Compiled kernels receive the pool as a numba StructRef (one reference-counted pointer), as they
# do the replica state: a NamedTuple argument costs a reference-count update of each of its six
# arrays at every kernel call that takes it, and in an iteration of chunked prefill those calls
# (one per request admitted, chunked or finished) were most of the time. Same field names, same
# kernels; the uncompiled path keeps the NamedTuple.
#
# The arrays in the StructRef are *unowned* views (no meminfo: numba's reference count updates on
# them are a test of a null pointer), and the pool itself rides along in ``keep``, which owns
# them for as long as the StructRef lives. Every ``kv.field`` read in a compiled kernel, and
# every array a kernel hands to an inlined helper, would otherwise be an atomic increment and
# decrement: in the Mooncake example (prefix caching, ~750 blocks a request) those were a third
# of the run (benchmarks/RESULTS.md, issue 31).
_REF_FIELDS = list(KVState._fields) + ["keep"]
KVStateType, KVStateRef, _new_kv_ref = struct_ref("KVStateType", "KVStateRef", _REF_FIELDS, "_new_kv_ref",
                                                 __name__, __file__)


@intrinsic
def _unowned(typingctx, x):
    """``x``; an array without its meminfo and parent (a view its owner must outlive)."""
    if not isinstance(x, types.Array):
        return x(x), lambda context, builder, sig, args: args[0]

    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, value=args[0])
        ary.meminfo = cgutils.get_null_value(ary.meminfo.type)
        ary.parent = cgutils.get_null_value(ary.parent.type)
        return ary._getvalue()

    return x(x), codegen


def _borrowing_constructor():
    """``make_kv_ref(kv)``: the StructRef of pool ``kv``, its arrays unowned, ``kv`` kept. Compiled
    from source naming each field (as jit.struct_constructor), attributed to this module."""
    args = ", ".join(f"_unowned(kv.{f})" for f in KVState._fields)
    ns: dict = {"_new_kv_ref": _new_kv_ref, "_unowned": _unowned, "__name__": __name__}
    exec(compile(f"def make_kv_ref(kv):\n    return _new_kv_ref({args}, kv)\n", __file__, "exec"), ns)
    return kernel(ns["make_kv_ref"])


make_kv_ref = _borrowing_constructor()


def compiled_kv(kv: KVState):
    """The pool as compiled kernels take it (sharing ``kv``'s arrays, and keeping ``kv``)."""
    return make_kv_ref(kv)


def copy_kv(kv: KVState) -> KVState:
    """An independent copy (arrays and scalars)."""
    return kv._replace(s=kv.s.copy(), held=kv.held.copy(), start=kv.start.copy(), reserve=kv.reserve.copy(),
                       hole_start=kv.hole_start.copy(), hole_len=kv.hole_len.copy(), hkeys=kv.hkeys.copy(),
                       hstate=kv.hstate.copy())
