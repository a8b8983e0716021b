"""A pack's attention lattices as kernels: decode attention over (batch, KV length) and prefill
attention over (chunk tokens, cached context), interpolated on the measured grid and extended to
a far point (:mod:`servesim.perf.packtables` builds the tables; :mod:`servesim.perf.kernels`
prices iterations with them).
"""

import numpy as np

from servesim.jit import bisect_right, kernel


@kernel
def decode_lattice_into(batch, kv, n, out, grid, table, batches, beta, far):
    """``out[e]`` = per-layer decode attention (ms) of ``batch`` sequences reading ``kv[e]`` keys
    in all, ``e < n`` (``out`` may be ``kv``): linear in per-sequence context ``kv / batch``
    within a batch row, linear in batch between rows and, with slope ``beta``, beyond the last
    (DecodeAttention.reference is the same in numpy). The row blend is chosen once per call."""
    ng = grid.shape[0]
    nb = batches.shape[0]
    b_last = batches[nb - 1]
    above = batch > b_last
    row = nb - 1
    blend = False
    w = 0.0
    if batch < b_last:
        row = bisect_right(batches, batch) - 1
        if row < 0:
            row = 0
        blend = not (batches[row] == batch or batch < batches[0])
        if blend:
            w = (batch - batches[row]) / (batches[row + 1] - batches[row])
    for e in range(n):
        c = kv[e] / batch
        if c > far:
            c = far
        j = bisect_right(grid, c) - 1
        if j > ng - 2:
            j = ng - 2
        f = (c - grid[j]) * (1.0 / (grid[j + 1] - grid[j]))
        v0 = table[row, j]
        o = v0 + f * (table[row, j + 1] - v0)
        if above:
            b0 = beta[j]
            o = o + (batch - b_last) * (b0 + f * (beta[j + 1] - b0))
        elif blend:
            h0 = table[row + 1, j]
            o = o + w * ((h0 + f * (table[row + 1, j + 1] - h0)) - o)
        out[e] = o


@kernel
def decode_lattice(batch, kv, grid, table, batches, beta, far):
    """:func:`decode_lattice_into` as a new array (DecodeAttention.__call__)."""
    out = np.empty(kv.shape[0])
    decode_lattice_into(batch, kv, kv.shape[0], out, grid, table, batches, beta, far)
    return out


@kernel
def prefill_lattice_ms(t, c, chunks, grid, flat, far):
    """Per-layer prefill attention (ms) of a chunk of ``t`` tokens over ``c`` cached: bilinear on
    the (chunk, context) lattice, ``t`` clamped to the rows (PrefillAttention._lattice_reference)."""
    ng = grid.shape[0]
    nc = chunks.shape[0]
    if c > far:
        c = far
    j = bisect_right(grid, c) - 1
    if j > ng - 2:
        j = ng - 2
    fc = (c - grid[j]) * (1.0 / (grid[j + 1] - grid[j]))
    if nc == 1:
        v0 = flat[j]
        return v0 + fc * (flat[j + 1] - v0)
    if t < chunks[0]:
        t = chunks[0]
    if t > chunks[nc - 1]:
        t = chunks[nc - 1]
    i = bisect_right(chunks, t) - 1
    if i > nc - 2:
        i = nc - 2
    ft = (t - chunks[i]) * (1.0 / (chunks[i + 1] - chunks[i]))
    k = i * ng + j
    v00 = flat[k]
    v01 = flat[k + 1]
    v10 = flat[k + ng]
    v11 = flat[k + ng + 1]
    v0 = v00 + fc * (v01 - v00)
    return v0 + ft * ((v10 + fc * (v11 - v10)) - v0)


@kernel
def prefill_attention_ms(t, c, split, chunks, grid, flat, far):
    """One chunk's per-layer prefill attention (ms). With ``split`` (some chunk of the same call
    is longer than the last row), every chunk goes in row-sized pieces over a growing context --
    the FLOPs of the long chunk -- summed in order (PrefillAttention._evaluate)."""
    if not split:
        return prefill_lattice_ms(t, c, chunks, grid, flat, far)
    t_max = chunks[chunks.shape[0] - 1]
    pieces = np.ceil(t / t_max)
    out = 0.0
    k = 0
    while pieces > k:
        size = t - k * t_max if pieces == k + 1 else t_max
        out += prefill_lattice_ms(size, c + k * t_max, chunks, grid, flat, far)
        k += 1
    return out


@kernel
def prefill_lattice(t, c, chunks, grid, flat, far):
    """:func:`prefill_lattice_ms` of each (t, c) pair (PrefillAttention._lattice)."""
    out = np.empty(t.shape[0])
    for e in range(t.shape[0]):
        out[e] = prefill_lattice_ms(t[e], c[e], chunks, grid, flat, far)
    return out


@kernel
def prefill_attention(t, c, chunks, grid, flat, far):
    """:func:`prefill_attention_ms` of each (t, c) pair (PrefillAttention.__call__)."""
    split = False
    for e in range(t.shape[0]):
        if t[e] > chunks[chunks.shape[0] - 1]:
            split = True
    out = np.empty(t.shape[0])
    for e in range(t.shape[0]):
        out[e] = prefill_attention_ms(t[e], c[e], split, chunks, grid, flat, far)
    return out
