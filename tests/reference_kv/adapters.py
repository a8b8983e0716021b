"""The engine's KV kernel calls bound to a Python KV manager (the reference object): what the
engine's driver binds for a KV object's ``kernel_overrides()`` (moved here from
servesim/engine/driver.py with the object path)."""

from __future__ import annotations

from servesim.kv import kernels as kvk
from servesim.sched import parts, reserve


def object_kv_overrides(kv_obj) -> dict:
    """Bind the kernels' KV calls to a Python KV manager (tests/reference_tests/reference_kv/base.py's contract):
    what the engine's driver binds for a KV object that offers ``kernel_overrides()``."""

    def decode_run(kv, computed, ids, nb, k_max, used):
        k, u = kv_obj.decode_run(ids[:nb], int(k_max))
        used[:k] = u[:k]
        return k

    def step_usage(kv, computed, holders, nh, ids, new, nb, k, used, out):
        u = kv_obj.step_usage(ids[:nb], new[:nb], int(k), used[:k])
        out[0, :k] = u.allocated - u.used - u.reserved_unused
        out[1, :k] = u.reserved_unused
        out[2, :k] = u.external

    def check(kv, computed, holders, nh):
        kv_obj.check()  # raises AssertionError with its own message
        return 0

    def lookup(kv, computed, rid, now):
        hit = kv_obj.reuse_prefix(int(rid), now)
        return hit.tokens, hit.ready_at

    return {
        parts.kv_stable_steps: lambda kv, computed, ids, nb, k: kv_obj.stable_steps(ids[:nb], int(k)),
        kvk.kv_allocate: lambda kv, computed, rid, n: kv_obj.allocate(int(rid), int(n)),
        kvk.kv_allocate_decodes: lambda kv, computed, ids, nb: kv_obj.allocate_decodes(ids[:nb]),
        kvk.kv_free: lambda kv, rid: kv_obj.free(int(rid)),
        kvk.kv_free_blocks: lambda kv: kv_obj.free_blocks,
        kvk.kv_used_blocks: lambda kv: kv_obj.used_blocks,
        kvk.kv_decode_run: decode_run,
        kvk.kv_commit_decodes: lambda kv, computed, ids, nb: kv_obj.commit_decodes(ids[:nb]),
        kvk.kv_step_usage: step_usage,
        kvk.kv_check: check,
        parts.kv_prefix_lookup: lookup,
        parts.kv_holds: lambda kv, rid: kv_obj.held[rid] > 0,
        parts.kv_held_blocks: lambda kv, rid: int(kv_obj.held[rid]),
        # a prefix cache (the reference PrefixCacheKV) shares blocks: the engine's slots check
        # is skipped there, as for the compiled prefix pool (kv/kernels.py kv_slots_held)
        kvk.kv_slots_held: lambda kv, rid: -1 if getattr(kv_obj, "prefix_caching", True) else
        int(kv_obj.held[rid]) * int(kv_obj.block_size),
        parts.kv_blocks_to_take: lambda kv, computed, rid, n: max(
            0, -(-(int(computed[rid]) + int(n)) // kv_obj.block_size) - int(kv_obj.held[rid])),
        reserve.kv_waiting_blocks: lambda kv, rid: int(kv_obj.held[rid]),
    }

