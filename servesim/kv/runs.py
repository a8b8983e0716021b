"""Decode-run arithmetic shared by every KV pool: when requests cross block boundaries.

During a decode run each scheduled request gains one token slot per step. A holding that grows by
``chunk`` blocks whenever the slot count passes ``threshold + m * period`` needs its next chunk at
one *first crossing* step and every ``period`` steps after it, so the demand of a whole run is a
histogram of first crossings repeated with a stride: O(nb + k), not O(nb * k). Written once here
for the count allocators (kv/kernels.py) and the prefix cache (kv/pcache.py).
"""

from __future__ import annotations

import numpy as np

from servesim.jit import kernel


@kernel(inline=True)
def blocks_for(slots, bs):
    """Blocks of ``bs`` slots that ``slots`` token slots fill: ``ceil(slots / bs)``, the paged
    rule (a request's last block is the only one partly empty), written once for every pool."""
    return -(-slots // bs)


@kernel
def _first_step(x, threshold, period):
    """First decode step ``j >= 2`` at which ``x + j - 2`` (the slots before the step, ``x`` at
    step 2) reaches ``threshold + m * period``."""
    if x >= threshold:
        return 2 + (threshold - x) % period
    return 2 + threshold - x


@kernel
def _repeat_every(out, length, period):
    """``out[i] += out[i - period]`` in order: first crossings become every crossing."""
    for i in range(period, length):
        out[i] += out[i - period]


@kernel
def run_demand_into(c, k_max, threshold, period, chunk, out):
    """Blocks newly needed at decode steps ``j = 2..k_max`` (``out[j - 2]``) by requests with
    ``c`` computed tokens each (module docstring: first crossings, repeated every period)."""
    length = k_max - 1
    for i in range(length):
        out[i] = 0
    for i in range(len(c)):
        f = _first_step(int(c[i]) + 1, threshold, period)
        if f <= k_max:
            out[f - 2] += chunk
    _repeat_every(out, length, period)


@kernel
def slots_per_step(computed, holders, nh, ids, new, nb, k, bs, written, touched):
    """Written slots and touched blocks per step of an iteration (``k == 1``) or decode run,
    summed over ``holders[:nh]``: scheduled requests ``ids[:nb]`` (all holders) write
    ``computed + new`` slots in step 1 and one more each later step; other holders keep
    ``computed``. A block is touched when it holds at least one written slot."""
    used0 = 0
    touched_all = 0
    for i in range(nh):
        c = int(computed[holders[i]])
        used0 += c
        touched_all += blocks_for(c, bs)
    if nb == 0:
        for j in range(k):
            written[j] = used0
            touched[j] = touched_all
        return
    sum_new = 0
    t1 = touched_all
    for i in range(nb):
        c = int(computed[ids[i]])
        n = int(new[i])
        sum_new += n
        t1 += blocks_for(c + n, bs) - blocks_for(c, bs)
    for j in range(k):
        written[j] = used0 + sum_new + nb * j
    touched[0] = t1
    if k > 1:  # a new touched block at step j when the slots before it fill a block
        for j in range(1, k):
            touched[j] = 0
        for i in range(nb):
            f = _first_step(int(computed[ids[i]]) + int(new[i]), np.int64(0), bs)
            if f <= k:
                touched[f - 1] += 1
        _repeat_every(touched[1:], k - 1, bs)
        for j in range(1, k):
            touched[j] += touched[j - 1]
