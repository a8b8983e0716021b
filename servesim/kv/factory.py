"""Build the KV manager a scenario asks for (one name -> class mapping, no registry boilerplate).

::

    engine.kv_allocator   enable_prefix_caching   kv_tiers   ->  manager
    paged                 false                   -              KVState PAGED    (counts only)
    paged                 true                    [] or [..]     PrefixPool       (KVState PAGED, prefix 1:
                                                                                    block ids, hashes, tiers)
    static                false                   -              KVState STATIC   (extents)
    elastic               false                   -              KVState ELASTIC

Every pool is kernels over one state (kv/kernels.py; the prefix cache's rules in kv/pcache.py,
kv/pqueue.py, kv/ptiers.py): the factory returns the state itself, or for a prefix cache a
:class:`~servesim.kv.pstate.PrefixPool` holding it (``.state``) with its counters for the reports.
``OBJECT_REFERENCE`` (the tests') builds the frozen Python reference manager instead
(tests/reference_kv: the equivalence tests bind it into the uncompiled engine).

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

    from servesim.kv.pstate import PrefixPool
    from servesim.request import RequestTable
    from servesim.memory import MemoryPlan
    from servesim.request import Workload
    from servesim.scenario import Scenario

GIB = 1 << 30


def build_kv(sc: "Scenario", plan: "MemoryPlan", table: "RequestTable", workload: "Workload",
             env: "simpy.Environment | None", shared: "SharedLinks | None" = None) -> "KVState | PrefixPool":
    """``shared``: the fleet's links marked ``shared_link`` (:class:`SharedLinks`); None for a
    lone replica (its links are its own)."""
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
    return build_prefix_cache(sc, plan, table, workload, env, shared)


# tests: a builder of the frozen Python reference object (tests/reference_kv/build.py
# ``build_reference``) to build instead of the kernels' pool; None: the kernels
OBJECT_REFERENCE = None


def build_prefix_cache(sc: "Scenario", plan: "MemoryPlan", table: "RequestTable", workload: "Workload",
                       env: "simpy.Environment | None", shared: "SharedLinks | None" = None):
    from servesim.hardware import GPUS
    from servesim.kv.chains import engine_chains

    e = sc.engine
    bs = e.block_size
    offsets, hashes = engine_chains(workload, bs, e.kv.hash_outputs)
    specs = []
    block_bytes = plan.kv_bytes_per_token * bs  # one GPU's slice of a block
    if sc.kv_tiers:
        from servesim.kv.pstate import TierSpec

        replica_block_bytes = block_bytes * sc.gpus_per_replica
        pcie = GPUS[sc.hardware.gpu].pcie_bytes_per_s
        for i, t in enumerate(sc.kv_tiers):
            bw, lat = t.resolved(pcie)
            # a pipeline replica's virtual engines share its tiers as they share its GPU blocks: each
            # holds 1/pp of a tier (vLLM divides its CPU blocks by the pipeline size too)
            name = t.name or f"L{i + 2}"
            blocks = int(t.capacity_gib * GIB // replica_block_bytes) // sc.pp
            if blocks < 1:  # (a tier of 0 blocks ran, holding nothing, with no word)
                from servesim.errors import ScenarioError

                need = replica_block_bytes * sc.pp / GIB
                raise ScenarioError(f"{sc.name}: kv_tiers[{i}] ({name}) capacity_gib {t.capacity_gib:g} holds no KV "
                                    f"block of {replica_block_bytes:,} bytes (block_size {bs} tokens"
                                    f"{f', {sc.pp} pipeline stages' if sc.pp > 1 else ''}); allowed: capacity_gib "
                                    f">= {need:.3g} (one block)")
            row = shared.row[link_key(name, bw, lat, t.channels)] if t.shared_link and shared is not None else -1
            specs.append(TierSpec(name=name, bandwidth=bw, latency=lat, channels=t.channels, capacity=blocks,
                                  shared_row=row))
    hot = None
    if e.kv.preload is not None:
        p = e.kv.preload
        hot = (p.min_hits, p.window_s, max(1, int(p.max_share * plan.num_blocks)))
    if OBJECT_REFERENCE is not None:
        return OBJECT_REFERENCE(sc, plan, table, offsets, hashes, specs, block_bytes, hot, shared)
    from servesim.kv.pstate import PrefixPool, make_prefix_kv

    state = make_prefix_kv(plan.num_blocks, bs, table, offsets, hashes, eviction=e.prefix_cache_eviction,
                           protect_share=e.kv.protect_share, tiers=specs, block_bytes=block_bytes, hot=hot,
                           shared=shared, counted=True)
    return PrefixPool(state, [t.name for t in specs])


def link_key(name: str, bw: float, lat: float, channels: int) -> tuple:
    """What makes two replicas' tier links one shared link: the same tier name and link."""
    return (name, float(bw), float(lat), int(channels))


class SharedLinks:
    """A fleet's links marked ``kv_tiers[i].shared_link``: one row of transfer slots each
    (``free``: when each channel is next free; ``last``: the latest fetch requested), the same
    arrays in every engine's pool (kv/ptiers.py ``link_transfer``), so every replica's fetches
    queue on one resource. ``row``: link key -> row. Built from the whole fleet's scenario before
    any engine, so a replica restarted after a failure joins the same link."""

    def __init__(self, sc: "Scenario"):
        from servesim.hardware import GPUS

        keys: list[tuple] = []
        for g in sc.replica_groups:
            gsc = g.scenario
            pcie = GPUS[gsc.hardware.gpu].pcie_bytes_per_s
            for i, t in enumerate(gsc.kv_tiers or []):
                if t.shared_link and gsc.engine.enable_prefix_caching:
                    key = link_key(t.name or f"L{i + 2}", *t.resolved(pcie), t.channels)
                    if key not in keys:
                        keys.append(key)
        self.row = {k: r for r, k in enumerate(keys)}
        nch = max([k[3] for k in keys], default=1)
        self.free = np.full((len(keys), nch), np.inf)
        for r, k in enumerate(keys):
            self.free[r, : k[3]] = 0.0
        self.last = np.zeros(len(keys))
        self.channels: dict = {}  # row -> Channels of the Python reference object (tests/reference_kv)

    def __len__(self) -> int:
        return len(self.row)
