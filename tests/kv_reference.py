"""FROZEN pre-kernel implementation of the paged, elastic and static KV allocators: a test oracle.

This is a verbatim copy (module docstrings and imports removed) of servesim/kv/steps.py,
extents.py, counting.py, paged.py, elastic.py and static.py as they were on main at commit
41701e2, before the allocators became kernels (servesim/kv/kernels.py). tests/test_kv_kernels.py
drives it and the kernel-backed classes through the same random operation sequences and asserts
every result is equal. Do not edit it to make a test pass: it is the specification.
"""

from __future__ import annotations

import bisect

import numpy as np

from tests.reference_kv.base import NO_HIT, PrefixHit
from servesim.kv.frag import StepUsage

# --------------------------------------------------------------------------------
# servesim/kv/steps.py (main @ 41701e2)
# --------------------------------------------------------------------------------
def run_demand(c: np.ndarray, k_max: int, threshold: int, period: int, chunk: int = 1) -> np.ndarray:
    """Blocks newly needed at decode steps ``j = 2..k_max`` (array of ``k_max - 1``) for requests
    with ``c`` computed tokens each (see module docstring)."""
    if k_max <= 1:
        return np.zeros(0, dtype=np.int64)
    x = np.asarray(c, dtype=np.int64) + 1  # c + j - 1 at j = 2
    if threshold == 0 or x.min() >= threshold:  # all periodic from step 2: residues (as paged)
        cnt = np.bincount((threshold - x) % period, minlength=period)
        per_step = cnt[_steps(k_max - 1) % period] if period > 1 else np.full(k_max - 1, cnt[0])
        return per_step * chunk if chunk != 1 else per_step
    first = np.where(x >= threshold, 2 + (threshold - x) % period, 2 + threshold - x)
    first = first[first <= k_max]
    length = k_max - 1  # index j - 2
    rows = -(-length // period)
    hist = np.bincount(first - 2, minlength=rows * period)[: rows * period]
    per_step = np.cumsum(hist.reshape(rows, period), axis=0).reshape(-1)[:length]
    return per_step * chunk


_ARANGE = np.arange(1 << 14, dtype=np.int64)


def _steps(n: int) -> np.ndarray:
    """``arange(n)``, cached for the engine's usual run lengths."""
    return _ARANGE[:n] if n <= len(_ARANGE) else np.arange(n, dtype=np.int64)


def touched_per_step(s1: np.ndarray, k: int, block_size: int) -> np.ndarray:
    """``sum(ceil(s_j / block_size))`` for ``s_j = s1 + j - 1``, ``j = 1..k``: blocks that hold at
    least one written slot, per step of a decode run."""
    bs = block_size
    base = int((-(-np.asarray(s1, dtype=np.int64) // bs)).sum())
    out = np.full(k, base, dtype=np.int64)
    if k > 1:
        out[1:] += np.cumsum(run_demand(np.asarray(s1) - 1, k, 0, bs))
    return out


def slack(slots: np.ndarray, block_size: int) -> int:
    """Unwritten slots in partly written blocks: ``sum((-s) mod block_size)``."""
    return int(((-np.asarray(slots, dtype=np.int64)) % block_size).sum())


class Holders:
    """The set of request ids holding KV memory, as a dense array (O(1) add/remove by swapping
    with the last entry), so per-step usage sums are one vectorized gather."""

    def __init__(self, n: int):
        self._arr = np.empty(16, dtype=np.int64)
        self._pos = np.full(n, -1, dtype=np.int32)
        self.size = 0

    def __contains__(self, rid: int) -> bool:
        return self._pos[rid] >= 0

    def add(self, rid: int) -> None:
        if self._pos[rid] >= 0:
            return
        if self.size == len(self._arr):
            self._arr = np.concatenate([self._arr, np.empty(len(self._arr), dtype=np.int64)])
        self._arr[self.size] = rid
        self._pos[rid] = self.size
        self.size += 1

    def remove(self, rid: int) -> None:
        i = int(self._pos[rid])
        if i < 0:
            return
        last = int(self._arr[self.size - 1])
        self._arr[i] = last
        self._pos[last] = i
        self._pos[rid] = -1
        self.size -= 1

    @property
    def ids(self) -> np.ndarray:
        return self._arr[: self.size]

    def reset(self, ids: np.ndarray) -> None:
        """Replace the set (for code that changed holdings without the manager's calls, such as
        the compiled engine core working on ``PagedKV.held`` directly)."""
        self._pos[self._arr[: self.size]] = -1
        ids = np.asarray(ids, dtype=np.int64)
        if len(ids) > len(self._arr):
            self._arr = np.empty(2 * len(ids), dtype=np.int64)
        self._arr[: len(ids)] = ids
        self._pos[ids] = np.arange(len(ids))
        self.size = len(ids)


def step_slots(computed: np.ndarray, holders: np.ndarray, ids: np.ndarray, num_new: np.ndarray,
               k: int, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Written slots and touched blocks per step of an iteration (``k == 1``) or decode run.

    Scheduled requests ``ids`` (all holders) write ``computed + num_new`` slots in step 1 and one
    more each later step; other holders keep ``computed``. Returns ``(used_slots[k],
    touched_blocks[k])`` summed over holders."""
    bs = block_size
    c_all = computed[holders]
    used0 = int(c_all.sum())
    touched_all = int((-(-c_all // bs)).sum())
    if len(ids) == 0:
        return np.full(k, used0, dtype=np.int64), np.full(k, touched_all, dtype=np.int64)
    c = computed[ids]
    s1 = c + num_new
    used = used0 + int(num_new.sum()) + len(ids) * np.arange(k, dtype=np.int64)
    touched = touched_all - int((-(-c // bs)).sum()) + touched_per_step(s1, k, bs)
    return used, touched


# --------------------------------------------------------------------------------
# servesim/kv/extents.py (main @ 41701e2)
# --------------------------------------------------------------------------------
class ExtentAllocator:
    def __init__(self, size: int, fit: str = "first"):
        if fit not in ("first", "best"):
            raise ValueError(f"fit {fit!r} is not 'first' or 'best'")
        self.size = int(size)
        self.fit = fit
        self.starts: list[int] = [0] if size > 0 else []
        self.lengths: list[int] = [size] if size > 0 else []
        self.free = int(size)

    def alloc(self, n: int) -> int:
        """Start of a new extent of ``n`` units, or -1 when no hole is large enough."""
        if n <= 0:
            raise ValueError(f"extent length {n} must be >= 1")
        i = -1
        if self.fit == "first":
            for j, length in enumerate(self.lengths):
                if length >= n:
                    i = j
                    break
        else:
            best = None
            for j, length in enumerate(self.lengths):
                if length >= n and (best is None or length < best):
                    best, i = length, j
        if i < 0:
            return -1
        start = self.starts[i]
        if self.lengths[i] == n:
            del self.starts[i]
            del self.lengths[i]
        else:
            self.starts[i] += n
            self.lengths[i] -= n
        self.free -= n
        return start

    def release(self, start: int, n: int) -> None:
        """Return ``[start, start + n)`` and merge it with adjacent holes."""
        i = bisect.bisect_left(self.starts, start)
        if i > 0 and self.starts[i - 1] + self.lengths[i - 1] > start:
            raise AssertionError(f"extent [{start}, {start + n}) overlaps a free hole")
        if i < len(self.starts) and start + n > self.starts[i]:
            raise AssertionError(f"extent [{start}, {start + n}) overlaps a free hole")
        merge_left = i > 0 and self.starts[i - 1] + self.lengths[i - 1] == start
        merge_right = i < len(self.starts) and self.starts[i] == start + n
        if merge_left and merge_right:
            self.lengths[i - 1] += n + self.lengths[i]
            del self.starts[i]
            del self.lengths[i]
        elif merge_left:
            self.lengths[i - 1] += n
        elif merge_right:
            self.starts[i] = start
            self.lengths[i] += n
        else:
            self.starts.insert(i, start)
            self.lengths.insert(i, n)
        self.free += n

    @property
    def largest(self) -> int:
        return max(self.lengths, default=0)

    def unusable(self, n: int) -> int:
        """Free units in holes smaller than ``n``: free memory that cannot hold an ``n``-unit extent."""
        return sum(length for length in self.lengths if length < n)

    def holes(self) -> list[tuple[int, int]]:
        return list(zip(self.starts, self.lengths))

    def check(self) -> None:
        prev_end = -1
        for s, length in zip(self.starts, self.lengths):
            if length <= 0 or s <= prev_end or s + length > self.size:
                raise AssertionError(f"bad free extent list {self.holes()}")
            prev_end = s + length
        if sum(self.lengths) != self.free:
            raise AssertionError("free extents do not add up to the free count")


# --------------------------------------------------------------------------------
# servesim/kv/counting.py (main @ 41701e2)
# --------------------------------------------------------------------------------
class CountingKV:
    def __init__(self, num_blocks: int, block_size: int, computed: np.ndarray, held_dtype=np.int64):
        self.num_blocks = int(num_blocks)
        self.block_size = int(block_size)
        self.free_blocks = int(num_blocks)
        self._computed = computed  # shared view of the request table's num_computed column
        self.held = np.zeros(len(computed), dtype=held_dtype)
        self.holders = Holders(len(computed))  # requests with held > 0 (for usage sums)

    def blocks_needed(self, slots: int) -> int:
        """Blocks a request holding ``slots`` token slots needs (scalar; subclasses decide)."""
        raise NotImplementedError

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self.free_blocks

    def reuse_prefix(self, rid: int, now: float) -> PrefixHit:
        """No prefix cache: nothing is reusable beyond what the request already computed."""
        return NO_HIT

    def allocate(self, rid: int, num_new: int) -> bool:
        """Make room for ``num_new`` more tokens of request ``rid``; False if the pool is short
        (then nothing changes)."""
        need = self.blocks_needed(int(self._computed[rid]) + num_new) - int(self.held[rid])
        if need <= 0:
            return True
        if need > self.free_blocks:
            return False
        if self.held[rid] == 0:
            self.holders.add(rid)
        self.held[rid] += need
        self.free_blocks -= need
        return True

    def free(self, rid: int) -> None:
        self.free_blocks += int(self.held[rid])
        self.held[rid] = 0
        self.holders.remove(rid)

    def check_counts(self) -> None:
        """Blocks held + free = total, and no count is negative."""
        held_total = int(self.held.sum())
        if held_total + self.free_blocks != self.num_blocks:
            raise AssertionError(
                f"KV invariant violated: held {held_total} + free {self.free_blocks} != total {self.num_blocks}")
        if self.free_blocks < 0 or (self.held < 0).any():
            raise AssertionError("KV invariant violated: negative block count")


# --------------------------------------------------------------------------------
# servesim/kv/paged.py (main @ 41701e2)
# --------------------------------------------------------------------------------
class PagedKV(CountingKV):
    name = "paged"

    def __init__(self, num_blocks: int, block_size: int, computed: np.ndarray):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        super().__init__(num_blocks, block_size, computed, np.int64)

    # -- queries ----------------------------------------------------------------------------
    def blocks_needed(self, slots: int) -> int:
        return -(-slots // self.block_size)

    def blocks_for(self, slots):
        return -(-slots // self.block_size)

    def max_slots(self) -> int:
        """The most token slots one request can ever hold (the whole pool)."""
        return self.num_blocks * self.block_size

    def used_slots_of(self, ids: np.ndarray) -> np.ndarray:
        return self._computed[ids]

    # -- allocation -------------------------------------------------------------------------
    def allocate_decodes(self, ids: np.ndarray) -> bool:
        """One more token for each of ``ids``, all or nothing."""
        if len(ids) == 0:
            return True
        want = -(-(self._computed[ids] + 1) // self.block_size)
        need = want - self.held[ids]
        total = int(need.sum())  # need is 0 or 1 for requests allocated exactly so far
        if total > self.free_blocks:
            return False
        if total:
            self.held[ids] = np.maximum(self.held[ids], want)
            self.free_blocks -= total
        return True

    # -- decode runs (the engine's fast path) -------------------------------------------------
    def decode_run(self, ids: np.ndarray, k_max: int) -> tuple[int, np.ndarray]:
        """How many consecutive decode steps of ``ids`` fit, and blocks in use during each.

        Step 1 is already allocated (the policy did it). Step ``j`` needs ``c + j`` slots for a
        request with ``c`` computed tokens, so it takes a new block exactly when
        ``(c + j - 1) % block_size == 0``: the new blocks of step ``j`` are the number of requests
        with ``(1 - c) mod block_size == j mod block_size``. Returns ``k <= k_max`` such that steps
        ``2..k`` all get their blocks, and ``used[j-1]`` = blocks in use during step ``j``.
        """
        bs = self.block_size
        used0 = self.num_blocks - self.free_blocks
        if k_max <= 1:
            return k_max, np.full(k_max, used0, dtype=np.int64)
        c = self._computed[ids]
        if bs == 1:
            per_step = np.full(k_max - 1, len(ids), dtype=np.int64)
        else:
            residue_count = np.bincount((1 - c) % bs, minlength=bs)
            per_step = residue_count[np.arange(2, k_max + 1) % bs]
        demand = np.cumsum(per_step)  # blocks needed by steps 2..j, j = 2..k_max
        if demand[-1] <= self.free_blocks:
            k = k_max
        else:
            k = int(np.searchsorted(demand, self.free_blocks, side="right")) + 1
            demand = demand[: k - 1]
        used = np.empty(k, dtype=np.int64)
        used[0] = used0
        used[1:] = used0 + demand
        return k, used

    def commit_decodes(self, ids: np.ndarray) -> None:
        """After a decode run advanced ``computed``, take the blocks its steps used."""
        want = -(-self._computed[ids] // self.block_size)
        extra = want - self.held[ids]
        self.held[ids] = want
        self.free_blocks -= int(extra.sum())

    def step_usage(self, ids: np.ndarray, num_new: np.ndarray, k: int = 1,
                   used: np.ndarray | None = None) -> StepUsage:
        """Slot accounting during each of the ``k`` steps that ``ids`` are about to run (called
        after the policy's allocation, before ``computed`` advances; ``k > 1``: a decode run, with
        ``used`` from :meth:`decode_run` when at hand). See :mod:`servesim.kv.frag`.

        Updated after the freeze (issue 11): blocks held with no written slot (a whole prompt's
        blocks taken at admission by the ``chunked`` policy) are reserved unused, not internal
        fragmentation; they stay as in step 1 during a decode run, whose scheduled requests fill
        every block they take. Written slots grow by one per scheduled request each step."""
        bs = self.block_size  # holders: kept by allocate/free (resync with holders.reset after compiled code)
        if used is None:
            used = np.full(k, self.num_blocks - self.free_blocks, dtype=np.int64)
            if k > 1:
                used[1:] += np.cumsum(run_demand(self._computed[ids], k, 0, bs))
        alloc = np.asarray(used[:k], dtype=np.int64) * bs
        held, c_ids = self._computed[self.holders.ids], self._computed[ids]
        written0 = int(held.sum()) + int(num_new.sum())
        touched = int((-(-held // bs)).sum()) + int((-(-(c_ids + num_new) // bs) - -(-c_ids // bs)).sum())
        slots = written0 + len(ids) * np.arange(k, dtype=np.int64)
        reserved = np.full(k, (self.num_blocks - self.free_blocks - touched) * bs, dtype=np.int64)
        return StepUsage(total_slots=self.num_blocks * bs, allocated=alloc, used=slots,
                         reserved_unused=reserved, external=np.zeros(k, dtype=np.int64))

    def check(self) -> None:
        """Blocks in use + free = total; no negative counts."""
        self.check_counts()


# --------------------------------------------------------------------------------
# servesim/kv/elastic.py (main @ 41701e2)
# --------------------------------------------------------------------------------
class ElasticKV(CountingKV):
    name = "elastic"

    def __init__(self, num_blocks: int, block_size: int, computed: np.ndarray, base_blocks: int,
                 growth_blocks: int):
        if num_blocks < 1 or block_size < 1 or base_blocks < 1 or growth_blocks < 1:
            raise ValueError(f"need num_blocks, block_size, base_blocks, growth_blocks >= 1, got "
                             f"{num_blocks}, {block_size}, {base_blocks}, {growth_blocks}")
        super().__init__(num_blocks, block_size, computed, np.int32)
        self.base = int(base_blocks)
        self.growth = int(growth_blocks)

    # -- geometry -----------------------------------------------------------------------------
    def hold_for(self, slots):
        """Blocks reserved for a sequence of ``slots`` token slots (0 for 0), scalar or array."""
        s = np.asarray(slots, dtype=np.int64)
        base_slots = self.base * self.block_size
        grow = -(-np.maximum(s - base_slots, 0) // (self.growth * self.block_size))
        h = np.where(s > 0, self.base + self.growth * grow, 0)
        return int(h) if h.ndim == 0 else h

    def _hold_pos(self, s: np.ndarray) -> np.ndarray:
        """:meth:`hold_for` of positive slot counts (the decode path: no zero case)."""
        over = s - self.base * self.block_size
        p = self.growth * self.block_size
        return self.base + self.growth * (-(-np.maximum(over, 0) // p))

    def max_slots(self) -> int:
        """The longest sequence whose reservation fits the pool (0 if not even the base fits)."""
        if self.num_blocks < self.base:
            return 0
        return (self.base + (self.num_blocks - self.base) // self.growth * self.growth) * self.block_size

    # -- allocation -----------------------------------------------------------------------------
    def blocks_needed(self, slots: int) -> int:
        """:meth:`hold_for` of one slot count, in scalars (the admission path)."""
        if slots <= 0:
            return 0
        over = slots - self.base * self.block_size
        return self.base + (self.growth * (-(-over // (self.growth * self.block_size))) if over > 0 else 0)

    def allocate_decodes(self, ids: np.ndarray) -> bool:
        if len(ids) == 0:
            return True
        need = self._hold_pos(self._computed[ids] + 1) - self.held[ids]
        if need.max() <= 0:
            return True
        need = np.maximum(need, 0)
        total = int(need.sum())
        if total > self.free_blocks:
            return False
        self.held[ids] += need
        self.free_blocks -= total
        return True

    # -- decode runs ----------------------------------------------------------------------------
    def _run_used(self, ids: np.ndarray, k_max: int) -> np.ndarray:
        used = np.full(k_max, self.num_blocks - self.free_blocks, dtype=np.int64)
        if k_max > 1:
            d = run_demand(self._computed[ids], k_max, self.base * self.block_size,
                           self.growth * self.block_size, self.growth)
            used[1:] += np.cumsum(d)
        return used

    def decode_run(self, ids: np.ndarray, k_max: int) -> tuple[int, np.ndarray]:
        """As :meth:`PagedKV.decode_run`, with growth chunks instead of single blocks."""
        if k_max <= 1:
            return k_max, np.full(k_max, self.num_blocks - self.free_blocks, dtype=np.int64)
        used = self._run_used(ids, k_max)
        k = int(np.searchsorted(used, self.num_blocks, side="right"))
        return k, used[:k]

    def commit_decodes(self, ids: np.ndarray) -> None:
        extra = self._hold_pos(self._computed[ids]) - self.held[ids]
        if extra.max() > 0:
            extra = np.maximum(extra, 0)
            self.held[ids] += extra
            self.free_blocks -= int(extra.sum())

    # -- metrics ----------------------------------------------------------------------------------
    def step_usage(self, ids: np.ndarray, num_new: np.ndarray, k: int = 1,
                   used: np.ndarray | None = None) -> StepUsage:
        bs = self.block_size
        slots, touched = step_slots(self._computed, self.holders.ids, ids, num_new, k, bs)
        if used is None:
            used = self._run_used(ids, k)
        alloc = np.asarray(used[:k], dtype=np.int64) * bs
        return StepUsage(total_slots=self.num_blocks * bs, allocated=alloc, used=slots,
                         reserved_unused=alloc - touched * bs, external=np.zeros(k, dtype=np.int64))

    def check(self) -> None:
        self.check_counts()
        h = self.holders.ids
        if (self.held[h] < self.hold_for(self._computed[h])).any():
            raise AssertionError("KV invariant violated: a sequence holds less than its reservation")


# --------------------------------------------------------------------------------
# servesim/kv/static.py (main @ 41701e2)
# --------------------------------------------------------------------------------
class StaticKV:
    name = "static"

    def __init__(self, num_blocks: int, block_size: int, computed: np.ndarray, reserve_tokens: np.ndarray,
                 fit: str = "first"):
        """``reserve_tokens[rid]``: slots request ``rid`` reserves on admission."""
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = int(num_blocks)
        self.block_size = int(block_size)
        self._computed = computed
        self.reserve = (-(-np.asarray(reserve_tokens, dtype=np.int64) // block_size)).astype(np.int32)  # blocks
        self.extents = ExtentAllocator(num_blocks, fit)
        self.start = np.full(len(computed), -1, dtype=np.int32)
        self.held = np.zeros(len(computed), dtype=np.int32)
        self.holders = Holders(len(computed))
        big = self.reserve[self.reserve <= self.num_blocks]
        self.next_need = int(big.min()) if len(big) else self.num_blocks + 1
        self.failed = 0  # allocation attempts that found no hole (with enough free blocks: fragmentation)

    @property
    def free_blocks(self) -> int:
        return self.extents.free

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self.extents.free

    def max_slots(self) -> int:
        """A request is admissible when its reservation fits the empty pool (the engine rejects
        ``total - 1 > max_slots()``); with uniform reservations larger than the pool nothing is."""
        if (self.reserve > self.num_blocks).all():
            return 0
        return self.num_blocks * self.block_size - 1

    def capacity_of(self, rid: int) -> int:
        return int(self.held[rid]) * self.block_size

    # -- allocation -------------------------------------------------------------------------------
    def reuse_prefix(self, rid: int, now: float) -> PrefixHit:
        return NO_HIT

    def allocate(self, rid: int, num_new: int) -> bool:
        slots = int(self._computed[rid]) + num_new
        if self.held[rid] == 0:
            n = int(self.reserve[rid])
            self.next_need = n
            if n > self.num_blocks or slots > n * self.block_size:
                return False
            start = self.extents.alloc(n)
            if start < 0:
                self.failed += 1
                return False
            self.start[rid] = start
            self.held[rid] = n
            self.holders.add(rid)
        return slots <= self.held[rid] * self.block_size

    def allocate_decodes(self, ids: np.ndarray) -> bool:
        return bool((self._computed[ids] + 1 <= self.held[ids] * self.block_size).all())

    def free(self, rid: int) -> None:
        if self.held[rid]:
            self.extents.release(int(self.start[rid]), int(self.held[rid]))
            self.held[rid] = 0
            self.start[rid] = -1
            self.holders.remove(rid)

    def decode_run(self, ids: np.ndarray, k_max: int) -> tuple[int, np.ndarray]:
        """Step ``j`` needs ``computed + j`` slots inside each reservation."""
        used = self.num_blocks - self.extents.free
        if k_max >= 1 and len(ids):
            room = int((self.held[ids] * self.block_size - self._computed[ids]).min())
            k_max = max(1, min(k_max, room))
        return k_max, np.full(k_max, used, dtype=np.int64)

    def commit_decodes(self, ids: np.ndarray) -> None:
        """Nothing to take: decodes write into the reservation."""

    # -- metrics ----------------------------------------------------------------------------------
    def external_slots(self) -> int:
        return self.extents.unusable(self.next_need) * self.block_size

    def step_usage(self, ids: np.ndarray, num_new: np.ndarray, k: int = 1,
                   used: np.ndarray | None = None) -> StepUsage:
        bs = self.block_size
        slots, touched = step_slots(self._computed, self.holders.ids, ids, num_new, k, bs)
        alloc = np.full(k, (self.num_blocks - self.extents.free) * bs, dtype=np.int64)
        return StepUsage(total_slots=self.num_blocks * bs, allocated=alloc, used=slots,
                         reserved_unused=alloc - touched * bs,
                         external=np.full(k, self.external_slots(), dtype=np.int64))

    def check(self) -> None:
        self.extents.check()
        if int(self.held.sum()) + self.extents.free != self.num_blocks:
            raise AssertionError("KV invariant violated: reserved + free != total")
        h = self.holders.ids
        if (self._computed[h] > self.held[h] * self.block_size).any():
            raise AssertionError("KV invariant violated: a request wrote past its reservation")
        # live extents must not overlap each other
        order = np.argsort(self.start[h])
        s, n = self.start[h][order], self.held[h][order]
        if len(s) > 1 and (s[1:] < s[:-1] + n[:-1]).any():
            raise AssertionError("KV invariant violated: overlapping reservations")
