"""The cache-aware router: to the replica that holds the longest run of the request's prefix, while
loads are balanced (``cluster.router: cache-aware``, knobs ``cluster.cache_aware``).

The rule is SGLang's router's ``cache_aware`` policy (sgl-router ``src/policies/cache_aware.rs``
@ 026f853b, defaults in ``src/policies/mod.rs`` @ 08fc5742), with its knob names:

1. Loads (``load``: outstanding requests -- sgl-router's worker load -- or outstanding tokens) are
   *unbalanced* when ``max - min > balance_abs_threshold`` and ``max > balance_rel_threshold *
   min`` over the candidates: the request goes to the least loaded.
2. Balanced: each candidate's *match* is the number of leading blocks of the request's block
   chain its prefix cache holds now, in tokens. The longest match's share of the prompt above
   ``cache_threshold``: the request goes to a replica with that match (the least loaded of them);
   else to the least loaded (sgl-router sends a miss to the replica with the smallest cache tree,
   the most room; here the least loaded, as vLLM's production-stack falls back).

What differs from sgl-router is where the match comes from. sgl-router keeps an *approximate*
radix tree per worker of the texts it routed there (inserted at routing time, evicted by its own
size cap, blind to the engine's evictions). Here the match is read from each replica's actual
pool -- the hash chains of kv/pstate.py, through the read-only kernel :func:`servesim.kv.resident.px_resident`:
the request's chain looked up in the pool's hash map, L1 then its lower tiers -- as llm-d's
precise prefix-cache scorer does from the engines' KV events (llm-d-kv-cache-manager
``pkg/kvcache/kvblock_scorer.go`` @ 760bfeab, ``LongestPrefixScorer``: consecutive blocks from block
0 per pod). So a prefix the replica evicted is not matched, and one a request routed there has not
yet scheduled is not matched either (its blocks enter the cache map when scheduled).

Cost per request: each candidate's hash map is read along the request's chain only -- one read
when its first block misses, the matched run otherwise, compiled -- never the whole cache. Candidates:
every active replica, or with ``cluster.router_sample: d`` the ``d`` drawn from the run's router
stream (the loads and the balance test are then over those ``d``, as a power-of-d router sees).

A pipeline replica's match is its best virtual engine's (each holds its own pool); its load is
the sum, as for every router.
"""

from __future__ import annotations

import math

import numpy as np

from servesim.engine.router import Router
from servesim.jit import pure
from servesim.kv.resident import px_resident

_PURE_RESIDENT = pure(px_resident)


class CacheAware(Router):
    """See the module docstring. Counters for ``summary.cluster.cache_aware``."""

    name = "cache-aware"

    def __init__(self, n: int, prompt: np.ndarray, *, cache_threshold: float = 0.5,
                 balance_abs_threshold: int = 32, balance_rel_threshold: float = 1.1, load: str = "requests"):
        super().__init__(n)
        if not 0.0 <= cache_threshold <= 1.0:
            raise ValueError(f"cluster.cache_aware.cache_threshold {cache_threshold!r}: allowed 0 to 1")
        if balance_abs_threshold < 0:
            raise ValueError(f"cluster.cache_aware.balance_abs_threshold {balance_abs_threshold!r}: allowed >= 0")
        if not balance_rel_threshold >= 1.0:
            raise ValueError(f"cluster.cache_aware.balance_rel_threshold {balance_rel_threshold!r}: allowed >= 1")
        if load not in ("requests", "tokens"):
            raise ValueError(f"cluster.cache_aware.load {load!r}: allowed requests, tokens")
        self.prompt = prompt
        self.cache_threshold, self.abs_t, self.rel_t, self.kind = (
            float(cache_threshold), int(balance_abs_threshold), float(balance_rel_threshold), load)
        self._engines: list | None = None  # the fleet's engines (its list: a restarted engine replaces its entry)
        self._members: list[list[int]] = [[r] for r in range(n)]
        self.cache_routed = 0  # balanced, match above the threshold: to the longest match
        self.below = 0  # balanced, match at or below the threshold: to the least loaded
        self.unbalanced = 0  # loads unbalanced: to the least loaded
        self.matched_tokens = 0  # tokens resident at the chosen replica, summed over requests
        self.prompt_tokens = 0

    @classmethod
    def build(cls, cfg, n, workload, rng):
        if not workload.has_prefixes:
            raise ValueError("cluster.router 'cache-aware' routes by the prefix blocks each replica caches: the "
                             "workload has no prefix hashes (a trace with hash ids, or workload.sessions)")
        c = cfg.cache_aware
        r = cls(n, workload.prompt_tokens, cache_threshold=c.cache_threshold,
                balance_abs_threshold=c.balance_abs_threshold, balance_rel_threshold=c.balance_rel_threshold,
                load=c.load)
        r.sampling(getattr(cfg, "router_sample", 0), rng)
        return r

    def attach(self, fleet) -> None:
        """Read the replicas' pools through ``fleet`` (its engine list and replicas). ValueError in
        one line when a replica has no prefix cache to read."""
        for r, members in enumerate(fleet.replicas):
            for e in members:
                if not getattr(fleet.engines[e].kstate, "prefix", 0):
                    raise ValueError(f"cluster.router 'cache-aware' reads each replica's prefix cache: replica {r} "
                                     f"has none (allowed: engine.enable_prefix_caching: true on every replica)")
        self._engines, self._members = fleet.engines, fleet.replicas

    def match_tokens(self, r: int, rid: int) -> int:
        """Tokens of ``rid``'s prefix replica ``r`` holds now (L1 and lower tiers; a pipeline
        replica: its best virtual engine)."""
        best = 0
        for e in self._members[r]:
            blocks = self._resident(e, rid)
            if blocks:
                best = max(best, blocks * self._engines[e].kstate.block_size)
        return best

    def _resident(self, e: int, rid: int) -> int:
        """Engine ``e``'s pool: blocks of ``rid``'s prefix it holds (L1, then lower tiers) --
        the compiled kernel on its StructRef, or the same source in Python beside the Python engine."""
        eng = self._engines[e]
        if eng.path == "compiled":
            return px_resident(eng.kkv, rid)[1]
        return _PURE_RESIDENT(eng.kstate, rid)[1]

    def summary_entries(self) -> dict:
        hit = self.matched_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        return {"cache_aware": {"cache_routed": int(self.cache_routed), "below_threshold": int(self.below),
                                "unbalanced": int(self.unbalanced), "matched_token_share": round(hit, 6)}}

    def _unbalanced(self, hi, lo) -> bool:
        return hi - lo > self.abs_t and hi > self.rel_t * lo

    def choose(self, rid, klass, view):
        if self._engines is None:
            raise RuntimeError("the cache-aware router was not attached to its fleet (Router.attach)")
        prompt = int(self.prompt[rid])
        if self.sample:
            cands = self._drawn()
            loads = [view.load(self.kind, r) for r in cands]
            i, matched = self._rule(prompt, loads, (max(loads), min(loads)),
                                    lambda: [self.match_tokens(r, rid) for r in cands],
                                    lambda values: values.index(min(values)))  # ties: the first drawn
            return self._done(cands[i], rid, prompt, matched)
        loads = view.requests() if self.kind == "requests" else view.tokens()
        act = self.active
        live = loads if act is None else loads[act]
        r, matched = self._rule(prompt, loads.tolist(), (live.max(), live.min()),
                                lambda: [0 if self._skip(r) else self.match_tokens(r, rid) for r in range(self.n)],
                                self.least)  # ties: the rotating pointer; drained replicas never chosen
        return self._done(r, rid, prompt, matched)

    def _rule(self, prompt, loads, hi_lo, matches, pick):
        """sgl-router's decision, written once for both candidate sets (every replica, or the
        ``d`` drawn): ``loads`` per candidate; ``hi_lo`` the highest and lowest live load, which
        the balance test reads; ``matches()`` each candidate's resident prefix tokens, read only
        when loads are balanced; ``pick`` the least of a list of values with the caller's tie
        rule. Returns the chosen candidate's index and its match (None: not read)."""
        if self._unbalanced(*hi_lo):
            self.unbalanced += 1
            return pick(loads), None
        match = matches()
        best = max(match)
        if prompt and min(best, prompt) / prompt > self.cache_threshold:
            self.cache_routed += 1
            return pick([x if m == best else math.inf for x, m in zip(loads, match)]), best
        self.below += 1
        i = pick(loads)
        return i, match[i]

    def _drawn(self) -> list:
        """``sample`` replicas drawn from the run's router stream (a drained one drawn is drawn
        again; a replica drawn twice counts once)."""
        cands = []
        for _ in range(self.sample):
            r = self._draw()
            while self._skip(r):
                r = self._draw()
            if r not in cands:
                cands.append(r)
        self.sampled += 1
        return cands

    def _done(self, r: int, rid: int, prompt: int, matched: int | None) -> int:
        if matched is None:
            matched = self.match_tokens(r, rid)
        self.matched_tokens += min(matched, prompt)
        self.prompt_tokens += prompt
        return r
