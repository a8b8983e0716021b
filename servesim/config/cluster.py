"""The fleet's configuration: replica groups, the router, delays (typed, frozen; docs/cluster.md).

A scenario describes one replica (``hardware.gpu``, ``model``, ``engine``, ``step_time``) and
how many of it run (``hardware.replicas``). A heterogeneous fleet lists **groups** instead, each
a count of replicas that differ from the scenario's in GPU, model, engine knobs (parallelism
included) or step-time model::

    hardware: {gpu: a100-80g, servers: 3, gpus_per_server: 8}
    engine: {scheduler: vllm, tensor_parallel_size: 1}
    cluster:
      router: least-tokens
      groups:
        - {name: small, replicas: 16}
        - {name: big, replicas: 4, engine: {tensor_parallel_size: 2}}

A group's ``engine`` holds only the fields that differ (merged over the scenario's engine;
``options`` is replaced whole); ``gpu``, ``model`` and ``step_time`` replace the scenario's.
Each group is checked as a whole scenario when the scenario loads (servesim/scenario.py), so a
mistake names the group's field: ``cluster.groups[1].engine.max_num_seqs``.

This module knows the fields only; placement on servers is servesim/config/placement.py, routing
servesim/engine/router.py.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from servesim.config.dynamics import AutoscaleConfig, FaultsConfig
from servesim.fields import StrictModel
from servesim.router_catalog import check_router

# a router of servesim/router_catalog.py, or a user's own as 'package.module:Class'
RouterName = Annotated[str, AfterValidator(check_router)]
MAX_REPLICAS = 16384


class LinkConfig(StrictModel):
    """A network link between servers (pipeline stages of one replica on two servers)."""

    bandwidth_gb_s: Annotated[float, Field(gt=0, le=10_000)]  # GB/s (1e9 bytes)
    latency_s: Annotated[float, Field(ge=0, le=1.0)] = 5e-6


class AffinityConfig(StrictModel):
    """The ``affinity`` router: requests with the same key go to the same replica, unless it is
    full. ``key``: the request's ``session`` (multi-turn sessions), its ``prefix`` (the chained
    hash of its first ``prefix_blocks`` prompt blocks, from the workload's prefix hashes), or
    ``auto`` (session when the workload has sessions, else prefix). A replica is full when its
    outstanding requests reach ``ceil(load_cap * (fleet outstanding + 1) / replicas)``
    (consistent hashing with bounded loads, Mirrokni et al. 2018); a request whose replica is
    full, or that has no key, goes to the least-loaded replica."""

    key: Literal["auto", "session", "prefix"] = "auto"
    prefix_blocks: Annotated[int, Field(ge=1, le=1 << 20)] = 1
    load_cap: Annotated[float, Field(ge=1.0, le=1000.0)] = 1.25


class CacheAwareConfig(StrictModel):
    """The ``cache-aware`` router (SGLang's sgl-router ``cache_aware`` policy; engine/prefix_router.py),
    its knobs named as sgl-router's. Loads are ``balanced`` unless ``max - min >
    balance_abs_threshold`` and ``max > balance_rel_threshold * min`` over the candidates; balanced,
    a request goes to the replica whose prefix cache holds the longest leading run of its block
    chain when that run covers more than ``cache_threshold`` of its prompt, else (or unbalanced)
    to the least loaded. ``load``: what a load is -- outstanding ``requests`` (sgl-router's) or
    outstanding ``tokens``."""

    cache_threshold: Annotated[float, Field(ge=0.0, le=1.0)] = 0.5
    balance_abs_threshold: Annotated[int, Field(ge=0, le=1 << 40)] = 32
    balance_rel_threshold: Annotated[float, Field(ge=1.0, le=1e6)] = 1.1
    load: Literal["requests", "tokens"] = "requests"


class ReplicaGroupConfig(StrictModel):
    """``replicas`` replicas that differ from the scenario's in the fields given."""

    name: Annotated[str, Field(min_length=1, max_length=100)] | None = None
    replicas: Annotated[int, Field(ge=1, le=MAX_REPLICAS)] = 1
    gpu: str | None = None  # validated as hardware.gpu when the group is built
    model: str | dict[str, Any] | None = None  # as the scenario's model field
    engine: dict[str, Any] = {}  # engine fields that differ from the scenario's
    step_time: dict[str, Any] | None = None  # replaces the scenario's step_time


SAMPLED_ROUTERS = ("least-requests", "least-tokens", "priority", "cache-aware")  # (cluster.router_sample: engine/router.py)


class ClusterConfig(StrictModel):
    """How requests reach replicas. ``router_overhead_s`` (the router's decision) and
    ``network_delay_s`` (one way, client <-> replica) are constants: a request reaches its
    replica ``router_overhead_s + network_delay_s`` after it was sent, and its tokens reach the
    client ``network_delay_s`` after the replica produced them; TTFT and E2E include both."""

    router: RouterName = "round-robin"  # servesim/router_catalog.py (docs/cluster.md), or 'module:Class'
    router_overhead_s: Annotated[float, Field(ge=0, le=60.0)] = 0.0
    network_delay_s: Annotated[float, Field(ge=0, le=60.0)] = 0.0
    affinity: AffinityConfig = AffinityConfig()
    cache_aware: CacheAwareConfig = CacheAwareConfig()  # the cache-aware router's knobs
    # the router reads the replicas' loads as of its last refresh, every this many seconds (0: exact)
    router_refresh_s: Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)] = 0.0
    # power-of-d choices: the load-reading router compares d replicas drawn from its random stream (0: all)
    router_sample: Annotated[int, Field(ge=0, le=MAX_REPLICAS)] = 0
    autoscale: AutoscaleConfig | None = None  # start and stop replicas by load (docs/processes.md)
    faults: FaultsConfig | None = None  # replicas fail and come back (docs/processes.md)
    groups: Annotated[list[ReplicaGroupConfig], Field(min_length=1, max_length=256)] | None = None

    @field_validator("groups")
    @classmethod
    def _names_differ(cls, v):
        if v is not None:
            names = [g.name for g in v if g.name is not None]
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise ValueError(f"group names must differ; {dup[0]!r} is used twice")
        return v

    @model_validator(mode="after")
    def _affinity_applies(self) -> "ClusterConfig":
        if "affinity" in self.model_fields_set and self.affinity != AffinityConfig() and self.router != "affinity":
            raise ValueError(f"cluster.affinity applies to router 'affinity', not {self.router!r} "
                             f"(remove it, or set cluster.router: affinity)")
        return self

    @model_validator(mode="after")
    def _cache_aware_applies(self) -> "ClusterConfig":
        if "cache_aware" in self.model_fields_set and self.cache_aware != CacheAwareConfig() \
                and self.router != "cache-aware":
            raise ValueError(f"cluster.cache_aware applies to router 'cache-aware', not {self.router!r} "
                             f"(remove it, or set cluster.router: cache-aware)")
        return self

    @model_validator(mode="after")
    def _sample_applies(self) -> "ClusterConfig":
        if self.router_sample and self.router not in SAMPLED_ROUTERS:
            raise ValueError(f"cluster.router_sample {self.router_sample} applies to routers "
                             f"{', '.join(SAMPLED_ROUTERS)}, not {self.router!r} (remove it, or set it to 0)")
        return self

    @property
    def delay_in_s(self) -> float:
        """Client send -> replica arrival."""
        return self.router_overhead_s + self.network_delay_s

    @property
    def delay_out_s(self) -> float:
        """Replica token -> client."""
        return self.network_delay_s
