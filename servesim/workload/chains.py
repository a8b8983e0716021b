"""Prefix block chains: hashing, mapping to the engine's block size, the chains of sessions.

A prefix cache reuses a block's KV only when the *whole* prompt up to the end of that block is
identical. So a request's prefix chain is a list of block ids in which an id identifies the whole
prefix up to its block (equal id at position j => equal tokens 0..end of block j). Two ways to get
such ids are used here:

* **chained** (:func:`chain_hashes`): ``h[0] = mix(ROOT, id[0])``, ``h[j] = mix(h[j-1], id[j])``.
  Used for Mooncake ``hash_ids``, which already have that property (every id has one parent and
  one position in both shipped traces: checked by :func:`is_prefix_closed`); re-chaining keeps
  their equality classes and also makes ids from files that lack the property sound.
* **stream-keyed**: a session's token stream only ever grows (each turn appends a new input and
  an output), so block j of a stream is identified by ``mix(stream_key, j)``; a shared system
  prompt's blocks use the system prompt's key instead. Equal id => same stream (or same system
  prompt) and same position => same prefix. This needs no sequential pass, so it is vectorized.

The 64-bit mixer is the splitmix64 finalizer. By the birthday bound, n distinct ids collide with
probability about n^2 / 2^65: 3e-6 for 10^7 ids, 3e-4 for 10^8; collisions are ignored.

Block-size mapping (:func:`expand_prefix_blocks`): a chain in S-token blocks (Mooncake: S=512) is
mapped to an engine block size B by giving engine block j (tokens ``[jB, (j+1)B)``) the id
``mix(h[k], j)`` where ``k = ((j+1)B - 1) // S`` is the source block that holds its *last* token::

    S=512 source:  |        h0         |        h1         |    h2 (partial)  |
    B=256 engine:  | m(h0,0) | m(h0,1) | m(h1,2) | m(h1,3) | m(h2,4) |  (tail not full: no id)
    B=768 engine:  |     m(h1,0)      |      m(h2,1) ...   (block 0 ends inside h1)

``h[k]`` identifies every token up to the end of source block k, which covers the engine block,
so the rule is sound for every B (dividing S or not). It is conservative when B does not divide S:
two requests that diverge inside source block k after the engine block's end lose that hit, which
the data cannot resolve anyway. Only full engine blocks get ids (a cache reuses full blocks).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from servesim.request import Workload

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
ROOT = np.uint64(0x5EED_C0DE_0000_0001)  # parent of every chain's first block
SESSION_NS = 0x5E55_1011  # key namespaces, so session, system-prompt and trace ids never meet
SYSTEM_NS = 0x5957_E300


def _u64(x) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype == np.uint64:
        return a
    return a.astype(np.int64).view(np.uint64)


def _fmix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x = x * _M1
        x = x ^ (x >> np.uint64(27))
        x = x * _M2
        return x ^ (x >> np.uint64(31))


def mix(a, b) -> np.ndarray:
    """Order-sensitive 64-bit hash of two int64 arrays (broadcasting), returned as int64."""
    with np.errstate(over="ignore"):
        out = _fmix(_u64(a) ^ _fmix(_u64(b) + _GOLDEN))
    return out.view(np.int64)


def chain_hashes(offsets: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Chain each ragged row of ``ids`` (row i is ``ids[offsets[i]:offsets[i+1]]``):
    ``h[j] = mix(h[j-1], id[j])`` with ``h[-1] = ROOT``.

    Rows are processed position by position (rows sorted by length, longest first, so the rows
    still active at position j are a prefix): O(total ids) work in O(longest row) numpy calls."""
    offsets = np.asarray(offsets, dtype=np.int64)
    ids = np.asarray(ids, dtype=np.int64)
    out = np.empty(len(ids), dtype=np.int64)
    lens = np.diff(offsets)
    if len(ids) == 0:
        return out
    order = np.argsort(-lens, kind="stable")
    starts = offsets[:-1][order]
    neg_sorted = -lens[order]
    prev = np.full(len(lens), ROOT, dtype=np.uint64).view(np.int64)
    for j in range(int(lens.max())):
        k = int(np.searchsorted(neg_sorted, -j, side="left"))  # rows with len > j
        pos = starts[:k] + j
        cur = mix(prev[:k], ids[pos])
        out[pos] = cur
        prev = cur
    return out


def is_prefix_closed(offsets: np.ndarray, ids: np.ndarray) -> bool:
    """True when every id has a single (parent id, position) over all rows: the ids then already
    identify whole prefixes (Mooncake's do)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    ids = np.asarray(ids, dtype=np.int64)
    if len(ids) == 0:
        return True
    lens = np.diff(offsets)
    pos = np.arange(len(ids)) - np.repeat(offsets[:-1], lens)
    parent = np.where(pos > 0, np.roll(ids, 1), np.int64(-1) << np.int64(62))
    order = np.lexsort((pos, parent, ids))  # sort-based: np.unique is slow on large int64 arrays
    i, p, q = ids[order], parent[order], pos[order]
    same = i[1:] == i[:-1]
    return not np.any(same & ((p[1:] != p[:-1]) | (q[1:] != q[:-1])))


def expand_prefix_blocks(workload: Workload, engine_block_size: int) -> Workload:
    """The same workload with its prefix chains in ``engine_block_size``-token blocks (full blocks
    only). The rule, ``id_j = mix(h[((j+1)B-1)//S], j)``, is drawn in the module docstring."""
    if engine_block_size < 1:
        raise ValueError(f"engine_block_size {engine_block_size} must be >= 1")
    if not workload.has_prefixes:
        return workload
    S, B = workload.prefix_block_tokens, engine_block_size
    src_off = workload.prefix_offsets
    src_len = np.diff(src_off)
    covered = np.minimum(workload.prompt_tokens, src_len * S)
    m = covered // B
    offsets = np.concatenate([[0], np.cumsum(m)]).astype(np.int64)
    j = np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], m)
    k = ((j + 1) * B - 1) // S
    src = np.repeat(src_off[:-1], m) + k
    hashes = mix(workload.prefix_hashes[src], j)
    return dataclasses.replace(workload, prefix_offsets=offsets, prefix_hashes=hashes, prefix_block_tokens=B)


# ------------------------------------------------------------------------------ session chains
def ragged_positions(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row of each element, position of each element in its row) for rows of ``counts``."""
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    row = np.repeat(np.arange(len(counts)), counts)
    return row, np.arange(offsets[-1], dtype=np.int64) - offsets[:-1][row]


def stream_chains(
    stream_key: np.ndarray,
    prompt: np.ndarray,
    block_tokens: int,
    system_key: np.ndarray | None = None,
    system_tokens: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Prefix chains of requests whose prompts are prefixes of append-only token streams.

    Request i covers ``prompt[i] // block_tokens`` full blocks of stream ``stream_key[i]``; block
    j's id is ``mix(stream_key, j)``, or ``mix(system_key, j)`` for blocks lying wholly inside a
    shared ``system_tokens``-token system prompt. Returns ``(offsets, hashes)``."""
    m = np.asarray(prompt, dtype=np.int64) // block_tokens
    row, j = ragged_positions(m)
    key = np.asarray(stream_key, dtype=np.int64)[row]
    if system_key is not None and system_tokens > 0:
        in_system = (j + 1) * block_tokens <= system_tokens
        key = np.where(in_system, np.asarray(system_key, dtype=np.int64)[row], key)
    offsets = np.concatenate([[0], np.cumsum(m)]).astype(np.int64)
    return offsets, mix(key, j)


def _group_starts(sorted_keys: np.ndarray) -> np.ndarray:
    """Boolean: element starts a new group in an array sorted by key."""
    first = np.ones(len(sorted_keys), dtype=bool)
    first[1:] = sorted_keys[1:] != sorted_keys[:-1]
    return first


def exclusive_group_cumsum(values: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Sum of earlier values within the same (contiguous) group."""
    c = np.cumsum(values) - values
    base = np.maximum.accumulate(np.where(first, c, 0))
    return c - base


def session_chains(
    session: np.ndarray,
    prompt: np.ndarray,
    output: np.ndarray,
    mode: str,
    block_tokens: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Replayed prompts and prefix chains for a trace with session ids (rows in arrival order;
    ``session`` -1 = no session).

    ``mode='new'``: the row's prompt is the new input only; the replayed prompt is all earlier
    turns' prompts and outputs plus it. ``mode='full'``: the row's prompt already holds the
    history; when a prompt is shorter than the previous turn's prompt + output the history was cut
    (a context window), so a new stream starts and nothing before it is shared.

    Returns ``(prompt, offsets, hashes, streams_restarted)``."""
    session = np.asarray(session, dtype=np.int64)
    prompt = np.asarray(prompt, dtype=np.int64)
    output = np.asarray(output, dtype=np.int64)
    order = np.argsort(session, kind="stable")  # rows of a session stay in arrival order
    s = session[order]
    p, o = prompt[order], output[order]
    first = _group_starts(s)
    if mode == "new":  # (rows without a session have no history: -1 is no session, not one session)
        new_prompt = np.where(s < 0, p, exclusive_group_cumsum(p + o, first) + p)
        cut = np.zeros(len(s), dtype=np.int64)
    elif mode == "full":
        new_prompt = p
        history = np.concatenate([[0], p[:-1] + o[:-1]])
        cut = (~first & (p < history)).astype(np.int64)
    else:
        raise ValueError(f"session prompt mode {mode!r} is not 'full' or 'new'")
    epoch = exclusive_group_cumsum(cut, first) + cut
    key = mix(mix(SESSION_NS, s), epoch)
    # rows without a session get a key of their own (their row number): nothing is shared
    key = np.where(s < 0, mix(SESSION_NS - 1, order), key)
    out_prompt = np.empty_like(prompt)
    out_prompt[order] = new_prompt
    out_key = np.empty_like(key)
    out_key[order] = key
    offsets, hashes = stream_chains(out_key, out_prompt, block_tokens)
    restarted = int(cut[s >= 0].sum())
    return out_prompt, offsets, hashes, restarted


# -------------------------------------------------------------------------- synthetic sessions
