"""Routers: which replica a request goes to, from what the router can see at its arrival.

A router is asked once per request, in arrival order, at the instant the request reaches the
fleet (engine/cluster.py advances every replica to that instant first). It sees each replica's
*load* through a :class:`LoadView`, computed only when asked:

``requests(r)``   outstanding requests: sent to replica ``r`` and not yet finished or rejected
``tokens(r)``     outstanding work in tokens: ``prompt + output - computed`` summed over those
                  requests (prefill and decode work left; servesim.engine.inbox.outstanding_work)

Policies (``cluster.router``):

==================  =================================================================================
round-robin         replica ``i mod N`` for the ``i``-th request
random              uniform, from the run's own ``router`` random stream
least-requests      fewest outstanding requests
least-tokens        least outstanding work in tokens (prefill + decode)
affinity            the replica its key (session, or prefix hash) went to before, unless that replica
                    is full (bounded-load consistent hashing: ``load >= ceil(cap * (total + 1) / N)``);
                    a new key, a keyless request or a full replica: fewest outstanding requests (a new
                    key is bound to where it went; an overflow leaves the binding as it was)
priority            class P0 to the replica with the least outstanding work; other classes round robin
cache-aware         balanced loads: the replica whose prefix cache holds the longest run of the
                    request's block chain, if it covers more than ``cache_threshold`` of the prompt;
                    else the least loaded (engine/prefix_router.py)
==================  =================================================================================

Ties among least-loaded replicas go to the first one at or after a pointer that moves past each
choice, so equal loads are served round robin (never all to replica 0).
"""

from __future__ import annotations

import importlib
import math
from typing import Callable

import numpy as np

from servesim.router_catalog import ROUTERS


class LoadView:
    """Per-replica loads at the current arrival instant, computed on demand, cached per request."""

    def __init__(self, n: int, requests: Callable[[], np.ndarray], tokens: Callable[[], np.ndarray],
                 index: Callable[[str], object] | None = None, one: Callable[[str, int], int] | None = None):
        self.n = n
        self._requests, self._tokens = requests, tokens
        self._index = index  # kind -> a MinTree of the loads (engine/load_index.py), or None
        self._one = one  # (kind, replica) -> that replica's load now, read alone (or None)

    def load(self, kind: str, r: int):
        """Replica ``r``'s load of ``kind``: read alone where the fleet can (a sampling router
        reads only the replicas it drew, and the tree of every load is not brought up to date),
        else from the tree or the scan -- the same value (tests/test_fleet_scale.py)."""
        if self._one is not None:
            return self._one(kind, r)
        tree = self.tree(kind)
        if tree is not None:
            return tree[r]
        return (self.requests() if kind == "requests" else self.tokens())[r]

    def tree(self, kind: str):
        """The loads of ``kind`` ("requests" or "tokens") as a min segment tree kept up to date
        incrementally (engine/load_index.py), or None where the fleet keeps none."""
        return self._index(kind) if self._index is not None else None

    def requests(self) -> np.ndarray:
        return self._requests()

    def tokens(self) -> np.ndarray:
        return self._tokens()


class Router:
    """Base: ``choose(rid, klass, view) -> replica``; ``n`` replicas."""

    name = ""
    reads_load = True  # False: routes without reading loads (choose_many), so a fleet may route every arrival first

    def __init__(self, n: int):
        self.n = n
        self.ptr = 0
        self.active: np.ndarray | None = None  # replicas taking requests (None: all; set by drain)

    @classmethod
    def build(cls, cfg, n: int, workload, rng: np.random.Generator) -> "Router":
        """The router for a fleet of ``n`` replicas: ``cfg`` the scenario's ClusterConfig, the
        workload (for keys), and the run's own ``router`` random stream. Override to read them."""
        r = cls(n)
        r.sampling(getattr(cfg, "router_sample", 0), rng)
        return r

    def attach(self, fleet) -> None:
        """Called once the fleet is built (engine/fleet_build.py), before any request: a router
        that reads more than loads -- the replicas' prefix caches (engine/prefix_router.py) --
        keeps what it reads here. ValueError in one line when the fleet lacks it. Default: nothing."""

    sample = 0  # cluster.router_sample: power-of-d choices (0, or d >= n: every replica)

    def sampling(self, d: int, rng: np.random.Generator, block: int = 1024) -> None:
        """Compare ``d`` replicas drawn uniformly (with replacement) from ``rng`` -- the run's
        ``router`` stream -- instead of all (Mitzenmacher's power of d choices, as large
        deployments route). ``d`` of 0 or at least the replica count keeps the exact rule."""
        self.sample = d if 0 < d < self.n else 0
        self._rng, self._block = rng, block * max(d, 1)
        self._draws, self._di = np.empty(0, dtype=np.int64), 0
        self.sampled = 0

    def _draw(self) -> int:
        if self._di >= len(self._draws):  # in blocks: the same sequence whatever the block
            self._draws = self._rng.integers(0, self.n, self._block).tolist()
            self._di = 0
        r = self._draws[self._di]
        self._di += 1
        return r

    def _least_sampled(self, view: LoadView, kind: str) -> int:
        """The least loaded of ``sample`` drawn replicas (ties: the first drawn); a drained
        replica drawn is drawn again."""
        best, low = -1, None
        for _ in range(self.sample):
            r = self._draw()
            while self._skip(r):
                r = self._draw()
            v = view.load(kind, r)
            if low is None or v < low:
                best, low = r, v
        self.sampled += 1
        return best

    def set_active(self, r: int, on: bool) -> None:
        """Replica ``r`` takes new requests (``on``) or not (drained, failed, not started). At
        least one replica must take them."""
        if self.active is None:
            self.active = np.ones(self.n, dtype=bool)
        self.active[r] = on
        if not self.active.any():
            self.active[r] = True
            raise ValueError("every replica would be drained: the router needs one to send requests to")
        if self.active.all():
            self.active = None

    def _skip(self, r: int) -> bool:
        return self.active is not None and not self.active[r]

    def choose(self, rid: int, klass: int, view: LoadView) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def choose_many(self, m: int) -> np.ndarray:
        """The next ``m`` choices at once (routers that read no load): what ``m`` calls of
        ``choose`` would return."""
        raise NotImplementedError(f"router {self.name} reads loads: it routes one request at a time")

    def least(self, loads) -> int:
        """The least-loaded replica; ties: the first at or after the pointer, which then moves on."""
        values = loads.tolist() if isinstance(loads, np.ndarray) else list(loads)
        if self.active is not None:  # drained replicas are never the least loaded
            values = [v if a else math.inf for v, a in zip(values, self.active.tolist())]
        low = min(values)
        try:
            best = values.index(low, self.ptr)
        except ValueError:  # none at or after the pointer: the first from the start
            best = values.index(low)
        self.ptr = best + 1 if best + 1 < self.n else 0
        return best

    def least_of(self, view: LoadView, kind: str) -> int:
        """:meth:`least` of the loads of ``kind`` ("requests" or "tokens"): from the view's
        incrementally kept tree in O(log N) where it has one and no replica is drained, else by
        a scan of every replica's load. The same choice either way (tests/test_fleet_scale.py)."""
        if self.sample:
            return self._least_sampled(view, kind)
        tree = view.tree(kind) if self.active is None else None
        if tree is None:
            return self.least(view.requests() if kind == "requests" else view.tokens())
        best = tree.least_from(self.ptr)
        self.ptr = best + 1 if best + 1 < self.n else 0
        return best

    def next_rr(self) -> int:
        while True:
            i = self.ptr
            self.ptr = i + 1 if i + 1 < self.n else 0
            if not self._skip(i):
                return i

    def summary_entries(self) -> dict:
        """What this router adds to the run's ``summary.cluster`` (its own counters)."""
        return {}


class RoundRobin(Router):
    name = "round-robin"
    reads_load = False

    def choose(self, rid, klass, view):
        return self.next_rr()

    def choose_many(self, m):
        out = (self.ptr + np.arange(m, dtype=np.int64)) % self.n
        self.ptr = int((self.ptr + m) % self.n)
        return out


class RandomRouter(Router):
    name = "random"
    reads_load = False

    @classmethod
    def build(cls, cfg, n, workload, rng):
        return cls(n, rng)

    def __init__(self, n: int, rng: np.random.Generator, block: int = 4096):
        super().__init__(n)
        self.rng, self.block = rng, block
        self._buf = np.empty(0, dtype=np.int64)
        self._i = 0

    def choose(self, rid, klass, view):
        while True:
            if self._i >= len(self._buf):  # draws in blocks: the sequence is the same whatever the block
                self._buf = self.rng.integers(0, self.n, self.block)
                self._i = 0
            r = int(self._buf[self._i])
            self._i += 1
            if not self._skip(r):  # (a drained replica: draw again)
                return r

    def choose_many(self, m):
        out = np.empty(m, dtype=np.int64)
        k = 0
        while k < m:
            if self._i >= len(self._buf):
                self._buf = self.rng.integers(0, self.n, self.block)
                self._i = 0
            take = min(m - k, len(self._buf) - self._i)
            out[k:k + take] = self._buf[self._i:self._i + take]
            self._i += take
            k += take
        return out


class LeastRequests(Router):
    name = "least-requests"

    def choose(self, rid, klass, view):
        return self.least_of(view, "requests")


class LeastTokens(Router):
    name = "least-tokens"

    def choose(self, rid, klass, view):
        return self.least_of(view, "tokens")


class Affinity(Router):
    """Same key, same replica, within a load cap (see the module docstring)."""

    name = "affinity"

    def __init__(self, n: int, keys: np.ndarray, has_key: np.ndarray, load_cap: float):
        super().__init__(n)
        self.keys, self.has_key, self.load_cap = keys, has_key, load_cap
        self.bound: dict[int, int] = {}
        self.overflows = 0  # requests whose replica was full
        self.hits = 0  # requests sent to their key's replica

    @classmethod
    def build(cls, cfg, n, workload, rng):
        keys, has, _ = affinity_keys(workload, cfg.affinity.key, cfg.affinity.prefix_blocks)
        return cls(n, keys, has, cfg.affinity.load_cap)

    def cap(self, loads) -> int:
        return math.ceil(self.load_cap * (int(np.sum(loads)) + 1) / self.n)

    def summary_entries(self) -> dict:
        return {"affinity": {"hits": int(self.hits), "overflows": int(self.overflows), "keys": len(self.bound)}}

    def choose(self, rid, klass, view):
        tree = view.tree("requests") if self.active is None else None
        if tree is not None:  # (the same decisions from the incrementally kept loads: engine/load_index.py)
            return self._choose_tree(rid, view, tree)
        loads = view.requests()
        if not self.has_key[rid]:
            return self.least(loads)
        key = int(self.keys[rid])
        r = self.bound.get(key)
        if r is not None:
            if loads[r] < self.cap(loads) and not self._skip(r):
                self.hits += 1
                return r
            self.overflows += 1
            return self.least(loads)
        r = self.least(loads)
        self.bound[key] = r
        return r

    def _choose_tree(self, rid, view, tree):
        """Affinity's rule on the loads' tree: the replica's load and the fleet's sum without a scan."""
        if not self.has_key[rid]:
            return self.least_of(view, "requests")
        key = int(self.keys[rid])
        r = self.bound.get(key)
        if r is not None:
            if tree[r] < math.ceil(self.load_cap * (int(tree.total) + 1) / self.n):
                self.hits += 1
                return r
            self.overflows += 1
            return self.least_of(view, "requests")
        r = self.least_of(view, "requests")
        self.bound[key] = r
        return r


class PriorityRouter(Router):
    """P0 to the least outstanding work; other classes round robin (their own pointer)."""

    name = "priority"

    def __init__(self, n: int):
        super().__init__(n)
        self.rr = 0

    def choose(self, rid, klass, view):
        if klass == 0:
            return self.least_of(view, "tokens")
        while True:
            i = self.rr
            self.rr = i + 1 if i + 1 < self.n else 0
            if not self._skip(i):
                return i


def affinity_keys(workload, key: str, prefix_blocks: int) -> tuple[np.ndarray, np.ndarray, str]:
    """``(keys, has_key, what)`` per request: its session id, or the chained hash of its first
    ``prefix_blocks`` prompt blocks (fewer if the prompt has fewer); ``what`` says which.
    ValueError when the workload carries neither."""
    n = len(workload)
    sessions = workload.session
    has_sessions = sessions is not None and bool(np.any(sessions >= 0))
    if key == "session" or (key == "auto" and has_sessions):
        if not has_sessions:
            raise ValueError("cluster.affinity.key 'session': the workload has no sessions "
                             "(workload.sessions, or a trace with session ids)")
        return sessions.astype(np.int64), sessions >= 0, "session"
    if not workload.has_prefixes:
        raise ValueError(f"cluster.affinity.key {key!r}: the workload has neither sessions nor prefix hashes "
                         f"(a trace with hash ids, or workload.sessions)")
    off = workload.prefix_offsets
    counts = np.diff(off)
    has = counts > 0
    take = np.minimum(counts, prefix_blocks) - 1
    idx = np.where(has, off[:-1] + np.maximum(take, 0), 0)
    keys = np.where(has, workload.prefix_hashes[idx] if len(workload.prefix_hashes) else 0, -1).astype(np.int64)
    assert len(keys) == n
    return keys, has, "prefix"


def make_router(cfg, n: int, workload, rng: np.random.Generator) -> Router:
    """The router ``cfg.router`` names (a ClusterConfig), over ``n`` replicas: a registered one
    (servesim/router_catalog.py) or a user's ``package.module:Class``. ValueError in one line
    when a user's router cannot be imported or is not a Router."""
    spec = ROUTERS.get(cfg.router)
    path = spec.impl if spec is not None else cfg.router
    return load_router_class(path).build(cfg, n, workload, rng)


def load_router_class(path: str) -> type[Router]:
    module, _, name = path.partition(":")
    try:
        obj = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cluster.router {path!r}: cannot import it ({exc})") from None
    if not (isinstance(obj, type) and issubclass(obj, Router)):
        raise ValueError(f"cluster.router {path!r} is not a subclass of servesim.engine.router.Router "
                         f"(see docs/cluster.md)")
    return obj
