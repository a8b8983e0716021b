"""Where the profiler measures: the op grids (``--grid sparse | dense | long``, ``--quick``), the
overhead calibration batches, the collectives' message sizes, and the whole-iteration validation
compositions (chosen apart from all of them). Torch-free: the main test suite checks them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .shapes import ALL_SHAPES

#: the stages of ``ops``, in the order they run
OPS_STAGES = ["token ops", "attn_decode", "overhead", "attn_prefill"]

TOKENS = [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072,
          4096, 6144, 8192, 12288, 16384]
#: lm_head / final_norm run on the sampled rows (one per sequence), so far fewer than tokens.
SAMPLED_MAX = 4096
PREFILL_CHUNKS = [16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192,
                  12288, 16384]
PREFILL_CTX = [0, 128, 256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768]
DECODE_BATCH = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
DECODE_CTX = [16, 32, 64, 128, 256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576,
              32768]
#: Decode batches whose whole forward calibrates the overheads (disjoint from validation). 384 and
#: 512 were added on 2026-11-30 (call 5) so that the rows cover the range vLLM's max_num_seqs takes
#: (256 by default, up to 512), instead of extrapolating the gaps linearly above 256.
CALIB_BATCHES = [1, 8, 32, 128, 256, 384, 512]
CALIB_CTX = 1024

# --- the dense grid (`--grid dense`, the default since 2026-11-30) ----------------------------
# The sparse grid above (powers of two and their 1.5x) leaves steps between its points that linear
# interpolation cannot see: GEMM tile/wave steps in the token ops and kernel-regime changes of
# decode attention between batch 16 and 32 (interpolation errors up to 44.5% for decode attention,
# 9.5% for the token-op sum in a dense-grid experiment, docs/calibration.md). The dense grid is
# uniform over the range serving uses, with the step growing with the size (never chosen from the
# validation compositions): every step listed below, whatever the model.
def _steps(*spans: tuple) -> list:
    """``(start, stop, step)`` spans, stop included, merged and sorted."""
    return sorted({v for a, b, s in spans for v in range(a, b + 1, s)})


#: tokens: 1-4 every 1, 4-16 every 2, 16-256 every 8, 256-1024 every 32, 1024-2048 every 64,
#: 2048-4096 every 256, 4096-8192 every 512, 8192-16384 every 2048  (100 points).
DENSE_TOKENS = _steps((1, 4, 1), (4, 16, 2), (16, 256, 8), (256, 1024, 32), (1024, 2048, 64),
                      (2048, 4096, 256), (4096, 8192, 512), (8192, 16384, 2048))
#: decode batch: 1-16 every 1, 16-64 every 4, 64-128 every 8, 128-256 every 16, 256-512 every 32
#: (52 rows).
DENSE_DECODE_BATCH = _steps((1, 16, 1), (16, 64, 4), (64, 128, 8), (128, 256, 16), (256, 512, 32))
#: decode context: the sparse list plus 768, 1536, 5120, 10240, 20480 (steps of at most 1.5x above
#: 512; the model's longest context is added as before).
DENSE_DECODE_CTX = sorted(set(DECODE_CTX) | {768, 1536, 5120, 10240, 20480})
#: prefill attention (dense since 2026-11-30, call 5): chunk 16, 64, then every 64 to 1024, every
#: 128 to 2048, every 256 to 4096, every 512 to 8192 (41 rows; neighbours differ by <= 12.5% in
#: chunk tokens above 512). FlashAttention-2 runs one thread block per 128 query rows and head, so
#: with few blocks per SM the time steps with ceil(chunk / 128) (waves of blocks over the 132 SMs):
#: on the sparse lattice chunk 768 cost the same as 512 (40 heads) and interpolation between 768
#: and 1024 missed the step. Context keeps the sparse list (rows are linear in context: holding out
#: every other context errs by a median 0.4-0.9%) without 128 / 256 (launch floor) and 32768 (no
#: chunk fits): 11 contexts. Chunks above 8192 are extrapolated (split rule, docs/calibration.md).
DENSE_PREFILL_CHUNKS = _steps((16, 16, 1), (64, 1024, 64), (1024, 2048, 128), (2048, 4096, 256),
                              (4096, 8192, 512))
DENSE_PREFILL_CTX = [0, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576]

# --- the long-context extension (`--grid long`, 2026-12-05) --------------------------------------
# Points beyond the dense grid only (rows to append to a dense pack: `combine --add-from`): token
# ops to 64K tokens (a 32K prompt prefilled whole, or a few long prompts batched), prefill chunks to
# 32K and contexts to 128K, decode contexts to 128K. Decode batches are the dense rows, cut by the
# memory cap (one layer's KV <= 48 GiB: batch 96 at 128K); 512 x 128K would need 256 GiB for ONE
# layer's KV, which no GPU holds, so no deployment reaches it.
LONG_TOKENS = [18432, 20480, 24576, 28672, 32768, 40960, 49152, 65536]
LONG_CHUNKS = [256, 1024, 2048, 4096, 8192, 10240, 12288, 16384, 20480, 24576, 32768]
LONG_PREFILL_CTX = [0, 4096, 8192, 16384, 24576, 28672, 32768, 49152, 65536, 98304, 114688]
LONG_DECODE_CTX = [40960, 49152, 65536, 81920, 98304, 114688]

GRIDS = {
    "sparse": dict(tokens=TOKENS, chunks=PREFILL_CHUNKS, prefill_ctx=PREFILL_CTX,
                   decode_batch=DECODE_BATCH, decode_ctx=DECODE_CTX),
    "dense": dict(tokens=DENSE_TOKENS, chunks=DENSE_PREFILL_CHUNKS, prefill_ctx=DENSE_PREFILL_CTX,
                  decode_batch=DENSE_DECODE_BATCH, decode_ctx=DENSE_DECODE_CTX),
    "long": dict(tokens=LONG_TOKENS, chunks=LONG_CHUNKS, prefill_ctx=LONG_PREFILL_CTX,
                 decode_batch=DENSE_DECODE_BATCH, decode_ctx=LONG_DECODE_CTX),
}

QUICK_TOKENS = [1, 8, 32, 128, 1024]
QUICK_CHUNKS = [16, 256, 1024]
QUICK_CTX = [0, 512, 1024]
QUICK_DECODE_BATCH = [1, 8, 32]
QUICK_DECODE_CTX = [128, 1024]
QUICK_CALIB_BATCHES = [1, 8, 32]
GRIDS["quick"] = dict(tokens=QUICK_TOKENS, chunks=QUICK_CHUNKS, prefill_ctx=QUICK_CTX,
                      decode_batch=QUICK_DECODE_BATCH, decode_ctx=QUICK_DECODE_CTX)

#: all_reduce / send_recv message sizes: 2 KiB .. 512 MiB in steps of 2 and 1.5.
COLL_SIZES = sorted({2 ** e for e in range(11, 30)} | {3 * 2 ** (e - 1) for e in range(11, 29)})
QUICK_COLL_SIZES = [2048, 65536, 1 << 20, 16 << 20]


def prefill_points(grid: dict, max_len: int) -> list:
    """(chunk, context) points of prefill attention on ``grid`` (a ``GRIDS`` value) for a model
    of ``max_len`` tokens, cheapest first; the long grid keeps only what the dense grid lacks, and
    each chunk's longest context."""
    chunks, ctxs = grid["chunks"], grid["prefill_ctx"]
    pts = [(t, c) for t in chunks for c in ctxs if t + c <= max_len]
    if grid is GRIDS["long"]:  # only what the dense grid lacks, and each chunk's longest context
        dense = set(DENSE_PREFILL_CHUNKS), set(DENSE_PREFILL_CTX)
        edge = [(t, max_len - t) for t in sorted(dense[0] | set(chunks))
                if max_len - t > max(DENSE_PREFILL_CTX)]
        pts = sorted(set(pts) | set(edge), key=lambda p: p[0] * (p[1] + p[0] / 2))
        pts = [(t, c) for t, c in pts if not (t in dense[0] and c in dense[1])]
    return sorted(pts, key=lambda p: p[0] * (p[1] + p[0] / 2))  # cheap first


def decode_points(grid: dict, max_len: int, kv_heads: int, head_dim: int, kv_cap: int, quick: bool) -> list:
    """(batch, context) points of decode attention on ``grid`` whose one layer's bf16 KV fits in
    ``kv_cap`` bytes, plus the model's longest context (not on the quick grid), cheapest first."""
    batches = grid["decode_batch"]
    ctxs = [c for c in grid["decode_ctx"] if c + 1 <= max_len]
    long_ok = grid is not GRIDS["long"] or max_len - 1 > max(DENSE_DECODE_CTX)
    if not quick and long_ok and (max_len - 1) not in ctxs:
        ctxs.append(max_len - 1)  # the longest context the model allows
    per_tok = 2 * kv_heads * head_dim * 2
    pts = [(b, c) for b in batches for c in ctxs if b * (c + 1) * per_tok <= kv_cap]
    return sorted(pts, key=lambda p: p[0] * p[1])


def grid_text(grid: str) -> dict:
    g = GRIDS[grid]

    def span(v):
        return f"{len(v)} points {v[0]}..{v[-1]}: {v}"
    return dict(name=grid, tokens=span(g["tokens"]), decode_batch=span(g["decode_batch"]),
                decode_context=span(g["decode_ctx"]) + " (+ max_model_len - 1)",
                prefill_chunk=span(g["chunks"]), prefill_context=span(g["prefill_ctx"]))


@dataclass(frozen=True)
class Composition:
    """One iteration's batch: n_prefill sequences each computing prefill_len new tokens on top of
    prefill_ctx cached ones, plus n_decode sequences each with decode_ctx cached tokens."""

    n_prefill: int
    prefill_len: int
    prefill_ctx: int
    n_decode: int
    decode_ctx: int

    @property
    def tokens(self) -> int:
        return self.n_prefill * self.prefill_len + self.n_decode

    @property
    def kv_slots(self) -> int:
        return self.n_prefill * (self.prefill_ctx + self.prefill_len) + self.n_decode * (self.decode_ctx + 1)

    def key(self) -> str:
        return (f"{self.n_prefill},{self.prefill_len},{self.prefill_ctx},"
                f"{self.n_decode},{self.decode_ctx}")


#: Long-context validation batches (``iterations --compositions long``): each beyond the dense grid
#: (tokens > 16,384, a chunk > 8,192 or its context > 24,576, or a decode context > 32,768) and off
#: the long grid's points, so they check the long rows (``--grid long``) and the interpolation
#: between them on forwards the fit never reads. Written to validation_long/<gpu>/ (not read with
#: the standard set, whose statistics stay comparable).
LONG_PREFILL = [(1, 9000), (1, 11000), (1, 14000), (1, 18000), (1, 22000), (1, 27000), (1, 31000),
                (2, 10000), (3, 7000), (4, 5000), (1, 45000), (1, 60000)]
LONG_PREFILL_CTX = [(1, 4096, 28000), (1, 2048, 30500), (1, 12000, 18000), (1, 3000, 27500),
                    (1, 6000, 26000), (1, 8192, 40000), (1, 6000, 56000), (1, 16000, 70000),
                    (1, 1024, 100000), (1, 512, 120000)]
LONG_DECODE = [(1, 40000), (1, 70000), (1, 120000), (2, 90000), (4, 60000), (8, 45000), (16, 36000),
               (32, 34000), (64, 33000), (12, 55000)]
LONG_MIXED = [(1, 12000, 0, 16, 2000), (1, 16000, 0, 8, 8000), (1, 2048, 28000, 8, 30000),
              (1, 8192, 0, 32, 36000), (1, 4096, 0, 64, 34000), (1, 10000, 20000, 4, 80000)]
QUICK_LONG = [(1, 200, 0, 0, 0), (1, 64, 300, 0, 0), (0, 0, 0, 4, 400), (1, 100, 0, 4, 300)]


def long_compositions(model: str, quick: bool) -> list[Composition]:
    """The long-context validation batches (``LONG_*``) that fit ``model``'s max_model_len."""
    raw = QUICK_LONG if quick else (
        [(n, ln, 0, 0, 0) for n, ln in LONG_PREFILL] + [(n, ln, c, 0, 0) for n, ln, c in LONG_PREFILL_CTX]
        + [(0, 0, 0, b, c) for b, c in LONG_DECODE] + LONG_MIXED)
    return _within(model, raw)


def _within(model: str, raw: list[tuple]) -> list[Composition]:
    max_len = ALL_SHAPES[model]["max_model_len"]
    calib = {(0, 0, 0, b, CALIB_CTX) for b in CALIB_BATCHES + QUICK_CALIB_BATCHES}
    out = []
    for t in raw:
        c = Composition(*t)
        if c.n_prefill and c.prefill_ctx + c.prefill_len > max_len:
            continue
        if c.n_decode and c.decode_ctx + 1 > max_len:
            continue
        if t in calib:
            continue
        out.append(c)
    return out


def validation_compositions(model: str, quick: bool, which: str = "standard") -> list[Composition]:
    """Batches for whole-iteration validation, chosen apart from the op grid (off-grid sizes such
    as 300 tokens, context 1500, batch 48) and apart from the overhead calibration batches;
    ``which="long"``: the long-context set (:func:`long_compositions`)."""
    if which == "long":
        return long_compositions(model, quick)
    if quick:
        raw = [(1, 100, 0, 0, 0), (1, 300, 700, 0, 0), (0, 0, 0, 12, 300), (1, 64, 100, 6, 500)]
    else:
        prefill = [(1, 17), (1, 100), (1, 250), (1, 300), (1, 700), (1, 1000), (1, 1500), (1, 2000),
                   (1, 2500), (1, 3000), (1, 4000), (1, 5000), (1, 6000), (1, 8000), (2, 300),
                   (2, 1000), (2, 2000), (3, 700), (4, 500), (4, 1000), (8, 200), (8, 64),
                   (16, 100), (6, 900)]
        prefill_ctx = [(1, 300, 1500), (1, 512, 3000), (1, 1000, 1000), (1, 2000, 5000),
                       (1, 700, 6000), (1, 100, 12000), (1, 1200, 25000), (1, 2048, 20000),
                       (2, 512, 2500), (1, 4000, 3000), (1, 64, 7000), (1, 256, 30000),
                       (1, 1500, 700), (1, 3000, 9000), (2, 1000, 4000), (1, 800, 15000)]
        decode = [(1, 100), (1, 2048), (1, 15000), (3, 700), (4, 30000), (12, 3000), (16, 12000),
                  (20, 20000), (24, 1500), (40, 7000), (48, 1500), (48, 6000), (64, 300),
                  (64, 700), (64, 2048), (64, 5000), (96, 4000), (100, 1000), (150, 3000),
                  (160, 500), (200, 300), (200, 2048), (250, 1500), (300, 1200), (384, 700),
                  (450, 256), (500, 400), (72, 16000)]
        mixed = [(1, 256, 0, 32, 1500), (1, 256, 3000, 64, 2048), (1, 256, 1000, 200, 300),
                 (1, 512, 0, 48, 1000), (1, 512, 1500, 96, 3000), (1, 512, 6000, 160, 700),
                 (1, 512, 0, 256, 2048), (1, 2048, 0, 32, 1500), (1, 2048, 2048, 64, 700),
                 (1, 2048, 0, 128, 3000), (1, 2048, 5000, 256, 1000), (1, 300, 0, 40, 1200),
                 (1, 1000, 500, 80, 2500), (1, 1500, 0, 200, 600), (1, 100, 700, 150, 1800),
                 (1, 4000, 0, 64, 1000), (2, 256, 0, 48, 2000), (2, 512, 1000, 96, 900),
                 (1, 768, 8000, 120, 5000), (1, 1024, 0, 250, 400), (1, 2048, 20000, 48, 20000),
                 (1, 3000, 2000, 32, 4000), (1, 64, 100, 300, 900), (1, 512, 12000, 64, 12000)]
        raw = ([(n, ln, 0, 0, 0) for n, ln in prefill] + [(n, ln, c, 0, 0) for n, ln, c in prefill_ctx]
               + [(0, 0, 0, b, c) for b, c in decode] + mixed)
    return _within(model, raw)

