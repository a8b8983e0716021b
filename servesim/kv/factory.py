"""Build the KV manager a scenario asks for (one name -> class mapping, no registry boilerplate).

::

    engine.kv_allocator   enable_prefix_caching   kv_tiers   ->  manager
    paged                 false                   -              KVState PAGED    (counts only)
    paged                 true                    [] or [..]     PrefixCacheKV    (block ids, hashes,
                                                                                    + TierStack)
    static                false                   -              KVState STATIC   (extents)
    elastic               false                   -              KVState ELASTIC

The three allocators without prefix caching are kernels over one pool state (kv/kernels.py):
the factory returns the state itself, which the engine's kernels take. The prefix cache is an
object with the :class:`~servesim.kv.base.KVManager` contract (the engine binds its methods in
place of the kernels, on the uncompiled path).

Prefix chains are mapped here to the engine's block size (and session turns get their output
blocks' hashes, :mod:`servesim.kv.chains`). A workload without chains under prefix caching gives
exactly the plain paged results.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from servesim.kv.kernels import ELASTIC, PAGED, STATIC, KVState, make_kv

if TYPE_CHECKING:
    import simpy

    from servesim.request import RequestTable
    from servesim.kv.base import KVManager
    from servesim.memory import MemoryPlan
    from servesim.request import Workload
    from servesim.scenario import Scenario

GIB = 1 << 30


def build_kv(sc: "Scenario", plan: "MemoryPlan", table: "RequestTable", workload: "Workload",
             env: "simpy.Environment | None") -> "KVState | KVManager":
    e = sc.engine
    bs = e.block_size
    if e.kv_allocator == "static":
        cfg = e.kv.static
        if cfg.reserve == "max_model_len":
            reserve = np.full(table.n, sc.max_model_len, dtype=np.int64)
        else:
            reserve = table.prompt + table.output
        return make_kv(STATIC, plan.num_blocks, bs, table.n, reserve_tokens=reserve, fit=cfg.fit)
    if e.kv_allocator == "elastic":
        cfg = e.kv.elastic
        return make_kv(ELASTIC, plan.num_blocks, bs, table.n, base_blocks=-(-cfg.base_tokens // bs),
                       growth_blocks=-(-cfg.growth_tokens // bs))
    if not e.enable_prefix_caching:
        return make_kv(PAGED, plan.num_blocks, bs, table.n)
    return build_prefix_cache(sc, plan, table, workload, env)


def build_prefix_cache(sc: "Scenario", plan: "MemoryPlan", table: "RequestTable", workload: "Workload",
                       env: "simpy.Environment | None"):
    from servesim.hardware import GPUS
    from servesim.kv.chains import engine_chains
    from servesim.kv.prefix import PrefixCacheKV

    e = sc.engine
    bs = e.block_size
    offsets, hashes = engine_chains(workload, bs, e.kv.hash_outputs)
    tiers = None
    if sc.kv_tiers:
        from servesim.kv.tiers import Link, LowerTier, TierStack

        block_bytes = plan.kv_bytes_per_token * bs  # one GPU's slice of a block
        replica_block_bytes = block_bytes * sc.gpus_per_replica
        pcie = GPUS[sc.hardware.gpu].pcie_bytes_per_s
        levels = []
        for i, t in enumerate(sc.kv_tiers):
            name = t.name or f"L{i + 2}"
            bw, lat = t.resolved(pcie)
            link = Link(f"{name}-link", bw, lat, t.channels, env)
            # a pipeline replica's virtual engines share its tiers as they share its GPU blocks: each
            # holds 1/pp of a tier (vLLM divides its CPU blocks by the pipeline size too)
            blocks = int(t.capacity_gib * GIB // replica_block_bytes) // sc.pp
            if blocks < 1:  # (a tier of 0 blocks ran, holding nothing, with no word)
                from servesim.errors import ScenarioError

                need = replica_block_bytes * sc.pp / GIB
                raise ScenarioError(f"{sc.name}: kv_tiers[{i}] ({name}) capacity_gib {t.capacity_gib:g} holds no KV "
                                    f"block of {replica_block_bytes:,} bytes (block_size {bs} tokens"
                                    f"{f', {sc.pp} pipeline stages' if sc.pp > 1 else ''}); allowed: capacity_gib "
                                    f">= {need:.3g} (one block)")
            levels.append(LowerTier(name, blocks, link))
        tiers = TierStack(levels, block_bytes)
    hot = None
    if e.kv.preload is not None:
        from servesim.kv.preload import HotPrefixTracker

        p = e.kv.preload
        hot = HotPrefixTracker(p.min_hits, p.window_s, max(1, int(p.max_share * plan.num_blocks)))
    return PrefixCacheKV(plan.num_blocks, bs, table, offsets, hashes, eviction=e.prefix_cache_eviction,
                         protect_share=e.kv.protect_share, tiers=tiers, hot=hot)
