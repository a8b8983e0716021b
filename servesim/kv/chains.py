"""Prefix chains as the engine's cache sees them: per engine block, output blocks included.

A workload's chains cover prompts in the workload's own block size (Mooncake: 512 tokens,
sessions: ``block_tokens``). The engine hashes in its ``block_size``, so the factory maps chains
with :func:`servesim.workload.sessions.expand_prefix_blocks` (sound for any pair of sizes, see
there).

vLLM also hashes the blocks a request fills with *generated* tokens; in a multi-turn session the
next turn's prompt is this turn's prompt + output + the new input, so those output blocks are hit
by the next turn. A workload row only knows its prompt's hashes, but the next turn of the same
session knows them: when turn ``k+1``'s chain starts with turn ``k``'s chain (the stream was not
cut by a context window), turn ``k`` gets turn ``k+1``'s hashes for every further full block of
its ``prompt + output - 1`` written tokens::

    turn k   chain: | h0 | h1 | h2 |            prompt 3.4 blocks, output 2 blocks
    turn k+1 chain: | h0 | h1 | h2 | h3 | h4 | h5 | h6 |
    extended k:     | h0 | h1 | h2 | h3 | h4 |  (blocks 3, 4 hold turn k's prompt tail + output)

Rows without a session (``session`` -1, or no session column: Mooncake ``hash_ids``) keep their
chains.
"""

from __future__ import annotations

import numpy as np

from servesim.request import Workload
from servesim.workload.chains import expand_prefix_blocks


def engine_chains(workload: Workload, block_size: int, hash_outputs: bool = True
                  ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``(offsets, hashes)`` per engine block for the prefix cache, or ``(None, None)``."""
    wl = expand_prefix_blocks(workload, block_size)
    if not wl.has_prefixes:
        return None, None
    off, hs = wl.prefix_offsets, wl.prefix_hashes
    if hash_outputs and wl.session is not None and (wl.session >= 0).any():
        off, hs = extend_with_next_turn(off, hs, wl.session, wl.prompt_tokens, wl.output_tokens, block_size)
    return off, hs


def extend_with_next_turn(off: np.ndarray, hs: np.ndarray, session: np.ndarray, prompt: np.ndarray,
                          output: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """See module docstring. Rows are in arrival order; a session's next turn is its next row."""
    n = len(session)
    off = np.asarray(off, dtype=np.int64)
    length = np.diff(off)
    order = np.argsort(session, kind="stable")
    s = np.asarray(session)[order]
    nxt = np.full(n, -1, dtype=np.int64)
    same = (s[1:] == s[:-1]) & (s[:-1] >= 0)
    nxt[order[:-1][same]] = order[1:][same]
    cand = np.flatnonzero((nxt >= 0) & (length[np.maximum(nxt, 0)] >= length))
    # turn k+1's chain must start with turn k's
    lc = length[cand]
    row = np.repeat(np.arange(len(cand)), lc)
    t = np.arange(int(lc.sum())) - np.repeat(np.cumsum(lc) - lc, lc)
    mism = hs[off[cand][row] + t] != hs[off[nxt[cand]][row] + t]
    bad = np.bincount(row, weights=mism, minlength=len(cand)) > 0
    cand = cand[~bad]
    cap = (np.asarray(prompt, dtype=np.int64) + np.asarray(output, dtype=np.int64) - 1) // block_size
    new_len = length.copy()
    new_len[cand] = np.maximum(length[cand], np.minimum(length[nxt[cand]], cap[cand]))
    if (new_len == length).all():
        return off, hs
    new_off = np.concatenate([[0], np.cumsum(new_len)]).astype(np.int64)
    rows = np.repeat(np.arange(n), new_len)
    pos = np.arange(int(new_off[-1])) - new_off[:-1][rows]
    own = pos < length[rows]
    src = np.where(own, off[:-1][rows] + pos, off[np.maximum(nxt, 0)][rows] + pos)
    return new_off, hs[src]
