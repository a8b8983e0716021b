"""The routers as data: one registry entry per router, read by every list of router names.

A fleet's router (``cluster.router``) is a name in :data:`ROUTERS` or a user's own router as an
import path ``package.module:Class`` (a subclass of ``servesim.engine.router.Router``, as a
user's policy is named in ``engine.scheduler``). Scenario validation, the run header, the test
strategies and the docs' router tables read this catalog without importing the engine; the
engine imports an entry's ``impl`` when a fleet is built (servesim/engine/router.py
``make_router``). Adding a router is one entry here and its class.
"""

from __future__ import annotations

from dataclasses import dataclass

from servesim.fields import is_import_path


@dataclass(frozen=True)
class RouterSpec:
    name: str
    summary: str  # one line for the docs table (docs/cluster.md; tests/test_registries.py holds it so)
    impl: str  # ``module:Class`` of its Router subclass (servesim/engine/router.py)
    needs_keys: bool = False  # routes by session or prefix keys the workload must carry


ROUTERS: dict[str, RouterSpec] = {s.name: s for s in (
    RouterSpec("round-robin", "the `i`-th request to replica `i mod N`", "servesim.engine.router:RoundRobin"),
    RouterSpec("random", "uniform, from the run's own `router` random stream", "servesim.engine.router:RandomRouter"),
    RouterSpec("least-requests", "fewest outstanding requests", "servesim.engine.router:LeastRequests"),
    RouterSpec("least-tokens", "least outstanding tokens", "servesim.engine.router:LeastTokens"),
    RouterSpec("affinity", "the replica its session or prefix went to before, within a load cap "
               "(`cluster.affinity`)", "servesim.engine.router:Affinity", needs_keys=True),
    RouterSpec("priority", "P0 to the least outstanding work; other classes round robin",
               "servesim.engine.router:PriorityRouter"),
    RouterSpec("cache-aware", "balanced loads: the replica caching the longest run of the request's prefix blocks, "
               "above a share of the prompt (`cluster.cache_aware`); else the least loaded",
               "servesim.engine.prefix_router:CacheAware", needs_keys=True),
)}


def router_names() -> list[str]:
    return list(ROUTERS)


def check_router(name: str) -> str:
    """``name`` if it is a registered router or an import path; else ValueError in one line."""
    if name in ROUTERS or is_import_path(name):
        return name
    raise ValueError(f"not a known router (allowed: {', '.join(ROUTERS)}, "
                     f"or your own as an import path 'package.module:Class')")
