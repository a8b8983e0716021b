"""Build a prefix-cache pool (kv/pcache.py) and read its counters back as the reports expect.

:func:`make_prefix_kv` lays out the paged pool's state (kv/kernels.py ``KVState``, ``prefix`` 1):

* **Hash ids.** A workload's chain hashes (int64, per engine block) are interned once into dense
  ids (``np.unique``, numbered in order of first appearance): ``chain[j]`` is the id of the j-th chain hash (request ``rid``'s chain is
  ``chain[off[rid]:off[rid + 1]]``), ``uniq[id]`` the hash. Every map keyed by hash -- the L1
  cache map ``cache_blk``, the lower tiers' LRU lists, the hot-prefix counts -- is then an array
  over ids: deterministic (no Python ``hash()``), O(1), no dictionary in the hot loop.
* **Blocks** (``num_blocks``): ``ref`` count, ``bhash`` (-1: plain), ``bclass`` (most urgent
  class that used it: priority eviction), ``ready`` (when a fetched block's KV is on the GPU),
  free-queue links ``qnext``/``qprev``/``qid`` (queue ends ``qends``, sizes ``qsize``; kv/dlist.py),
  own-table links ``onext``/``oprev``.
* **Requests** (``n``): ``held`` blocks, ``nhit`` hit blocks leading the table, the list
  of its own blocks (``oends[:, rid]``, ``onext``), ``reg`` (table positions considered for the cache map), ``pend``
  (hit blocks found by a lookup and not yet taken; the blocks in ``pend_blk`` at its chain's
  offsets), ``load_ready``, ``seen`` (preload counted it), ``hit_of`` (tokens hit), the holder set
  ``h_arr``/``h_pos``; the request table's ``prompt``, ``num_output``, ``klass``, ``computed``.
* **Tiers** (``t_*``), **links** (``l_*``): kv/ptiers.py. **Preload** (``counts``, ``ev_*``,
  ``hm_*``, ``hot_*``): kv/pqueue.py. **sglang eviction** (``hpar``, ``nchild`` per hash id;
  ``send``, ``acc`` per block; empty under the other rules): kv/radix.py.

:class:`PrefixPool` is what the rest of servesim holds: the state for the kernels (``.state``)
and the counters under the names the reports read (``query_tokens``, ``tiers.tiers[i].link``...).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from servesim.kv.pool import PAGED, PSCALARS, KVState, scalars
from servesim.kv.pqueue import EVICTIONS, LRU, MAIN, NC, SGLANG
from servesim.jit import pure


class TierSpec(SimpleNamespace):
    """One lower tier: ``name``, ``capacity`` blocks, link ``bandwidth`` (bytes/s), ``latency``
    (s), ``channels``; ``shared_row``: its row in the fleet's shared link slots (``shared`` of
    :func:`make_prefix_kv`), -1 for a link of its own."""

    shared_row: int = -1


def make_prefix_kv(num_blocks: int, block_size: int, table, offsets=None, hashes=None, *, eviction: str = "lru",
                   protect_share=None, tiers: list[TierSpec] | None = None, block_bytes: int = 0,
                   hot: tuple[int, float, int] | None = None, trace: int = 0, shared=None,
                   counted: bool = False) -> KVState:
    """A prefix-cache pool of ``num_blocks`` blocks over request ``table`` (its ``computed``,
    ``prompt``, ``num_output``, ``klass`` columns are shared). ``offsets``/``hashes``: per-request
    chains in engine blocks; ``tiers``: lower tiers in order; ``hot``: (min_hits, window_s,
    max_blocks) of preload; ``trace``: keep the first ``trace`` evicted hashes (``evlog``);
    ``shared``: the fleet's shared link slots (kv/factory.py ``SharedLinks``) for tiers with a
    ``shared_row``; ``counted``: keep counts, not block ids, where no request has a chain
    (kv/pcache.py, chainless pools; ignored where one has)."""
    if num_blocks < 1 or block_size < 1:
        raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
    if eviction not in EVICTIONS:
        raise ValueError(f"prefix cache eviction {eviction!r} is not one of: {', '.join(EVICTIONS)}")
    if eviction == "sglang" and hot is not None:
        raise ValueError("prefix cache eviction 'sglang' has no hot-prefix preload (SGLang's radix cache has "
                         "none); allowed with preload: lru, priority")
    n = len(table.computed)
    nb = int(num_blocks)
    off = np.zeros(n + 1, dtype=np.int64) if offsets is None else np.asarray(offsets, dtype=np.int64)
    hs = np.zeros(0, dtype=np.int64) if hashes is None else np.asarray(hashes, dtype=np.int64)
    # ids in order of first appearance, so that a request's new hashes get consecutive ids: the
    # arrays over ids (cache map, tier lists) are then walked along a chain mostly in memory
    # order (numbered by value, a 750-block chain touched 750 scattered cache lines)
    by_value, first, inv = np.unique(hs, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    uniq = by_value[order]
    chain = rank[inv.reshape(-1)].astype(np.int32)
    u = len(uniq)
    evict = EVICTIONS[eviction]
    share = list(protect_share if protect_share is not None else [1.0]) + [0.0] * NC
    protect = np.array([int(x * nb) for x in share[:NC]], dtype=np.int64) if evict != LRU else np.zeros(NC, np.int64)
    nq = 2 if evict == LRU else (3 if evict == SGLANG else 2 + NC)
    sg = evict == SGLANG
    hpar = np.full(u if sg else 0, -1, dtype=np.int32)
    if sg and len(chain):  # a hash's parent: the hash before it in its chain (kv/radix.py)
        par = np.empty(len(chain), dtype=np.int32)
        par[0] = -1
        par[1:] = chain[:-1]
        par[off[:-1][np.diff(off) > 0]] = -1
        hpar[chain] = par
    tiers = tiers or []
    t = len(tiers)
    nch = max([int(x.channels) for x in tiers], default=0)
    l_free = np.full((t, nch), np.inf)
    for i, x in enumerate(tiers):
        l_free[i, : int(x.channels)] = 0.0
    hot_min, hot_window, hot_max = (0, 0.0, 0) if hot is None else (int(hot[0]), float(hot[1]), int(hot[2]))
    uh = u if hot is not None else 0
    i32 = np.int32
    kv = KVState(
        PAGED, int(block_size), nb, 0, 0, 0, scalars(0), np.zeros(n, dtype=i32),
        np.zeros(0, dtype=i32), np.zeros(0, dtype=i32), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
        prefix=1, counted=int(bool(counted) and len(chain) == 0), evict=evict, hot_min=hot_min, hot_max=hot_max, hot_window=hot_window,
        block_bytes=int(block_bytes), ps=np.zeros(1, dtype=PSCALARS), computed=table.computed,
        prompt=np.asarray(table.prompt, dtype=i32), num_output=table.num_output,
        klass=np.asarray(table.klass, dtype=np.int8), off=off, chain=chain, uniq=uniq,
        cache_blk=np.full(u, -1, dtype=i32), watch=np.zeros(u, dtype=np.int64),
        ref=np.zeros(nb, dtype=i32), bhash=np.full(nb, -1, dtype=i32), bclass=np.full(nb, NC - 1, dtype=np.int8),
        ready=np.zeros(nb), qnext=np.full(nb, -1, dtype=i32), qprev=np.full(nb, -1, dtype=i32),
        qid=np.full(nb, -1, dtype=np.int8), onext=np.full(nb, -1, dtype=i32), oprev=np.full(nb, -1, dtype=i32),
        qends=np.full((2, nq), -1, dtype=i32), qsize=np.zeros(nq, dtype=np.int64),
        protect=protect, nhit=np.zeros(n, dtype=i32), reg=np.zeros(n, dtype=i32),
        oends=np.full((2, n), -1, dtype=i32), load_ready=np.zeros(n),
        seen=np.zeros(n, dtype=np.bool_), hit_of=np.zeros(n, dtype=i32), pend=np.full(n, -1, dtype=i32),
        pend_blk=np.zeros(len(chain), dtype=i32), h_arr=np.zeros(n, dtype=np.int64),
        h_pos=np.full(n, -1, dtype=i32), cnt=np.zeros((4, NC), dtype=np.int64),
        tier_hits=np.zeros((1 + t, NC), dtype=np.int64), fwait=np.zeros(NC), fwaits=np.zeros(NC, dtype=np.int64),
        t_cap=np.array([int(x.capacity) for x in tiers], dtype=np.int64), t_size=np.zeros(t, dtype=np.int64),
        t_ends=np.full((2, t), -1, dtype=i32),
        t_next=np.full((t, u if t else 0), -1, dtype=i32), t_prev=np.full((t, u if t else 0), -1, dtype=i32),
        t_in=np.zeros((t, u if t else 0), dtype=np.bool_), t_hits=np.zeros((t, NC), dtype=np.int64),
        t_stat=np.zeros((t, 4), dtype=np.int64),
        l_bw=np.array([float(x.bandwidth) for x in tiers]), l_lat=np.array([float(x.latency) for x in tiers]),
        l_free=l_free, l_cnt=np.zeros((t, 4), dtype=np.int64), l_time=np.zeros((t, 2)),
        counts=np.zeros(uh, dtype=i32), ev_t=np.zeros(n if hot else 0), ev_rid=np.zeros(n if hot else 0, np.int64),
        ev_len=np.zeros(n if hot else 0, dtype=np.int64), hm_next=np.full(uh, -1, dtype=i32),
        hm_prev=np.full(uh, -1, dtype=i32), hm_in=np.zeros(uh, dtype=np.bool_),
        hm_ends=np.full((2, 1), -1, dtype=i32),
        evlog=np.zeros(int(trace), dtype=np.int64),
        hpar=hpar, nchild=np.zeros(len(hpar), dtype=i32), send=np.zeros(nb if sg else 0, dtype=np.bool_),
        acc=np.zeros(nb if sg else 0, dtype=np.int64),
        l_sid=np.array([int(getattr(x, "shared_row", -1)) for x in tiers], dtype=np.int64),
        l_sfree=shared.free if shared is not None else np.zeros((0, max(nch, 1))),
        l_slast=shared.last if shared is not None else np.zeros(0), l_late=np.zeros(t),
    )
    ps = kv.ps[0]
    ps.watch_t = -1.0
    # every block starts plain, in block order, in the main queue: the state q_push of 0, 1, ...,
    # nb - 1 leaves (tests/test_prefix_kernels.py), laid out at once -- that loop ran a kernel's
    # Python form per block, ~5 s a replica for a pool of 2**20 blocks (a fuzz input of 5
    # requests on 2 replicas passed the fuzzer's 30 s)
    kv.qid[:] = MAIN
    kv.qnext[:-1] = np.arange(1, nb, dtype=i32)
    kv.qprev[1:] = np.arange(nb - 1, dtype=i32)
    kv.qends[0, MAIN], kv.qends[1, MAIN] = 0, nb - 1
    kv.qsize[MAIN] = nb
    kv.s[0].free = nb
    return kv


class _Link(SimpleNamespace):
    pass


class _Tier(SimpleNamespace):
    def __len__(self) -> int:
        return len(self.blocks)


class PrefixPool:
    """A prefix-cache pool: ``state`` for the kernels; the counters as the reports read them
    (kv/report.py, metrics), read from the state when asked (after or during a run)."""

    name = "prefix"
    prefix_caching = True

    def __init__(self, state: KVState, tier_names: list[str] | None = None, link_names: list[str] | None = None):
        self.state = state
        self.tier_names = list(tier_names or [])
        self.link_names = list(link_names or [f"{x}-link" for x in self.tier_names])

    num_blocks = property(lambda self: self.state.num_blocks)
    block_size = property(lambda self: self.state.block_size)
    free_blocks = property(lambda self: int(self.state.s[0].free))
    used_blocks = property(lambda self: self.state.num_blocks - int(self.state.s[0].free))
    held = property(lambda self: self.state.held)
    query_tokens = property(lambda self: self.state.cnt[0])
    hit_tokens = property(lambda self: self.state.cnt[1])
    query_blocks = property(lambda self: self.state.cnt[2])
    hit_blocks = property(lambda self: self.state.cnt[3])
    tier_hit_blocks = property(lambda self: self.state.tier_hits)
    fetch_wait_s = property(lambda self: self.state.fwait)
    fetch_waits = property(lambda self: self.state.fwaits)
    hit_tokens_of = property(lambda self: self.state.hit_of)
    evictions = property(lambda self: int(self.state.ps[0].evictions))
    stale_hits = property(lambda self: int(self.state.ps[0].stale_hits))

    def max_slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def eviction_log(self) -> list[int] | None:
        kv = self.state
        return kv.evlog[: int(kv.ps[0].evlog_n)].tolist() if len(kv.evlog) else None

    def cached_blocks(self) -> int:
        """Cached-free blocks (reusable, evictable)."""
        kv = self.state
        return int(((kv.bhash >= 0) & (kv.ref == 0)).sum())

    def block_table(self, rid: int) -> np.ndarray:
        from servesim.kv.pcache import px_table

        out = np.zeros(int(self.state.held[rid]) + 1, dtype=np.int64)
        return out[: pure(px_table)(self.state, rid, out)]

    @property
    def tiers(self):
        """The lower tiers as the reports read them (None without tiers)."""
        kv = self.state
        if not len(kv.t_cap):
            return None
        ps = kv.ps[0]
        tiers = []
        for i, name in enumerate(self.tier_names):
            c, tm = kv.l_cnt[i], kv.l_time[i]
            r = int(kv.l_sid[i])
            free = kv.l_sfree[r] if r >= 0 else kv.l_free[i]
            link = _Link(name=self.link_names[i], bw=float(kv.l_bw[i]), latency=float(kv.l_lat[i]),
                         channels=int(np.isfinite(free).sum()), bytes_up=int(c[0]), bytes_down=int(c[1]), fetches=int(c[2]),
                         stores=int(c[3]), busy_s=float(tm[0]), queue_s=float(tm[1]), shared=r >= 0,
                         out_of_order_s=float(kv.l_late[i]), free_at=[float(x) for x in free if np.isfinite(x)])
            st = kv.t_stat[i]
            stats = _Link(hits=kv.t_hits[i].copy(), preloaded=int(st[0]), inserted=int(st[1]), refreshed=int(st[2]),
                          evicted=int(st[3]))
            tiers.append(_Tier(name=name, capacity=int(kv.t_cap[i]), blocks=range(int(kv.t_size[i])), link=link,
                               stats=stats))
        return SimpleNamespace(tiers=tiers, dropped=int(ps.dropped), demoted=int(ps.demoted),
                               block_bytes=int(kv.block_bytes))

    def check(self) -> None:
        """The pool's invariants (kv/pcheck.py ``px_check``), as an AssertionError."""
        from servesim.kv.pcheck import check_text, px_check

        code = int(pure(px_check)(self.state, self.state.computed))
        if code:
            raise AssertionError(check_text(code) or f"KV invariant violated (code {code})")
