"""The Python face of the KV kernels: one object per pool, for the object-level engine and tests.

The paged, elastic and static allocators are written once, as kernels over a
:class:`~servesim.kv.kernels.KVState` (:mod:`servesim.kv.kernels`). :class:`KernelKV` keeps the
:class:`~servesim.kv.base.KVManager` contract on top of them: it owns the state (``.state``), a
view of the request table's ``computed`` column and the holder set (requests with blocks, kept by
``allocate``/``free``; the kernels take it as an argument), and turns the kernels' return codes
into exceptions. No allocation rule lives here: every method is one kernel call plus conversion.

``pure=True`` runs the same kernels uncompiled (``servesim.jit.pure``), for the reference engine.
"""

from __future__ import annotations

import numpy as np

from servesim.kv.base import NO_HIT, KVUsage, PrefixHit
from servesim.kv.frag import StepUsage
from servesim.kv.kernels import KVState, check_message
from servesim.kv.kernelset import kernel_set
from servesim.kv.steps import Holders

_NO_STEPS = np.zeros(0, dtype=np.int64)


def as_ids(ids) -> np.ndarray:
    """Request ids as the kernels take them: a contiguous int64 array."""
    return np.ascontiguousarray(ids, dtype=np.int64)


class KernelKV:
    name = ""
    prefix_caching = False

    def __init__(self, state: KVState, computed: np.ndarray, pure: bool = False):
        self.state = state
        self._computed = computed  # shared view of the request table's num_computed column
        self.holders = Holders(len(computed))  # requests with held > 0 (for usage sums)
        self._pure = pure
        self._bound = None  # the kernels bound to this pool, on first use (the engine never needs them)

    @property
    def _k(self):
        """The kernels for this pool's argument types (every array argument below: as_ids or
        fixed); bound on first use: binding loads them (~0.7 s the first time in a process)."""
        if self._bound is None:
            self._bound = kernel_set(self._pure).bind(self.state, self._computed)
        return self._bound

    def resync(self) -> None:
        """After the engine's kernels changed holdings directly (they take the state, not this
        object): rebuild the holder set from ``held``."""
        self.holders.reset(np.flatnonzero(self.state.held > 0))

    # -- geometry and counts ---------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self.state.num_blocks

    @property
    def block_size(self) -> int:
        return self.state.block_size

    @property
    def held(self) -> np.ndarray:
        """Blocks held (or reserved) per request, int32."""
        return self.state.held

    @property
    def free_blocks(self) -> int:
        return int(self.state.s[0].free)

    @free_blocks.setter
    def free_blocks(self, value: int) -> None:
        """For code that changed holdings itself (the compiled engine core works on ``held``)."""
        self.state.s[0].free = value

    @property
    def used_blocks(self) -> int:
        return self.state.num_blocks - int(self.state.s[0].free)

    def max_slots(self) -> int:
        return int(self._k.kv_max_slots(self.state))

    def reuse_prefix(self, rid: int, now: float) -> PrefixHit:
        """No prefix cache: nothing is reusable beyond what the request already computed."""
        return NO_HIT

    # -- allocation -------------------------------------------------------------------------------
    def allocate(self, rid: int, num_new: int) -> bool:
        """Make room for ``num_new`` more tokens of request ``rid``; False if the pool is short."""
        held = self.state.held
        was = held[rid]
        ok = self._k.kv_allocate(self.state, self._computed, rid, num_new)
        if was == 0 and held[rid] > 0:
            self.holders.add(rid)
        return bool(ok)

    def allocate_decodes(self, ids: np.ndarray) -> bool:
        """One more token for each of ``ids``, all or nothing."""
        ids = as_ids(ids)
        return bool(self._k.kv_allocate_decodes(self.state, self._computed, ids, len(ids)))

    def free(self, rid: int) -> None:
        if self._k.kv_free(self.state, rid):  # static, corrupted state: nothing was changed
            start, n = int(self.state.start[rid]), int(self.state.held[rid])
            raise AssertionError(f"extent [{start}, {start + n}) overlaps a free hole")
        self.holders.remove(rid)

    # -- decode runs (the engine's fast path) --------------------------------------------------------
    def decode_run(self, ids: np.ndarray, k_max: int) -> tuple[int, np.ndarray]:
        """How many consecutive decode steps of ``ids`` fit (step 1 is already allocated), and
        blocks in use during each."""
        ids = as_ids(ids)
        used = np.empty(max(k_max, 1), dtype=np.int64)
        k = int(self._k.kv_decode_run(self.state, self._computed, ids, len(ids), k_max, used))
        return k, used[:k]

    def commit_decodes(self, ids: np.ndarray) -> None:
        """After a decode run advanced ``computed``, take the blocks its steps used."""
        ids = as_ids(ids)
        self._k.kv_commit_decodes(self.state, self._computed, ids, len(ids))

    def stable_steps(self, ids: np.ndarray, k: int) -> int:
        """Every step of a run: no allocation here changes what a policy would decide."""
        return k

    # -- metrics -------------------------------------------------------------------------------------
    def step_usage(self, ids: np.ndarray, num_new: np.ndarray, k: int = 1,
                   used: np.ndarray | None = None) -> StepUsage:
        """Slot accounting during each of the ``k`` steps that ``ids`` are about to run (called
        after the policy's allocation, before ``computed`` advances; ``k > 1``: a decode run, with
        ``used`` from :meth:`decode_run` when at hand). See :mod:`servesim.kv.frag`."""
        ids, new = as_ids(ids), np.ascontiguousarray(num_new, dtype=np.int64)
        if used is None:
            used = _NO_STEPS
            if k > 1:
                used = np.empty(k, dtype=np.int64)
                self._k.kv_run_used(self.state, self._computed, ids, len(ids), k, used)
        out = np.empty((5, k))
        h = self.holders
        self._k.kv_step_usage(self.state, self._computed, h.ids, h.size, ids, new, len(ids), k,
                              as_ids(used), out)
        rows = out.astype(np.int64)
        return StepUsage(total_slots=self.num_blocks * self.block_size, allocated=rows[3], used=rows[4],
                         reserved_unused=rows[1], external=rows[2])

    def _usage_numbers(self) -> np.ndarray:
        out = np.empty(7, dtype=np.int64)
        h = self.holders
        self._k.kv_usage(self.state, self._computed, h.ids, h.size, out)
        return out

    def usage(self) -> KVUsage:
        total, alloc, used, reserved, largest, free, _ = (int(x) for x in self._usage_numbers())
        return KVUsage(total_slots=total, allocated_slots=alloc, used_slots=used, reserved_unused_slots=reserved,
                       largest_free_extent=largest, free_slots=free)

    # -- invariants ----------------------------------------------------------------------------------
    def check(self) -> None:
        h = self.holders
        code = self._k.kv_check(self.state, self._computed, h.ids, h.size)
        if code:
            raise AssertionError(check_message(self.state, int(code)))
