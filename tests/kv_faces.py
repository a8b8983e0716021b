"""Python faces over the KV kernels, for tests: one object per pool, kernel return codes as
exceptions.

The library's paged, elastic and static allocators are kernels over a
:class:`~servesim.kv.kernels.KVState` (servesim/kv/kernels.py); the engine and the factory use the
state itself. Tests drive the same kernels through these objects, with the interface of the
frozen pre-kernel classes in tests/kv_reference.py (the oracle), so random operation sequences can
run against both in lockstep. No allocation rule lives here: every method is one kernel call plus
conversion. ``pure=True`` runs the kernels uncompiled (``servesim.jit.pure``).
"""

from __future__ import annotations

import numpy as np

from servesim.jit import pure as make_pure
from servesim.kv import kernels as K
from tests.reference_kv.base import NO_HIT, PrefixHit
from servesim.kv.frag import StepUsage
from tests.reference_kv.steps import Holders

_NO_STEPS = np.zeros(0, dtype=np.int64)


def as_ids(ids) -> np.ndarray:
    return np.ascontiguousarray(ids, dtype=np.int64)


class _Kernels:
    """The entry kernels, compiled or as plain Python."""

    _sets: dict[bool, "_Kernels"] = {}

    def __init__(self, pure: bool):
        for name in ("kv_allocate", "kv_allocate_decodes", "kv_free", "kv_decode_run", "kv_run_used",
                     "kv_commit_decodes", "kv_step_usage", "kv_check", "kv_max_slots", "kv_blocks_needed",
                     "extent_alloc", "extent_release", "extent_unusable", "extent_largest", "extents_check"):
            k = getattr(K, name)
            setattr(self, name, make_pure(k) if pure else k)

    @classmethod
    def of(cls, pure: bool) -> "_Kernels":
        if pure not in cls._sets:
            cls._sets[pure] = cls(pure)
        return cls._sets[pure]


class KernelKV:
    name = ""
    prefix_caching = False

    def __init__(self, state: K.KVState, computed: np.ndarray, pure: bool = False):
        self.state = state
        self._computed = computed
        self.holders = Holders(len(computed))  # requests with held > 0 (for the kernels' sums)
        self._k = _Kernels.of(pure)

    num_blocks = property(lambda self: self.state.num_blocks)
    block_size = property(lambda self: self.state.block_size)
    held = property(lambda self: self.state.held)

    @property
    def free_blocks(self) -> int:
        return int(self.state.s[0].free)

    @free_blocks.setter
    def free_blocks(self, value: int) -> None:  # (tests corrupt states on purpose)
        self.state.s[0].free = value

    used_blocks = property(lambda self: self.state.num_blocks - int(self.state.s[0].free))

    def max_slots(self) -> int:
        return int(self._k.kv_max_slots(self.state))

    def blocks_needed(self, slots: int) -> int:
        return int(self._k.kv_blocks_needed(self.state, int(slots)))

    def reuse_prefix(self, rid: int, now: float) -> PrefixHit:
        """No prefix cache: nothing is reusable beyond what the request already computed."""
        return NO_HIT

    def stable_steps(self, ids, k: int) -> int:
        return k

    def allocate(self, rid: int, num_new: int) -> bool:
        was = self.state.held[rid]
        ok = self._k.kv_allocate(self.state, self._computed, rid, num_new)
        if was == 0 and self.state.held[rid] > 0:
            self.holders.add(rid)
        return bool(ok)

    def allocate_decodes(self, ids) -> bool:
        ids = as_ids(ids)
        return bool(self._k.kv_allocate_decodes(self.state, self._computed, ids, len(ids)))

    def free(self, rid: int) -> None:
        if self._k.kv_free(self.state, rid):
            start, n = int(self.state.start[rid]), int(self.state.held[rid])
            raise AssertionError(f"extent [{start}, {start + n}) overlaps a free hole")
        self.holders.remove(rid)

    def decode_run(self, ids, k_max: int) -> tuple[int, np.ndarray]:
        ids = as_ids(ids)
        used = np.empty(max(k_max, 1), dtype=np.int64)
        k = int(self._k.kv_decode_run(self.state, self._computed, ids, len(ids), k_max, used))
        return k, used[:k]

    def commit_decodes(self, ids) -> None:
        ids = as_ids(ids)
        self._k.kv_commit_decodes(self.state, self._computed, ids, len(ids))

    def step_usage(self, ids, num_new, k: int = 1, used: np.ndarray | None = None) -> StepUsage:
        ids, new = as_ids(ids), np.ascontiguousarray(num_new, dtype=np.int64)
        if used is None:
            used = _NO_STEPS
            if k > 1:
                used = np.empty(k, dtype=np.int64)
                self._k.kv_run_used(self.state, self._computed, ids, len(ids), k, used)
        out = np.empty((5, k))
        h = self.holders
        self._k.kv_step_usage(self.state, self._computed, h.ids, h.size, ids, new, len(ids), k, as_ids(used), out)
        rows = out.astype(np.int64)
        return StepUsage(total_slots=self.num_blocks * self.block_size, allocated=rows[3], used=rows[4],
                         reserved_unused=rows[1], external=rows[2])

    def check(self) -> None:
        h = self.holders
        code = self._k.kv_check(self.state, self._computed, h.ids, h.size)
        if code:
            raise AssertionError(K.check_message(self.state, int(code)))


class PagedKV(KernelKV):
    name = "paged"

    def __init__(self, num_blocks: int, block_size: int, computed: np.ndarray, pure: bool = False):
        super().__init__(K.make_kv(K.PAGED, num_blocks, block_size, len(computed)), computed, pure)


class ElasticKV(KernelKV):
    name = "elastic"

    def __init__(self, num_blocks: int, block_size: int, computed: np.ndarray, base_blocks: int,
                 growth_blocks: int, pure: bool = False):
        super().__init__(K.make_kv(K.ELASTIC, num_blocks, block_size, len(computed), base_blocks=base_blocks,
                                   growth_blocks=growth_blocks), computed, pure)

    base = property(lambda self: self.state.base)
    growth = property(lambda self: self.state.growth)


class StaticKV(KernelKV):
    name = "static"

    def __init__(self, num_blocks: int, block_size: int, computed: np.ndarray, reserve_tokens: np.ndarray,
                 fit: str = "first", pure: bool = False):
        state = K.make_kv(K.STATIC, num_blocks, block_size, len(computed), reserve_tokens=reserve_tokens, fit=fit)
        super().__init__(state, computed, pure)
        self.extents = ExtentAllocator.view(state, pure)

    reserve = property(lambda self: self.state.reserve)
    start = property(lambda self: self.state.start)
    next_need = property(lambda self: int(self.state.s[0].next_need))
    failed = property(lambda self: int(self.state.s[0].failed))

    def external_slots(self) -> int:
        return self.extents.unusable(self.next_need) * self.block_size


class ExtentAllocator:
    """The static pool's free holes as an object (standalone, or a view of a pool's holes)."""

    def __init__(self, size: int, fit: str = "first", pure: bool = False):
        if fit not in K.FITS:
            raise ValueError(f"fit {fit!r} is not 'first' or 'best'")
        self.size, self.fit = int(size), fit
        cap = self.size // 2 + 1  # holes are separated by at least one used unit
        self.hole_start, self.hole_len = np.zeros(cap, dtype=np.int64), np.zeros(cap, dtype=np.int64)
        self.s = K.scalars(self.size)
        if self.size > 0:
            self.hole_len[0] = self.size
            self.s[0].nholes = 1
        self._k = _Kernels.of(pure)

    @classmethod
    def view(cls, kv: K.KVState, pure: bool = False) -> "ExtentAllocator":
        ex = cls.__new__(cls)
        ex.size, ex.fit = kv.num_blocks, "first" if kv.fit == K.FIRST else "best"
        ex.hole_start, ex.hole_len, ex.s = kv.hole_start, kv.hole_len, kv.s
        ex._k = _Kernels.of(pure)
        return ex

    free = property(lambda self: int(self.s[0].free))
    largest = property(lambda self: int(self._k.extent_largest(self.hole_len, self.s)))

    def alloc(self, n: int) -> int:
        if n <= 0:
            raise ValueError(f"extent length {n} must be >= 1")
        return int(self._k.extent_alloc(self.hole_start, self.hole_len, self.s, K.FITS[self.fit], n))

    def release(self, start: int, n: int) -> None:
        code = self._k.extent_release(self.hole_start, self.hole_len, self.s, start, n)
        if code == K.RELEASE_OVERLAP:
            raise AssertionError(f"extent [{start}, {start + n}) overlaps a free hole")
        if code:
            raise AssertionError(f"no room for another free hole releasing [{start}, {start + n})")

    def unusable(self, n: int) -> int:
        return int(self._k.extent_unusable(self.hole_len, self.s, n))

    def holes(self) -> list[tuple[int, int]]:
        return K.holes(self)

    def check(self) -> None:
        code = self._k.extents_check(self.hole_start, self.hole_len, self.s, self.size)
        if code:
            raise AssertionError(K.check_message(self, int(code)))
