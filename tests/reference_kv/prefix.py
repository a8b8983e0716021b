"""Paged KV with automatic prefix caching (vLLM's ``enable_prefix_caching``), plus L2/L3 tiers.

Blocks have ids here, because *which* block is evicted matters. Every block is in exactly one
state::

    free (plain)    in a free queue, holds nothing reusable
    in use          ref count >= 1: in the block table of one or more requests
    cached-free     ref count 0, holds the KV of a prefix block (its hash is in the cache map),
                    in a free queue: reusable until it is taken for something else (evicted)

A request's prompt carries a chain of block hashes (``Workload.prefix_hashes`` mapped to the
engine's block size by the factory): equal hash at position j means equal tokens 0..end of block
j. On lookup (:meth:`PrefixCacheKV.reuse_prefix`) the chain is walked through the cache map until
the first miss; the matched blocks are the request's first blocks and its prefill starts after
them. At most ``(known tokens - 1) // block_size`` blocks are matched: at least one token is always
computed, so there are logits to sample from (vLLM's ``num_tokens - 1`` rule); a fully cached
prompt still recomputes its last block into a fresh one.

Life of a block (vLLM v1 ``BlockPool`` / ``KVCacheManager``)::

    free ──take── in use (ref 1) ──request frees──► ref 0: cached-free (has hash) or free (none)
                   ▲  └─hit by another request: ref 2 ...   │   appended at the queue tail,
                   └──────────── hit (touch) ──────────────┘   last block of the request first
    cached-free ──reaches the head when a block is needed──► evicted: hash forgotten (-> L2)

* Hashes are registered when their block's tokens are scheduled (:meth:`allocate`, as vLLM
  v1's ``cache_blocks``) or, for blocks filled by decode steps, when the request frees them (the
  decode path stays vectorized; only another request hitting a still-running request's output
  blocks would notice). One block per hash: a second block computed with the same hash (two
  requests prefilling the same prefix at once) is not registered and is freed as plain.
* Hits are taken in two steps. ``reuse_prefix`` finds them and sets ``computed[rid]`` but takes no
  reference; ``allocate`` right after takes the references and the new blocks together, and fails
  without side effects if the pool cannot provide both (ref-0 hit blocks count against the free
  blocks, as in vLLM). A hit evicted in between (a policy that looks up several requests before
  allocating) is cut back to what is still cached; ``stale_hits`` counts it.
* With lower tiers, a lookup that continues below L1 starts the fetch at once, if the pool can
  hold the request's whole prefill: the request takes its L1 blocks, blocks for the fetched part
  and for the rest of its prefill immediately and holds them while it waits (vLLM allocates a
  request's slots when it starts an async KV load), so a landed request never waits for blocks;
  ``PrefixHit.ready_at`` is the fetch completion. If the prefill does not fit, only the L1 hit is
  used. The
  fetched blocks are registered at once with that ready time, so a second request hitting them
  waits for the same transfer.
* Decode steps take blocks through the same queues in bulk (:meth:`commit_decodes` orders a run's
  new blocks by step, then batch order: exactly what stepwise :meth:`allocate_decodes` takes).

Counters (per SLA class): tokens and blocks looked up and hit, counted when a hit is taken;
blocks hit per tier; seconds waited for tier fetches; evictions.
"""

from __future__ import annotations

import numpy as np

from tests.reference_kv.base import PrefixHit
from tests.reference_kv.evict import make_eviction
from tests.reference_kv.freeq import FreeLists
from tests.reference_kv.preload import hot_mask, observe
from servesim.kv.frag import StepUsage
from tests.reference_kv.steps import Holders, run_demand, step_slots
from servesim.request import NUM_CLASSES

_EMPTY = np.empty(0, dtype=np.int64)


class PrefixCacheKV:
    name = "prefix"
    prefix_caching = True

    def kernel_overrides(self) -> dict:
        """The engine's KV kernel calls bound to this object (the driver binds them)."""
        from tests.reference_kv.adapters import object_kv_overrides

        return object_kv_overrides(self)

    def __init__(self, num_blocks: int, block_size: int, table, offsets: np.ndarray | None = None,
                 hashes: np.ndarray | None = None, *, eviction: str = "lru", protect_share=None,
                 tiers=None, hot=None, trace: bool = False):
        """``table``: the request table (``computed``, ``prompt``, ``num_output``, ``output``,
        ``klass`` columns); ``offsets``/``hashes``: per-request chains in engine blocks; ``tiers``:
        a :class:`~tests.reference_kv.tiers.TierStack`; ``hot``: a
        :class:`~tests.reference_kv.preload.HotPrefixTracker`; ``trace``: keep the eviction order."""
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        n = len(table.computed)
        self.num_blocks, self.block_size = int(num_blocks), int(block_size)
        self.req = table
        self._computed = table.computed
        self.off = np.zeros(n + 1, dtype=np.int64) if offsets is None else np.asarray(offsets, dtype=np.int64)
        self.hashes = _EMPTY if hashes is None else np.asarray(hashes, dtype=np.int64)
        # blocks
        nb = self.num_blocks
        self.ref = np.zeros(nb, dtype=np.int32)
        self.bhash = np.zeros(nb, dtype=np.int64)
        self.hashed = np.zeros(nb, dtype=bool)
        self.bclass = np.full(nb, NUM_CLASSES - 1, dtype=np.int8)
        self.ready = np.zeros(nb)  # when a fetched block's KV is on the GPU
        self.cache: dict[int, int] = {}
        self.policy = make_eviction(eviction, nb, protect_share)
        self.pool = FreeLists(nb, self.policy.num_queues)
        self.pool.push(np.arange(nb, dtype=np.int64), self.policy.PLAIN)
        self.tiers = tiers
        self.hot = hot
        self.hot_missing: dict[int, None] = {}  # hot hashes evicted from L1 (ordered set)
        # requests
        total = np.asarray(table.prompt, dtype=np.int64) + np.asarray(table.output, dtype=np.int64)
        # no request holds more than the pool (longer ones are rejected at arrival): cap the width
        self._width = max(1, min(int(-(-int(total.max(initial=1)) // block_size)), nb)) + 1
        self.tbl = np.zeros((16, self._width), dtype=np.int32)
        self._free_rows = list(range(15, -1, -1))
        self.row = np.full(n, -1, dtype=np.int32)
        self.held = np.zeros(n, dtype=np.int32)
        self.reg = np.zeros(n, dtype=np.int32)  # table positions already considered for the cache map
        self.holders = Holders(n)
        self.pending: dict[int, np.ndarray] = {}
        self.load_ready: dict[int, float] = {}  # holders whose blocks came from a fetch
        self.seen = np.zeros(n, dtype=bool)
        self.hit_tokens_of = np.zeros(n, dtype=np.int32)
        # counters
        self.query_tokens = np.zeros(NUM_CLASSES, dtype=np.int64)
        self.hit_tokens = np.zeros(NUM_CLASSES, dtype=np.int64)
        self.query_blocks = np.zeros(NUM_CLASSES, dtype=np.int64)
        self.hit_blocks = np.zeros(NUM_CLASSES, dtype=np.int64)
        self.tier_hit_blocks = np.zeros((1 + (len(tiers) if tiers else 0), NUM_CLASSES), dtype=np.int64)
        self.fetch_wait_s = np.zeros(NUM_CLASSES)
        self.fetch_waits = np.zeros(NUM_CLASSES, dtype=np.int64)
        self.evictions = 0
        self.stale_hits = 0
        self.eviction_log: list[int] | None = [] if trace else None
        # hashes of the chains looked up at the latest lookup time (see stable_steps)
        self._watch: set[int] = set()
        self._watch_t = -1.0
        self._run: tuple[np.ndarray, np.ndarray] | None = None  # (ids, cumulative demand) of decode_run

    # -- queries -----------------------------------------------------------------------------
    @property
    def free_blocks(self) -> int:
        return self.pool.size

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self.pool.size

    def max_slots(self) -> int:
        return self.num_blocks * self.block_size

    def block_table(self, rid: int) -> np.ndarray:
        r = int(self.row[rid])
        return self.tbl[r, : self.held[rid]].copy() if r >= 0 else _EMPTY

    def chain(self, rid: int) -> np.ndarray:
        """The hashes a lookup of ``rid`` may match: full blocks of its known tokens but the last."""
        known = int(self.req.prompt[rid] + self.req.num_output[rid])
        a, b = self.off[rid], self.off[rid + 1]
        return self.hashes[a : min(b, a + max(0, (known - 1) // self.block_size))]

    # -- blocks ---------------------------------------------------------------------------------
    def _take(self, n: int, allow_hot: bool = True) -> np.ndarray:
        """``n`` blocks from the free queues in the policy's order; cached ones are evicted."""
        if self.hot is None and self.policy.name == "lru":  # one queue
            blocks = self.pool.pop_plan(((self.policy.MAIN, n),))
        else:
            plan = self.policy.plan(self.pool.sizes(), n)
            if not allow_hot:
                plan = [(q, c) for q, c in plan if q != self.policy.HOT]
            blocks = self.pool.pop_plan(plan)
        cached = self.hashed[blocks]
        if cached.any():
            self._evict(blocks[cached])
        return blocks

    def _evict(self, blocks: np.ndarray) -> None:
        hs = self.bhash[blocks].tolist()
        cache = self.cache
        for h in hs:
            del cache[h]
        self.hashed[blocks] = False
        self.bclass[blocks] = NUM_CLASSES - 1
        self.ready[blocks] = 0.0
        self.evictions += len(hs)
        if self.eviction_log is not None:
            self.eviction_log.extend(hs)
        if self.hot is not None:
            for h in hs:
                if self.hot.is_hot(h):
                    self.hot_missing[h] = None
        if self.tiers is not None:
            self.tiers.demote(hs)

    def _touch(self, blocks: np.ndarray) -> None:
        """Take a reference on hit blocks (a ref-0 block leaves its free queue)."""
        if len(blocks):
            idle = blocks[self.ref[blocks] == 0]
            self.pool.remove(idle)
            self.ref[blocks] += 1

    def _register(self, rid: int, upto: int) -> None:
        """Enter ``rid``'s full blocks at table positions ``reg[rid] .. upto`` into the cache map."""
        a = int(self.reg[rid])
        upto = min(upto, int(self.off[rid + 1] - self.off[rid]), int(self.held[rid]))
        if upto <= a:
            return
        self.reg[rid] = upto
        blocks = self.tbl[self.row[rid], a:upto]
        hs = self.hashes[self.off[rid] + a : self.off[rid] + upto]
        cache, hashed = self.cache, self.hashed
        new = [(b, h) for b, h in zip(blocks.tolist(), hs.tolist()) if h not in cache and not hashed[b]]
        if new:
            for b, h in new:
                cache[h] = b
            idx = np.fromiter((b for b, _ in new), dtype=np.int64, count=len(new))
            self.hashed[idx] = True
            self.bhash[idx] = [h for _, h in new]
            self.bclass[idx] = self.req.klass[rid]
            if self.hot_missing:
                for _, h in new:
                    self.hot_missing.pop(h, None)

    def _new_row(self, rid: int, blocks: np.ndarray) -> None:
        if not self._free_rows:
            old = self.tbl
            self.tbl = np.zeros((2 * len(old), self._width), dtype=np.int32)
            self.tbl[: len(old)] = old
            self._free_rows = list(range(len(self.tbl) - 1, len(old) - 1, -1))
        r = self._free_rows.pop()
        self.row[rid] = r
        self._set_width(len(blocks))
        self.tbl[r, : len(blocks)] = blocks
        self.held[rid] = len(blocks)
        self.holders.add(rid)

    def _set_width(self, w: int) -> None:
        if w > self._width:
            self._width = max(w, 2 * self._width)
            old = self.tbl
            self.tbl = np.zeros((len(old), self._width), dtype=np.int32)
            self.tbl[:, : old.shape[1]] = old

    def _grow(self, ids: np.ndarray, want: np.ndarray, key=None) -> bool:
        """Give each of ``ids`` blocks up to ``want``, all or nothing. New blocks go out in
        ``(key, position in ids)`` order (``key`` None: ids order)."""
        need = want - self.held[ids]
        if need.max() <= 0:
            return True
        grow = need > 0
        gid, gneed = ids[grow], need[grow]
        total = int(gneed.sum())
        if total > self.pool.size:
            return False
        blocks = self._take(total)
        if total == len(gid):  # one block each: the decode case
            pos_in_ids, slot = np.arange(total), self.held[gid].astype(np.int64)
        else:
            pos_in_ids = np.repeat(np.arange(len(gid)), gneed)
            slot = self.held[gid][pos_in_ids] + (np.arange(total) - np.repeat(np.cumsum(gneed) - gneed, gneed))
        if key is not None and total > 1:
            order = np.lexsort((pos_in_ids, key(gid, pos_in_ids, slot)))
            pos_in_ids, slot = pos_in_ids[order], slot[order]
        if slot.max() >= self._width:
            self._set_width(int(slot.max()) + 1)
        self.tbl[self.row[gid][pos_in_ids], slot] = blocks
        self.ref[blocks] = 1
        self.held[gid] += gneed
        return True

    # -- lookup -----------------------------------------------------------------------------------
    def reuse_prefix(self, rid: int, now: float) -> PrefixHit:
        """Longest cached prefix of full blocks (module docstring); sets ``computed[rid]``."""
        if self.row[rid] >= 0:  # already holds its blocks (fetch in flight, or landed)
            return PrefixHit(int(self._computed[rid]), self.load_ready.get(rid, 0.0))
        if self._computed[rid] > 0 and rid not in self.pending:  # its own KV (swap-in), not a lookup
            return PrefixHit(int(self._computed[rid]), now)
        chain = self.chain(rid)
        hs = chain.tolist()
        if now != self._watch_t:
            self._watch_t = now
            self._watch = set()
        self._watch.update(hs)
        if self.hot is not None and not self.seen[rid]:
            self.seen[rid] = True
            self._observe(hs, now)
        get = self.cache.get
        l1: list[int] = []
        for h in hs:
            b = get(h)
            if b is None:
                break
            l1.append(b)
        m = len(l1)
        b1 = np.array(l1, dtype=np.int64)
        if self.tiers is not None and m < len(hs):
            where = self.tiers.find(hs[m:], skip=self.cache.__contains__)
            # as vLLM with an async KV load: the whole prefill's blocks are taken when the fetch
            # starts, so a landed request never waits for blocks (nothing can deadlock on them)
            known = int(self.req.prompt[rid] + self.req.num_output[rid])
            need = -(-known // self.block_size) - m + int((self.ref[b1] == 0).sum())
            if where and need <= self.pool.size:
                return self._fetch(rid, b1, hs[m : m + len(where)], where, now, -(-known // self.block_size))
        self.pending.pop(rid, None)
        self._computed[rid] = m * self.block_size
        if m == 0:
            return PrefixHit(0, 0.0)
        self.pending[rid] = b1
        return PrefixHit(m * self.block_size, float(self.ready[b1].max()))

    def _fetch(self, rid: int, b1: np.ndarray, hs: list[int], where: list[int], now: float,
               total: int) -> PrefixHit:
        """Take the L1 hit, blocks for ``hs`` (fetched from lower tiers) and for the rest of the
        prefill (``total`` blocks in all); start the fetch."""
        self.pending.pop(rid, None)
        g = int(self.req.klass[rid])
        self._touch(b1)
        # start the fetch before taking L1 blocks: their eviction may push the source copies out
        # of a small lower tier (the transfer has its data by then)
        ready_at = self.tiers.fetch(hs, where, now, g)
        new = self._take(total - len(b1))
        self.ref[new] = 1
        self._new_row(rid, np.concatenate([b1, new]))
        self.reg[rid] = len(b1)
        self._register(rid, len(b1) + len(hs))
        self.ready[new[: len(hs)]] = ready_at
        ready_at = max(ready_at, float(self.ready[b1].max(initial=0.0)))
        self.load_ready[rid] = ready_at
        self._computed[rid] = (len(b1) + len(hs)) * self.block_size
        self._claim(rid, len(b1), np.bincount(np.asarray(where), minlength=len(self.tiers)))
        self.fetch_wait_s[g] += max(0.0, ready_at - now)
        self.fetch_waits[g] += 1
        return PrefixHit(int(self._computed[rid]), ready_at)

    def _claim(self, rid: int, l1_blocks: int, lower_blocks=None) -> None:
        g = int(self.req.klass[rid])
        known = int(self.req.prompt[rid] + self.req.num_output[rid])
        hit = int(self._computed[rid])
        self.query_tokens[g] += known
        self.hit_tokens[g] += hit
        self.query_blocks[g] += len(self.chain(rid))
        self.hit_blocks[g] += hit // self.block_size
        self.tier_hit_blocks[0, g] += l1_blocks
        if lower_blocks is not None:
            self.tier_hit_blocks[1:, g] += lower_blocks
        self.hit_tokens_of[rid] = hit

    # -- allocation ---------------------------------------------------------------------------------
    def allocate(self, rid: int, num_new: int) -> bool:
        c = int(self._computed[rid])
        bs = self.block_size
        if self.row[rid] >= 0:
            want = -(-(c + num_new) // bs)
            if not self._grow(np.array([rid]), np.array([want])):
                return False
            self._register(rid, (c + num_new) // bs)
            return True
        pend = self.pending.pop(rid, None)
        lookup = pend is not None or c == 0
        if pend is None:
            pend = _EMPTY
        else:
            chain = self.hashes[self.off[rid] : self.off[rid] + len(pend)]
            ok = self.hashed[pend] & (self.bhash[pend] == chain)
            if not ok.all():  # evicted since the lookup
                pend = pend[: int(np.argmin(ok))]
                c = len(pend) * bs
                self._computed[rid] = c
                self.stale_hits += 1
        need = -(-(c + num_new) // bs) - len(pend)
        if need + int((self.ref[pend] == 0).sum()) > self.pool.size:
            if len(pend):
                self.pending[rid] = pend
            return False
        self._touch(pend)
        new = self._take(need)
        self.ref[new] = 1
        self._new_row(rid, np.concatenate([pend, new]) if len(pend) else new)
        self.reg[rid] = len(pend)
        self._register(rid, (c + num_new) // bs)
        if lookup:
            self._claim(rid, len(pend))
        return True

    def allocate_decodes(self, ids: np.ndarray) -> bool:
        if len(ids) == 0:
            return True
        return self._grow(ids, -(-(self._computed[ids] + 1) // self.block_size))

    def free(self, rid: int) -> None:
        """Release ``rid``'s blocks: full blocks of its chain become cached-free, tail first."""
        self.pending.pop(rid, None)
        r = int(self.row[rid])
        if r < 0:
            return
        self._register(rid, int(self._computed[rid]) // self.block_size)
        blocks = self.tbl[r, : self.held[rid]][::-1].copy()
        self.ref[blocks] -= 1
        if self.policy.name == "priority":
            self.bclass[blocks] = np.minimum(self.bclass[blocks], self.req.klass[rid])
        rel = blocks[self.ref[blocks] == 0]
        if len(rel):
            if self.hot is None and self.policy.name == "lru":
                self.pool.push(rel, self.policy.MAIN)
            else:
                self.pool.push(rel, self.policy.queue_of(self.hashed[rel], self.bclass[rel], self._hot_mask(rel)))
        self._free_rows.append(r)
        self.row[rid] = -1
        self.held[rid] = 0
        self.reg[rid] = 0
        self.load_ready.pop(rid, None)
        self.holders.remove(rid)

    # -- decode runs ----------------------------------------------------------------------------------
    def decode_run(self, ids: np.ndarray, k_max: int) -> tuple[int, np.ndarray]:
        """As ``kv_decode_run`` of a paged pool (kv/kernels.py): every free or cached-free block can be taken."""
        used0 = self.num_blocks - self.pool.size
        if k_max <= 1:
            return k_max, np.full(k_max, used0, dtype=np.int64)
        demand = np.cumsum(run_demand(self._computed[ids], k_max, 0, self.block_size))
        self._run = (ids, demand)
        k = k_max if demand[-1] <= self.pool.size else int(np.searchsorted(demand, self.pool.size, "right")) + 1
        used = np.empty(k, dtype=np.int64)
        used[0] = used0
        used[1:] = used0 + demand[: k - 1]
        return k, used

    def stable_steps(self, ids: np.ndarray, k: int) -> int:
        """How many of the next ``k`` decode steps of ``ids`` (a fast-path run whose step 1 is
        allocated) can run before a policy decision could differ from the one just taken.

        A waiting request blocked at this boundary stays blocked while the pool only shrinks,
        unless its lookup changes: a block of its chain evicted from L1 shortens its hit (which
        can *lower* what it needs: ref-0 hit blocks count against the free blocks) and, with
        tiers, demotes the block where a fetch may now find it. Decode steps take blocks but
        register none, so only those evictions matter. The run therefore ends before the first
        step whose blocks include a cached block of a chain looked up at this boundary (the
        lookups at the latest lookup time; older ones only make the cut earlier)."""
        if k <= 1 or not self._watch:
            return k
        ran = self._run
        if ran is not None and ran[0] is ids and len(ran[1]) >= k - 1:
            demand = ran[1][: k - 1]  # decode_run just computed it for these ids
        else:
            demand = np.cumsum(run_demand(self._computed[ids], k, 0, self.block_size))
        total = int(demand[-1])
        if total == 0:
            return k
        blocks = self._peek(total)
        cached = np.flatnonzero(self.hashed[blocks])
        watch = self._watch
        for p, h in zip(cached.tolist(), self.bhash[blocks[cached]].tolist()):
            if h in watch:
                # position p of the take order is taken at step 2 + (first i: demand[i] > p)
                return int(np.searchsorted(demand, p, side="right")) + 1
        return k

    def _peek(self, n: int) -> np.ndarray:
        """The ``n`` blocks :meth:`_take` would take next, in order, without taking them."""
        if self.hot is None and self.policy.name == "lru":
            return self.pool.peek_plan(((self.policy.MAIN, n),))
        return self.pool.peek_plan(self.policy.plan(self.pool.sizes(), n))

    def commit_decodes(self, ids: np.ndarray) -> None:
        """Take the blocks a run used, in the order stepwise allocation would have taken them:
        block ``j`` of a request now at ``c`` tokens was first needed ``j*bs - c`` steps from now."""
        bs = self.block_size
        c = self._computed[ids]
        ok = self._grow(ids, -(-c // bs), key=lambda gid, pos, slot: slot * bs - self._computed[gid][pos])
        if not ok:
            raise AssertionError("commit_decodes: the run used more blocks than the pool has")

    # -- preload (tests.reference_kv.preload) ----------------------------------------------------------
    def _hot_mask(self, blocks: np.ndarray) -> np.ndarray:
        return hot_mask(self, blocks)

    def _observe(self, hs: list[int], now: float) -> None:
        observe(self, hs, now)

    # -- metrics and invariants -----------------------------------------------------------------------
    def step_usage(self, ids: np.ndarray, num_new: np.ndarray, k: int = 1,
                   used: np.ndarray | None = None) -> StepUsage:
        """Shared blocks count once: ``used = allocated - internal``, internal slack being the
        partly written last block of each request (shared blocks are always full)."""
        bs = self.block_size
        slots, touched = step_slots(self._computed, self.holders.ids, ids, num_new, k, bs)
        if used is None:
            used = np.full(k, self.num_blocks - self.pool.size, dtype=np.int64)
            if k > 1:
                used[1:] += np.cumsum(run_demand(self._computed[ids], k, 0, bs))
        alloc = np.asarray(used[:k], dtype=np.int64) * bs
        internal = touched * bs - slots
        zero = np.zeros(k, dtype=np.int64)
        return StepUsage(total_slots=self.num_blocks * bs, allocated=alloc, used=alloc - internal,
                         reserved_unused=zero, external=zero)

    def cached_blocks(self) -> int:
        """Cached-free blocks (reusable, evictable)."""
        return int((self.hashed & (self.ref == 0)).sum())

    def check(self) -> None:
        nb = self.num_blocks
        in_use = self.ref > 0
        if (self.ref < 0).any():
            raise AssertionError("KV invariant violated: negative ref count")
        queued = self.pool.qid >= 0
        if (in_use == queued).any():
            raise AssertionError("KV invariant violated: a block is both in use and free, or neither")
        if self.pool.size != int(queued.sum()) or sum(self.pool.sizes()) != self.pool.size:
            raise AssertionError("KV invariant violated: free queue sizes disagree")
        members = self.pool.members()
        if len(members) != self.pool.size or len(np.unique(members)) != len(members):
            raise AssertionError("KV invariant violated: a free block is queued twice")
        h = self.holders.ids
        rows = self.row[h]
        refs = np.zeros(nb, dtype=np.int64)
        for rid, r in zip(h.tolist(), rows.tolist()):
            t = self.tbl[r, : self.held[rid]]
            if len(np.unique(t)) != len(t):
                raise AssertionError(f"KV invariant violated: request {rid} holds a block twice")
            refs[t] += 1
        if (refs != self.ref).any():
            raise AssertionError("KV invariant violated: ref counts differ from block tables")
        if (self.held[h] < -(-self._computed[h] // self.block_size)).any():
            raise AssertionError("KV invariant violated: a request holds fewer blocks than its tokens need")
        if len(self.cache) != int(self.hashed.sum()):
            raise AssertionError("KV invariant violated: cache map and hashed blocks disagree")
        for hsh, b in self.cache.items():
            if not self.hashed[b] or self.bhash[b] != hsh:
                raise AssertionError(f"KV invariant violated: cache map sends {hsh} to block {b} holding "
                                     f"{self.bhash[b] if self.hashed[b] else None}")
        if self.tiers is not None:
            self.tiers.check()
