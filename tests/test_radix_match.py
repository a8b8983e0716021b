"""SGLang's radix cache and the hash-chained block cache at page size 1: the same matches while
nothing is evicted (docs/kv.md, "SGLang's radix cache").

The reference below is SGLang's tree as far as matching goes, written from
python/sglang/srt/mem_cache/radix_cache.py (sgl-project/sglang @ 006b0e3d,
``_match_prefix_helper``, ``_split_node``, ``_insert_helper``; nothing copied): nodes hold token
segments keyed by their first token, a match that ends inside a segment splits it, an insert adds
one leaf for the unmatched rest. A request's prompt is inserted once it is prefilled
(``cache_unfinished_req`` after its chunk); a lookup matches all known tokens but the last
(SGLang's managers/schedule_batch.py ``_compute_max_prefix_len``, vLLM's
``num_tokens - 1``).

The kernels (kv/pcache.py, through tests/prefix_face.py) get each prompt's chain at block size 1:
one hash per token, equal exactly when the tokens up to it are. Hypothesis draws prompts over a
three-token alphabet (so they share prefixes) and an order of prefills and frees in a pool that
never has to evict; each lookup's hit must be the radix tree's match. Eviction is where the two
differ (docs/kv.md lists how), so the pool is sized never to need it, and the test checks it did
not.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.prefix_face import KernelPrefixKV
from tests.test_kv_golden import make_table


class RadixTree:
    """Match and insert of SGLang's radix tree at page size 1 (module docstring)."""

    def __init__(self) -> None:
        self.root = {"key": (), "children": {}}

    def _walk(self, tokens: tuple) -> tuple[dict, int]:
        """The deepest node whose path is a prefix of ``tokens`` after splitting the node where
        the match ends inside a segment; the matched length."""
        node, i = self.root, 0
        while i < len(tokens) and tokens[i] in node["children"]:
            child = node["children"][tokens[i]]
            key = child["key"]
            n = 0
            while n < len(key) and i + n < len(tokens) and key[n] == tokens[i + n]:
                n += 1
            if n < len(key):  # split: the matched part becomes a node of its own
                mid = {"key": key[:n], "children": {key[n]: child}}
                child["key"] = key[n:]
                node["children"][tokens[i]] = mid
                return mid, i + n
            node, i = child, i + n
        return node, i

    def match(self, tokens: tuple) -> int:
        return self._walk(tokens)[1]

    def insert(self, tokens: tuple) -> None:
        node, i = self._walk(tokens)
        if i < len(tokens):
            node["children"][tokens[i]] = {"key": tokens[i:], "children": {}}


@st.composite
def runs(draw):
    prompts = draw(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=12).map(tuple), min_size=1,
                            max_size=12))
    # after each prefill, which running requests finish (their blocks become cached-free)
    frees = [draw(st.lists(st.integers(0, i), max_size=2, unique=True)) for i in range(len(prompts))]
    return prompts, frees


@settings(max_examples=200, deadline=None)
@given(runs())
def test_hash_chained_hits_are_radix_matches_at_page_size_1(run):
    prompts, frees = run
    ids: dict[tuple, int] = {}
    chains = [[ids.setdefault(p[: j + 1], len(ids)) for j in range(len(p))] for p in prompts]
    table, off, hs = make_table([(len(p), 1) for p in prompts], chains)
    kv = KernelPrefixKV(sum(len(p) for p in prompts) + 1, 1, table, off, hs)
    tree = RadixTree()
    running = set()
    for rid, p in enumerate(prompts):
        hit = kv.reuse_prefix(rid, float(rid)).tokens
        assert hit == tree.match(p[:-1]), (rid, p)
        n = len(p) - hit
        assert kv.allocate(rid, n)
        table.computed[rid] += n
        tree.insert(p)
        running.add(rid)
        for r in frees[rid]:
            if r in running:
                kv.free(r)
                running.discard(r)
    kv.check()
    assert kv.evictions == 0
