"""Compiled decode-attention lookup for the pack model (the hot loop's most frequent question).

:meth:`servesim.perf.packmodel.DecodeAttention.__call__` in numpy takes ~20 small array operations
(~12 µs); this kernel does the same arithmetic, element by element, in one call. numba is imported
on the first call, not when a pack is loaded, so loading a scenario and a pack stays fast.
"""

from __future__ import annotations

import numpy as np

_KERNELS: dict = {}  # name -> compiled function, built on first use


def _kernel(name: str):
    k = _KERNELS.get(name)
    if k is None:
        k = _KERNELS[name] = {"prefill": _build_prefill, "decode": _build}[name]()
    return k


def _build_prefill():
    from numba import njit

    @njit(cache=True)
    def prefill_lattice(t, c, chunks, grid, inv_dc, inv_dt, flat, far):
        n = t.shape[0]
        out = np.empty(n)
        ng = grid.shape[0]
        nc = chunks.shape[0]
        for e in range(n):
            ce = c[e]
            if ce > far:
                ce = far
            j = np.searchsorted(grid, ce, side="right") - 1
            if j > ng - 2:
                j = ng - 2
            fc = (ce - grid[j]) * inv_dc[j]
            if nc == 1:
                v0 = flat[j]
                out[e] = v0 + fc * (flat[j + 1] - v0)
                continue
            te = t[e]
            if te < chunks[0]:
                te = chunks[0]
            if te > chunks[nc - 1]:
                te = chunks[nc - 1]
            i = np.searchsorted(chunks, te, side="right") - 1
            if i > nc - 2:
                i = nc - 2
            ft = (te - chunks[i]) * inv_dt[i]
            k = i * ng + j
            v00 = flat[k]
            v01 = flat[k + 1]
            v10 = flat[k + ng]
            v11 = flat[k + ng + 1]
            v0 = v00 + fc * (v01 - v00)
            out[e] = v0 + ft * ((v10 + fc * (v11 - v10)) - v0)
        return out

    return prefill_lattice


def prefill_lattice(t: np.ndarray, c: np.ndarray, chunks, grid, inv_dc, inv_dt, flat, far: float) -> np.ndarray:
    return _kernel("prefill")(t, c, chunks, grid, inv_dc, inv_dt, flat, far)


def _build():
    from numba import njit

    @njit(cache=True)
    def decode_lattice(batch, kv, grid, inv_dx, table, batches, beta, far):
        n = kv.shape[0]
        out = np.empty(n)
        ng = grid.shape[0]
        nb = batches.shape[0]
        b_last = batches[nb - 1]
        i = 0
        w = 0.0
        blend = False
        if batch < b_last:
            i = np.searchsorted(batches, batch, side="right") - 1
            if i < 0:
                i = 0
            blend = not (batches[i] == batch or batch < batches[0])
            if blend:
                w = (batch - batches[i]) / (batches[i + 1] - batches[i])
        for e in range(n):
            c = kv[e] / batch
            if c > far:
                c = far
            j = np.searchsorted(grid, c, side="right") - 1
            if j > ng - 2:
                j = ng - 2
            f = (c - grid[j]) * inv_dx[j]
            if batch >= b_last:
                v0 = table[nb - 1, j]
                o = v0 + f * (table[nb - 1, j + 1] - v0)
                if batch > b_last:
                    b0 = beta[j]
                    o = o + (batch - b_last) * (b0 + f * (beta[j + 1] - b0))
                out[e] = o
                continue
            v0 = table[i, j]
            o = v0 + f * (table[i, j + 1] - v0)
            if blend:
                h0 = table[i + 1, j]
                o = o + w * ((h0 + f * (table[i + 1, j + 1] - h0)) - o)
            out[e] = o
        return out

    return decode_lattice


def decode_lattice(batch: int, kv: np.ndarray, grid, inv_dx, table, batches, beta, far: float) -> np.ndarray:
    return _kernel("decode")(batch, kv, grid, inv_dx, table, batches, beta, far)
