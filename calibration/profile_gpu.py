#!/usr/bin/env python3
"""Measure op timings on a GPU and write servesim calibration packs and validation data.

Why this exists: servesim predicts an iteration's time by summing per-op timings from a
calibration pack (format: calibration/PACK_FORMAT.md). Those timings must come from a real GPU,
and the prediction must be checked against whole iterations measured on the same GPU. This one
script does both, on any CUDA GPU, with nothing but PyTorch and NumPy installed (the GPU machines
have no servesim dependencies, so the four model shapes are embedded here and must stay identical
to servesim/models.py).

Modes (see ``--help``):

* ``ops``         every op of PACK_FORMAT.md for one model shape and TP degree (per-rank slices),
                  plus ``overhead_eager`` / ``overhead_cuda_graph`` from a few calibration forwards.
* ``iterations``  whole random-weight forwards of mixed prefill/decode batches, eager and as a CUDA
                  graph: validation data, never read by the fit.
* ``allreduce``   NCCL ``all_reduce`` over N GPUs and ``send_recv`` between two (one process a GPU).
* ``all``         the above for several models, spread over the visible GPUs, then packs merged.
* ``merge``       add measured collectives to the packs (used by ``all``; also runnable by hand).
* ``backends``    time a few attention shapes on every SDPA backend (evidence for the choice).

How op times are taken: random bf16 tensors (never zeros), warm-up, then the op is captured
``R`` times back to back in a CUDA graph and the graph is replayed; the op time is replay time / R,
median over repeats, with the standard deviation recorded. Graph replay removes the CPU launch cost
from op times on purpose: that cost is measured separately as ``overhead_eager`` /
``overhead_cuda_graph`` (the wall time of a real forward minus the sum of its ops as the tables
predict). Weights and KV caches are rotated among several copies so that a small op does not run
out of the L2 cache, which it never does in a real forward where every layer has its own weights.
On CPU (``--device cpu``, for logic tests only) times are wall-clock.

NVLink multicast (NVLS) is forced off for NCCL, PyTorch and NVSHMEM before torch is imported:
on shared multi-GPU hosts a program that uses it can take the GPUs out of service.
"""

from __future__ import annotations

import os

# Multicast off, before torch or NCCL is loaded, and inherited by every child process we start.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import argparse  # noqa: E402
import csv  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import queue  # noqa: E402
import shlex  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable, Optional  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

try:  # optional: nicer YAML; a small writer below is used without it
    import yaml  # type: ignore
except Exception:  # pragma: no cover - depends on the machine
    yaml = None

# ============================================================================== model shapes
#: Copied from servesim/models.py (the models' published config.json files). Keep identical.
SHAPES: dict[str, dict] = {
    "llama-3-8b": dict(num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128,
                       intermediate_size=14336, vocab_size=128256, max_model_len=8192,
                       tie_word_embeddings=False),
    "qwen3-4b": dict(num_layers=36, hidden_size=2560, num_heads=32, num_kv_heads=8, head_dim=128,
                     intermediate_size=9728, vocab_size=151936, max_model_len=32768,
                     tie_word_embeddings=True),
    "qwen3-8b": dict(num_layers=36, hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128,
                     intermediate_size=12288, vocab_size=151936, max_model_len=32768,
                     tie_word_embeddings=False),
    "qwen3-14b": dict(num_layers=40, hidden_size=5120, num_heads=40, num_kv_heads=8, head_dim=128,
                      intermediate_size=17408, vocab_size=151936, max_model_len=32768,
                      tie_word_embeddings=False),
    # the 128K-context Llama (same layer shapes as llama-3-8b): long-context attention rows
    "llama-3.1-8b": dict(num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128,
                         intermediate_size=14336, vocab_size=128256, max_model_len=131072,
                         tie_word_embeddings=False),
    # mixture of experts: every layer sparse, 128 experts, top-8 renormalized (Qwen3-MoE)
    "qwen3-30b-a3b": dict(num_layers=48, hidden_size=2048, num_heads=32, num_kv_heads=4, head_dim=128,
                          intermediate_size=6144, vocab_size=151936, max_model_len=32768,
                          tie_word_embeddings=False, num_experts=128, num_experts_per_tok=8,
                          moe_intermediate_size=768),
}
#: Tiny shapes for logic tests on CPU (not servesim models; never written as real packs).
TEST_SHAPES: dict[str, dict] = {
    "tiny": dict(num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64,
                 intermediate_size=512, vocab_size=1000, max_model_len=2048,
                 tie_word_embeddings=False),
    "tiny-tied": dict(num_layers=3, hidden_size=128, num_heads=4, num_kv_heads=4, head_dim=32,
                      intermediate_size=256, vocab_size=777, max_model_len=1024,
                      tie_word_embeddings=True),
    "tiny-moe": dict(num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64,
                     intermediate_size=512, vocab_size=1000, max_model_len=2048,
                     tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2,
                     moe_intermediate_size=64),
}
MOE_KEYS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size")
SHAPE_KEYS = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
              "intermediate_size", "vocab_size")
ALL_SHAPES = {**SHAPES, **TEST_SHAPES}

RMS_EPS = 1e-6

# ============================================================================== grids
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


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


# ============================================================================== shapes per rank
@dataclass(frozen=True)
class RankShape:
    """What one tensor-parallel rank computes: heads, KV heads, MLP width and vocab split by TP.

    KV heads are replicated when TP exceeds them (min 1), as vLLM does; the hidden size is not
    split (activations are full width on every rank after each all-reduce).
    """

    model: str
    tp: int
    L: int
    h: int
    H: int
    KVH: int
    D: int
    I: int  # noqa: E741 - intermediate size, the usual name
    V: int
    max_len: int
    tied: bool
    weights: str = "bf16"  # weight format of the four projection GEMMs (variants.WEIGHT_FORMATS)
    E: int = 0  # experts (0: dense MLP)
    K: int = 0  # experts per token
    MI: int = 0  # per-expert intermediate size, per rank (experts tensor-sharded, no EP)

    @classmethod
    def of(cls, model: str, tp: int, weights: str = "bf16") -> "RankShape":
        s = ALL_SHAPES[model]
        if s["num_heads"] % tp or s["intermediate_size"] % tp or s.get("moe_intermediate_size", 0) % tp:
            raise SystemExit(f"tp={tp} does not divide the heads/intermediate size of {model}")
        if weights not in PACK_WEIGHTS:
            raise SystemExit(f"--weights {weights}: packs are measured for {PACK_WEIGHTS}; time other "
                             f"formats with the `survey` mode")
        if weights != "bf16" and s.get("num_experts"):
            raise SystemExit(f"--weights {weights} with {model}: quantized experts are not measured "
                             f"(the experts' grouped GEMMs run bf16); use --weights bf16")
        return cls(model=model, tp=tp, L=s["num_layers"], h=s["hidden_size"], H=s["num_heads"] // tp,
                   KVH=max(1, s["num_kv_heads"] // tp), D=s["head_dim"],
                   I=s["intermediate_size"] // tp, V=-(-s["vocab_size"] // tp),
                   max_len=s["max_model_len"], tied=bool(s["tie_word_embeddings"]), weights=weights,
                   E=s.get("num_experts", 0), K=s.get("num_experts_per_tok", 0),
                   MI=s.get("moe_intermediate_size", 0) // tp)

    @property
    def moe(self) -> bool:
        return self.E > 0

    @property
    def stem(self) -> str:
        return pack_stem(self.model, self.tp, self.weights)

    def moe_shape(self):
        return MoEShape(self.E, self.K, self.MI, self.h)

    def linear(self, w):
        """A projection weight as the forward multiplies it: the bf16 tensor itself, or a
        quantized linear (variants.QLinear) for --weights fp8."""
        return w if self.weights == "bf16" else QLinear(w, self.weights)

    @property
    def qkv_out(self) -> int:
        return (self.H + 2 * self.KVH) * self.D

    def as_dict(self) -> dict:
        d = dict(num_layers=self.L, hidden_size=self.h, num_heads=self.H, num_kv_heads=self.KVH,
                 head_dim=self.D, intermediate_size=self.I, vocab_size=self.V)
        if self.moe:
            d.update(num_experts=self.E, num_experts_per_tok=self.K, moe_intermediate_size=self.MI)
        return d


#: weight formats a pack can be measured in (the stem's quantization suffix: servesim's
#: ``model.quantization`` name); other formats are timed by ``survey`` only
PACK_WEIGHTS = ("bf16", "fp8")


def pack_stem(model: str, tp: int, weights: str = "bf16") -> str:
    """``<model>[-<quantization>][-tp<N>]`` (calibration/PACK_FORMAT.md)."""
    q = "" if weights == "bf16" else f"-{weights}"
    return f"{model}{q}" if tp == 1 else f"{model}{q}-tp{tp}"


def stem_tp(stem: str) -> int:
    head, sep, tail = stem.rpartition("-tp")
    return int(tail) if sep and tail.isdigit() else 1


# ============================================================================== time budget
class BudgetExceeded(RuntimeError):
    """Raised when the hard deadline passes: the caller writes what it has and says what it skipped."""


@dataclass
class Budget:
    """Deadlines (epoch seconds). Past ``soft`` measurements use the minimum repeats; past ``hard``
    they stop. This keeps one device call inside its limit and still returns files."""

    soft: Optional[float] = None
    hard: Optional[float] = None

    def fast(self) -> bool:
        return self.soft is not None and time.time() > self.soft

    def check(self) -> None:
        if self.hard is not None and time.time() > self.hard:
            raise BudgetExceeded("hard deadline passed")


# ============================================================================== timing
@dataclass
class Meas:
    median_ms: float
    std_ms: float
    n: int
    method: str


class Timer:
    """Median-of-repeats timing that never returns a zero, negative or non-finite time.

    CUDA: op time = (CUDA-event time of a graph replay holding R back-to-back calls) / R; falls back
    to events around R eager calls if capture fails. CPU: wall clock around R calls.
    """

    def __init__(self, device: torch.device, budget: Budget, quick: bool = False,
                 max_rep: Optional[int] = None):
        self.device = device
        self.cuda = device.type == "cuda"
        self.budget = budget
        self.quick = quick
        self.warmup = 2 if quick else 5
        self.min_rep = 3 if quick else 5
        self.max_rep = 5 if quick else (max_rep or 20)
        self.target_graph_ms = 1.0     # make one replay at least this long (amortizes its launch)
        self.budget_ms = 200.0         # GPU time spent on the timed repeats of one point, about
        self.max_r = 64
        self.fwd_budget_ms = 400.0     # the same for whole forwards
        self.fwd_max_rep = 5 if quick else 15
        self.capture_failures: dict[str, str] = {}
        self.dropped: list[str] = []
        self._stream = torch.cuda.Stream(device) if self.cuda else None

    # --- helpers -------------------------------------------------------------------------
    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    @staticmethod
    def _event():
        return torch.cuda.Event(enable_timing=True)

    def capture(self, body: Callable[[], object]) -> "torch.cuda.CUDAGraph":
        """Capture ``body`` into a CUDA graph on a side stream.

        Done by hand rather than with ``torch.cuda.graph`` because that context manager empties the
        allocator cache on every capture, which makes hundreds of captures slow.
        """
        g = torch.cuda.CUDAGraph()
        s = self._stream
        s.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(s):
            g.capture_begin()
            try:
                body()
            finally:
                g.capture_end()
        torch.cuda.current_stream(self.device).wait_stream(s)
        return g

    @staticmethod
    def _summarize(times: list[float], method: str) -> Optional[Meas]:
        good = [t for t in times if math.isfinite(t) and t > 0]
        if not good or len(good) < max(1, len(times) // 2):
            return None
        arr = np.asarray(good, dtype=np.float64)
        med = float(np.median(arr))
        std = float(arr.std(ddof=1)) if len(arr) > 1 else 0.0
        if not (math.isfinite(med) and med > 0):
            return None
        return Meas(med, std, len(arr), method)

    def _reps(self, one_ms: float, budget_ms: float, max_rep: int) -> int:
        if self.budget.fast():
            return self.min_rep
        n = int(budget_ms / max(one_ms, 1e-6))
        return max(self.min_rep, min(max_rep, n))

    # --- ops -----------------------------------------------------------------------------
    def measure(self, fns: list[Callable[[], object]], label: str = "",
                max_rep: Optional[int] = None) -> Optional[Meas]:
        """Time one op given as ``len(fns)`` variants (same op on rotated copies of its inputs);
        ``max_rep`` lowers the most timed replays for this op (surveys)."""
        self.budget.check()
        saved = self.max_rep
        if max_rep:
            self.max_rep = max(self.min_rep, min(self.max_rep, max_rep))
        try:
            for attempt in range(3):
                m = self._measure_cuda(fns, label) if self.cuda else self._measure_cpu(fns)
                if m is not None:
                    return m
                log(f"  re-measuring {label}: attempt {attempt + 1} gave no positive finite time")
        finally:
            self.max_rep = saved
        self.dropped.append(label)
        log(f"  DROPPED {label}: no positive finite time after 3 attempts")
        return None

    def _measure_cpu(self, fns) -> Optional[Meas]:
        k = len(fns)
        for i in range(max(self.warmup, k)):
            fns[i % k]()
        t0 = time.perf_counter()
        for f in fns:
            f()
        one = (time.perf_counter() - t0) * 1e3 / k
        r = max(k, min(self.max_r, math.ceil(self.target_graph_ms / max(one, 1e-4))))
        n = self._reps(one * r, self.budget_ms, self.max_rep)
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            for i in range(r):
                fns[i % k]()
            times.append((time.perf_counter() - t0) * 1e3 / r)
        return self._summarize(times, "wall-clock")

    def _measure_cuda(self, fns, label) -> Optional[Meas]:
        k = len(fns)
        for i in range(max(self.warmup, k)):
            fns[i % k]()
        self.sync()
        e0, e1 = self._event(), self._event()
        e0.record()
        for f in fns:
            f()
        e1.record()
        self.sync()
        one = e0.elapsed_time(e1) / k
        r = max(k, min(self.max_r, math.ceil(self.target_graph_ms / max(one, 1e-4))))
        n = self._reps(one * r, self.budget_ms, self.max_rep)
        try:
            g = self.capture(lambda: [fns[i % k]() for i in range(r)])
        except Exception as exc:  # fall back to eager, and say so in the metadata
            self.capture_failures.setdefault(label.split(" ")[0], f"{type(exc).__name__}: {exc}"[:300])
            g = None
            self.sync()
        starts = [self._event() for _ in range(n)]
        ends = [self._event() for _ in range(n)]
        if g is not None:
            g.replay()
            g.replay()
            for j in range(n):
                starts[j].record()
                g.replay()
                ends[j].record()
            method = "cuda-graph"
        else:
            for j in range(n):
                starts[j].record()
                for i in range(r):
                    fns[i % k]()
                ends[j].record()
            method = "eager-events"
        self.sync()
        times = [starts[j].elapsed_time(ends[j]) / r for j in range(n)]
        del g
        return self._summarize(times, method)

    # --- whole forwards ---------------------------------------------------------------------
    def measure_forward(self, fwd: Callable[[], object], graph: bool, label: str = "") -> Optional[Meas]:
        """Wall time of one forward: synchronize, event, forward (or graph replay), event, sync.

        Synchronizing before each repeat keeps the CPU launch time in the eager number, as in a
        serving loop that waits for each step's tokens before launching the next step.
        """
        self.budget.check()
        for attempt in range(3):
            m = self._measure_forward_once(fwd, graph)
            if m is not None:
                return m
            log(f"  re-measuring {label}: attempt {attempt + 1} gave no positive finite time")
        self.dropped.append(label)
        log(f"  DROPPED {label}: no positive finite time after 3 attempts")
        return None

    def _measure_forward_once(self, fwd, graph: bool) -> Optional[Meas]:
        warm = 1 if self.quick else 2
        if not self.cuda:
            if graph:
                raise RuntimeError("CUDA graphs need a CUDA device")
            for _ in range(warm):
                fwd()
            t0 = time.perf_counter()
            fwd()
            one = (time.perf_counter() - t0) * 1e3
            n = self._reps(one, self.fwd_budget_ms, self.fwd_max_rep)
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                fwd()
                times.append((time.perf_counter() - t0) * 1e3)
            return self._summarize(times, "wall-clock")
        for _ in range(warm):
            fwd()
        self.sync()
        run: Callable[[], object] = fwd
        g = None
        if graph:
            g = self.capture(fwd)
            run = g.replay
            for _ in range(warm):
                run()
            self.sync()
        e0, e1 = self._event(), self._event()
        e0.record()
        run()
        e1.record()
        self.sync()
        one = e0.elapsed_time(e1)
        n = self._reps(one, self.fwd_budget_ms, self.fwd_max_rep)
        times = []
        for _ in range(n):
            self.sync()
            e0.record()
            run()
            e1.record()
            self.sync()
            times.append(e0.elapsed_time(e1))
        del g, run
        return self._summarize(times, "cuda-graph" if graph else "eager")


# ============================================================================== SDPA backends
# Which attention kernel runs each call: calibration/attn_backends.py (every backend that passes
# the float64 check is timed; each op keeps the fastest, and forwards make the same choice).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from attn_backends import (KINDS, QUICK_SURVEY, SURVEY, BackendChooser, BackendSwitch,  # noqa: E402
                           KindSurvey, Sdpa, kind_of, math_fits, only)
from variants import FORMAT_DTYPE, MoE, MoEShape, QLinear  # noqa: E402


# ============================================================================== the ops
# Each op is one function used both by the op tables and by the whole forward, so that the
# forward's kernels are exactly the kernels the tables time.

def rms_norm_op(x, w):
    return F.rms_norm(x, (x.shape[-1],), w, eps=RMS_EPS)


def linear_op(x, w):
    """``x @ w.T``: ``w`` a bf16 tensor, or a quantized linear (variants.QLinear) that is called."""
    return F.linear(x, w) if isinstance(w, torch.Tensor) else w(x)


def rope_op(qkv, positions, cos_sin, H: int, KVH: int, D: int):
    """Neox-style rotary embedding on q and k; returns a new [T, H+KVH, D] tensor.

    Five kernels: one gather of cos|sin by position, two multiplies and two multiply-adds.
    """
    T = qkv.shape[0]
    half = D // 2
    qk = qkv[:, : (H + KVH) * D].view(T, H + KVH, D)
    cs = cos_sin.index_select(0, positions)
    cos = cs[:, None, :half]
    sin = cs[:, None, half:]
    out = torch.empty((T, H + KVH, D), device=qkv.device, dtype=qkv.dtype)
    x1, x2 = qk[..., :half], qk[..., half:]
    o1, o2 = out[..., :half], out[..., half:]
    torch.mul(x1, cos, out=o1)
    o1.addcmul_(x2, sin, value=-1)
    torch.mul(x2, cos, out=o2)
    o2.addcmul_(x1, sin)
    return out


def kv_write_op(k_cache, v_cache, k, v, slots):
    """Scatter the step's new K and V rows ([T, KVH, D]) into flat caches ([S, KVH, D]) at slots,
    like vLLM's reshape_and_cache (two kernels)."""
    k_cache.index_copy_(0, slots, k)
    v_cache.index_copy_(0, slots, v)


def attn_prefill_op(q_rows, k_rows, v_rows, out_rows):
    """One prefilling sequence: q_rows [Tq, H, D] over k/v_rows [ctx+Tq, KVH, D] (the sequence's
    cache, new tokens at the end); the result is copied into out_rows [Tq, H, D]."""
    q = q_rows.unsqueeze(0).transpose(1, 2)
    k = k_rows.unsqueeze(0).transpose(1, 2)
    v = v_rows.unsqueeze(0).transpose(1, 2)
    o = Sdpa.prefill(q, k, v)
    out_rows.copy_(o[0].transpose(0, 1))


def attn_decode_op(q_rows, k_flat, v_flat, out_rows, batch: int, kv_len: int):
    """A decode batch: q_rows [B, H, D], caches [B*kv_len, KVH, D] (sequence-major), out [B, H, D]."""
    q = q_rows.unsqueeze(2)
    kvh, d = k_flat.shape[1], k_flat.shape[2]
    k = k_flat.view(batch, kv_len, kvh, d).transpose(1, 2)
    v = v_flat.view(batch, kv_len, kvh, d).transpose(1, 2)
    o = Sdpa.decode(q, k, v)
    out_rows.copy_(o.squeeze(2))


def act_op(gu, inter: int):
    return F.silu(gu[:, :inter]) * gu[:, inter:]


def embed_op(ids, table):
    return F.embedding(ids, table)


def make_cos_sin(max_pos: int, D: int, device, dtype, base: float = 500000.0):
    inv = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat([ang.cos(), ang.sin()], dim=-1).to(device=device, dtype=dtype)


# ============================================================================== op tables
class OpBench:
    """Times every op of one (model, TP) rank shape on its grid and returns pack rows."""

    def __init__(self, rs: RankShape, device, timer: Timer, sdpa: Sdpa, quick: bool,
                 kv_cap_bytes: int, rot_bytes: int, grid: str = "dense",
                 memo: Optional[dict] = None):
        self.rs = rs
        self.grid = GRIDS["quick" if quick else grid]
        #: measurements shared between packs of one process, keyed by (kernel, input shape, point):
        #: an op whose inputs have the same shape in another pack (e.g. attention of llama-3-8b and
        #: qwen3-8b, rms_norm as input_norm / post_attn_norm / final_norm) is timed once.
        self.memo = memo if memo is not None else {}
        self.reused = 0
        self.device = device
        self.dt = torch.bfloat16
        self.timer = timer
        self.sdpa = sdpa
        self.quick = quick
        self.kv_cap = kv_cap_bytes
        self.rot_bytes = rot_bytes
        self.rows: list[tuple] = []
        self.table: dict[tuple, Meas] = {}
        self.skipped: list[str] = []
        self.methods: dict[str, set] = {}
        self.gen = torch.Generator(device=device).manual_seed(0)
        #: attention: survey per kind, fastest backend per grid point, contested points
        self.surveys: dict[str, KindSurvey] = {}
        self.winners: dict[str, dict] = {}
        self.contested: dict[str, list] = {}
        self.backend_skips: list[str] = []
        self.survey_rep = 3 if quick else 5
        self.external_chooser: Optional[BackendChooser] = None
        self.prefill_max_rep: Optional[int] = None
        #: the kernels the token ops ran (set by run_token_ops; the pack YAML names them)
        self.gemm_backend: Optional[str] = None
        self.moe_backend: Optional[str] = None

    # --- helpers -------------------------------------------------------------------------
    def rnd(self, *shape, scale: float = 1.0):
        return torch.randn(*shape, generator=self.gen, device=self.device, dtype=self.dt) * scale

    def copies(self, nbytes_one: int) -> int:
        """How many copies of an op's cold inputs to rotate so that they do not sit in L2."""
        return max(1, min(8, math.ceil(self.rot_bytes / max(nbytes_one, 1))))

    def sig(self, op: str) -> tuple:
        """What an op's time depends on besides (tokens, batch, context): its kernel and the shapes
        of its inputs (weights included). Two ops with equal signatures run the same kernels on
        equally shaped random tensors, so one measurement serves both."""
        rs = self.rs
        wf = rs.weights
        return {
            "input_norm": ("rms_norm", rs.h), "post_attn_norm": ("rms_norm", rs.h),
            "final_norm": ("rms_norm", rs.h), "residual_add": ("add", rs.h),
            "qkv_proj": ("linear", wf, rs.qkv_out, rs.h), "o_proj": ("linear", wf, rs.h, rs.H * rs.D),
            "gate_up_proj": ("linear", wf, 2 * rs.I, rs.h), "down_proj": ("linear", wf, rs.h, rs.I),
            "moe_gate": ("moe_gate", rs.E, rs.K, rs.h),
            "moe_experts": ("moe_experts", rs.E, rs.K, rs.MI, rs.h),
            "moe_combine": ("moe_combine", rs.E, rs.K, rs.h),
            "lm_head": ("linear", rs.V, rs.h), "embed": ("embed", rs.V, rs.h),
            "rope": ("rope", rs.H, rs.KVH, rs.D, rs.max_len), "kv_write": ("kv_write", rs.KVH, rs.D),
            "act": ("act", rs.I),
            "attn_decode": ("attn_decode", rs.H, rs.KVH, rs.D),
            "attn_prefill": ("attn_prefill", rs.H, rs.KVH, rs.D),
        }.get(op, (op, rs.model, rs.tp))

    def seen(self, op: str, tokens=0, batch=0, context=0) -> bool:
        return (self.sig(op), tokens, batch, context) in self.memo

    def point(self, op: str, fns, tokens=0, batch=0, context=0, nbytes=0) -> Optional[Meas]:
        label = f"{op} tokens={tokens} batch={batch} ctx={context}"
        key = (self.sig(op), tokens, batch, context)
        if key in self.memo:  # same kernel on equally shaped inputs, timed earlier in this process
            m = self.memo[key]
            self.reused += 1
            self.rows.append((op, tokens, batch, context, nbytes, m.median_ms, m.std_ms))
            self.table[(op, tokens, batch, context)] = m
            self.methods.setdefault(op, set()).add(m.method)
            return m
        try:
            m = self.timer.measure(fns, label)
        except BudgetExceeded:
            raise
        except torch.cuda.OutOfMemoryError:
            self.skipped.append(f"{label}: out of memory")
            log(f"  SKIP {label}: out of memory")
            self._free()
            return None
        except Exception as exc:
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
            self.skipped.append(f"{label}: {why}")
            log(f"  SKIP {label}: {why}")
            return None
        if m is None:
            return None
        self.rows.append((op, tokens, batch, context, nbytes, m.median_ms, m.std_ms))
        self.table[(op, tokens, batch, context)] = m
        self.memo[key] = m
        self.methods.setdefault(op, set()).add(m.method)
        log(f"  {label}: {m.median_ms:.4f} ms ± {m.std_ms:.4f} (n={m.n}, {m.method})")
        return m

    # --- grids ---------------------------------------------------------------------------
    def token_grid(self):
        return self.grid["tokens"]

    def prefill_grid(self):
        chunks, ctxs = self.grid["chunks"], self.grid["prefill_ctx"]
        pts = [(t, c) for t in chunks for c in ctxs if t + c <= self.rs.max_len]
        if self.grid is GRIDS["long"]:  # only what the dense grid lacks, and each chunk's longest context
            dense = set(DENSE_PREFILL_CHUNKS), set(DENSE_PREFILL_CTX)
            edge = [(t, self.rs.max_len - t) for t in sorted(dense[0] | set(chunks))
                    if self.rs.max_len - t > max(DENSE_PREFILL_CTX)]
            pts = sorted(set(pts) | set(edge), key=lambda p: p[0] * (p[1] + p[0] / 2))
            pts = [(t, c) for t, c in pts if not (t in dense[0] and c in dense[1])]
        return sorted(pts, key=lambda p: p[0] * (p[1] + p[0] / 2))  # cheap first

    def decode_grid(self):
        batches = self.grid["decode_batch"]
        ctxs = [c for c in self.grid["decode_ctx"] if c + 1 <= self.rs.max_len]
        long_ok = self.grid is not GRIDS["long"] or self.rs.max_len - 1 > max(DENSE_DECODE_CTX)
        if not self.quick and long_ok and (self.rs.max_len - 1) not in ctxs:
            ctxs.append(self.rs.max_len - 1)  # the longest context the model allows
        per_tok = 2 * self.rs.KVH * self.rs.D * 2
        pts = [(b, c) for b in batches for c in ctxs if b * (c + 1) * per_tok <= self.kv_cap]
        return sorted(pts, key=lambda p: p[0] * p[1])

    # --- the measurements ---------------------------------------------------------------
    def run_token_ops(self) -> None:
        rs, r = self.rs, self.rnd
        h, H, KVH, D, I = rs.h, rs.H, rs.KVH, rs.D, rs.I
        w_norm = 1.0 + 0.1 * r(h)
        cos_sin = make_cos_sin(rs.max_len + 1, D, self.device, self.dt)

        def weights(out_f, in_f):
            n = self.copies(out_f * in_f * 2)
            return [rs.linear(r(out_f, in_f, scale=in_f ** -0.5)) for _ in range(n)]

        w_qkv = weights(rs.qkv_out, h)
        w_o = weights(h, H * D)
        moe = MoE(rs.moe_shape(), self.device, self.gen) if rs.moe else None
        self.moe_backend = moe.backend if moe is not None else None
        w_gu = [] if rs.moe else weights(2 * I, h)
        w_down = [] if rs.moe else weights(h, I)
        self.gemm_backend = (w_qkv[0].backend if not isinstance(w_qkv[0], torch.Tensor)
                             else "torch.nn.functional.linear (bf16, cuBLAS)")
        emb = r(rs.V, h, scale=0.02)
        w_lm = emb if rs.tied else r(rs.V, h, scale=h ** -0.5)
        log(f"  weight copies rotated: qkv {len(w_qkv)}, o {len(w_o)}, gate_up {len(w_gu)}, "
            f"down {len(w_down)}, lm_head 1")
        for T in self.token_grid():
            self.timer.budget.check()
            x = r(T, h)
            self.point("input_norm", [lambda: rms_norm_op(x, w_norm)], tokens=T)
            self.point("qkv_proj", [lambda w=w: linear_op(x, w) for w in w_qkv], tokens=T)
            qkv = r(T, rs.qkv_out)
            pos = torch.randint(0, rs.max_len, (T,), generator=self.gen, device=self.device)
            self.point("rope", [lambda: rope_op(qkv, pos, cos_sin, H, KVH, D)], tokens=T)
            qk = rope_op(qkv, pos, cos_sin, H, KVH, D)
            k_new = qk[:, H:]
            v_new = qkv[:, (H + KVH) * D:].view(T, KVH, D)
            n_kv = self.copies(2 * T * KVH * D * 2)
            caches = [(torch.empty(T, KVH, D, device=self.device, dtype=self.dt),
                       torch.empty(T, KVH, D, device=self.device, dtype=self.dt)) for _ in range(n_kv)]
            slots = torch.arange(T, device=self.device)
            self.point("kv_write", [lambda c=c: kv_write_op(c[0], c[1], k_new, v_new, slots)
                                    for c in caches], tokens=T)
            del caches, qk, qkv, k_new, v_new
            a = r(T, H * D)
            self.point("o_proj", [lambda w=w: linear_op(a, w) for w in w_o], tokens=T)
            del a
            self.point("post_attn_norm", [lambda: rms_norm_op(x, w_norm)], tokens=T)
            if moe is not None:
                self.moe_points(moe, x, T)
            else:
                self.point("gate_up_proj", [lambda w=w: linear_op(x, w) for w in w_gu], tokens=T)
                gu = r(T, 2 * I)
                self.point("act", [lambda: act_op(gu, I)], tokens=T)
                del gu
                m = r(T, I)
                self.point("down_proj", [lambda w=w: linear_op(m, w) for w in w_down], tokens=T)
                del m
            y = r(T, h)
            self.point("residual_add", [lambda: x + y], tokens=T)
            del y
            ids = torch.randint(0, rs.V, (T,), generator=self.gen, device=self.device)
            self.point("embed", [lambda: embed_op(ids, emb)], tokens=T)
            if T <= SAMPLED_MAX:
                self.point("final_norm", [lambda: rms_norm_op(x, w_norm)], tokens=T)
                self.point("lm_head", [lambda: linear_op(x, w_lm)], tokens=T)
            del x
        del w_qkv, w_o, w_gu, w_down, emb, w_lm, moe
        self._free()

    def moe_points(self, moe: "MoE", x, T: int) -> None:
        """moe_gate, moe_experts, moe_combine at T tokens, each on the previous op's real output
        (random router weights: near-uniform routing over the experts)."""
        bias = route_bias(T, self.rs.E, self.device, self.gen)
        self.point("moe_gate", [lambda: moe.gate(x, bias)], tokens=T)
        w, idx = moe.gate(x, bias)
        self.point("moe_experts", [lambda: moe.experts(x, idx)], tokens=T)
        y, order = moe.experts(x, idx)
        self.point("moe_combine", [lambda: moe.combine(y, order, w, T)], tokens=T)
        del w, idx, y, order, bias

    # --- attention: every passing backend considered, the fastest kept -----------------------
    def _attn_fits(self, kind: str, a: int, ctx: int) -> bool:
        if kind == "decode":
            per_tok = 2 * self.rs.KVH * self.rs.D * 2
            return ctx + 1 <= self.rs.max_len and a * (ctx + 1) * per_tok <= self.kv_cap
        return a + ctx <= self.rs.max_len

    def attn_inputs(self, kind: str, a: int, ctx: int) -> list:
        """The op's calls on rotated copies of its KV, laid out as the forward lays them out:
        decode = ``a`` sequences of ``ctx`` cached tokens + the new one; prefill = a chunk of ``a``
        tokens at the end of its ``ctx + a`` cache slots."""
        rs = self.rs
        H, KVH, D = rs.H, rs.KVH, rs.D
        if kind == "decode":
            B, L = a, ctx + 1
            q_rows = self.rnd(B, H + KVH, D)[:, :H]
            out = torch.empty(B, H, D, device=self.device, dtype=self.dt)
            n = self.copies(2 * B * L * KVH * D * 2)
            caches = [(self.rnd(B * L, KVH, D), self.rnd(B * L, KVH, D)) for _ in range(n)]
            return [lambda c=c: attn_decode_op(q_rows, c[0], c[1], out, B, L) for c in caches]
        T = a
        q_rows = self.rnd(T, H + KVH, D)[:, :H]
        out = torch.empty(T, H, D, device=self.device, dtype=self.dt)
        n = self.copies(2 * (ctx + T) * KVH * D * 2)
        caches = [(self.rnd(ctx + T, KVH, D), self.rnd(ctx + T, KVH, D)) for _ in range(n)]
        return [lambda c=c: attn_prefill_op(q_rows, c[0], c[1], out) for c in caches]

    def _time_backend(self, name: str, fns, kind: str, a: int, ctx: int, label: str,
                      max_rep: Optional[int] = None) -> Optional[Meas]:
        """One backend at one point; a backend that cannot serve the point is noted, not fatal."""
        if name == "math" and not math_fits(kind, self.rs.H, self.rs.KVH, self.rs.D, a, ctx):
            self.backend_skips.append(f"{label} math: skipped (materialized tensors over the cap)")
            return None
        try:
            with only(name):
                return self.timer.measure(fns, f"{label} [{name}]", max_rep=max_rep)
        except BudgetExceeded:
            raise
        except torch.cuda.OutOfMemoryError:
            self.backend_skips.append(f"{label} {name}: out of memory")
            self._free()
        except Exception as exc:
            self.backend_skips.append(f"{label} {name}: {type(exc).__name__}: "
                                      f"{str(exc).splitlines()[0][:120] if str(exc) else ''}")
        return None

    def ensure_survey(self, kind: str) -> KindSurvey:
        """Time every passing backend on the kind's survey lattice (shared with packs of the same
        attention shape in this process)."""
        if kind in self.surveys:
            return self.surveys[kind]
        op = "attn_decode" if kind == "decode" else "attn_prefill"
        key = ("survey", self.sig(op), kind, tuple(self.sdpa.passing[kind]))
        if key not in self.memo:
            lat = (QUICK_SURVEY if self.quick else SURVEY)[kind]
            pts = [(a, c) for a in lat["a"] for c in lat["ctx"] if self._attn_fits(kind, a, c)]
            ms: dict[str, list] = {b: [] for b in self.sdpa.passing[kind]}
            t0 = time.time()
            for a, c in pts:
                self.timer.budget.check()
                label = f"survey {kind} a={a} ctx={c}"
                try:
                    fns = self.attn_inputs(kind, a, c)
                except torch.cuda.OutOfMemoryError:
                    self._free()
                    for b in ms:
                        ms[b].append(None)
                    continue
                for b in ms:
                    m = self._time_backend(b, fns, kind, a, c, label, max_rep=self.survey_rep)
                    ms[b].append(None if m is None else m.median_ms)
                del fns
                self._free()
                log(f"  {label}: " + ", ".join(f"{b} {'-' if v[-1] is None else f'{v[-1]:.4f}'}"
                                               for b, v in ms.items()))
            self.memo[key] = KindSurvey(kind, pts, ms)
            log(f"  survey {kind}: {len(pts)} points x {len(ms)} backends in {time.time() - t0:.0f}s; "
                f"{self.memo[key].to_meta()['rule']}; fastest at {self.memo[key].winners_at_survey()}")
        self.surveys[kind] = self.memo[key]
        return self.surveys[kind]

    def attn_point(self, op: str, a: int, ctx: int, max_rep: Optional[int] = None) -> Optional[Meas]:
        """One grid point: the contenders timed, the fastest kept (row, winner, contest)."""
        kind = kind_of(op, ctx)
        tokens, batch = (a, a) if op == "attn_decode" else (a, 0)
        key = (self.sig(op), tokens, batch, ctx)
        label = f"{op} tokens={tokens} batch={batch} ctx={ctx}"
        if key in self.memo:
            m = self.memo[key]
            winner, times = self.memo[("winner",) + key]
            self.reused += 1
        else:
            sv = self.ensure_survey(kind)
            try:
                fns = self.attn_inputs(kind, a, ctx)
            except torch.cuda.OutOfMemoryError:
                self.skipped.append(f"{label}: out of memory")
                self._free()
                return None
            meas: dict[str, Meas] = {}
            tried = sv.contenders(a, ctx)
            for names in (tried, [b for b in self.sdpa.passing[kind] if b not in tried]):
                for b in names:
                    got = self._time_backend(b, fns, kind, a, ctx, label, max_rep=max_rep)
                    if got is not None:
                        meas[b] = got
                if meas:
                    break
            del fns
            self._free()
            if not meas:
                self.skipped.append(f"{label}: no backend gave a time")
                log(f"  SKIP {label}: no backend gave a time")
                return None
            winner = min(meas, key=lambda b: meas[b].median_ms)
            m = meas[winner]
            times = {b: round(x.median_ms, 6) for b, x in meas.items()}
            self.memo[key] = m
            self.memo[("winner",) + key] = (winner, times)
            log(f"  {label}: {m.median_ms:.4f} ms ± {m.std_ms:.4f} ({winner}"
                + (f"; {times}" if len(times) > 1 else "") + ")")
        self.rows.append((op, tokens, batch, ctx, 0, m.median_ms, m.std_ms))
        self.table[(op, tokens, batch, ctx)] = m
        self.methods.setdefault(op, set()).add(m.method)
        self.winners.setdefault(kind, {})[(a, ctx)] = winner
        if len(times) > 1:
            self.contested.setdefault(kind, []).append([a, ctx, winner, times])
        return m

    def run_decode(self) -> None:
        self.ensure_survey("decode")
        for B, ctx in self.decode_grid():
            self.timer.budget.check()
            self.attn_point("attn_decode", B, ctx)

    def run_prefill(self) -> None:
        for kind in ("prefill_causal", "prefill_context"):
            self.ensure_survey(kind)
        for T, ctx in self.prefill_grid():
            self.timer.budget.check()
            self.attn_point("attn_prefill", T, ctx, max_rep=self.prefill_max_rep)

    def chooser(self) -> BackendChooser:
        """The backend of any attention call, as measured here (winners of the grid points), else
        as given (``external_chooser``: the tables' pack), else the first passing backend."""
        if self.external_chooser is not None and not self.winners:
            return self.external_chooser
        first = {k: v[0] for k, v in self.sdpa.passing.items() if v}
        return BackendChooser.from_winners(self.winners, first)

    def _free(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # --- prediction from the tables (for the overhead rows) --------------------------------
    def predict_decode_forward(self, B: int, ctx: int) -> Optional[float]:
        """Sum of op times the tables give for a decode-only forward (batch B, context ctx)."""
        def t(op, tokens=0, batch=0, context=0):
            m = self.table.get((op, tokens, batch, context))
            return None if m is None else m.median_ms
        per_layer = [t(op, B) for op in layer_ops(self.rs) + ("residual_add",)]
        per_layer.append(t("attn_decode", B, B, ctx))
        once = [t("embed", B), t("final_norm", B), t("lm_head", B)]
        if any(p is None for p in per_layer + once):
            return None
        return self.rs.L * sum(per_layer) + sum(once)


def route_bias(T: int, E: int, device, gen) -> torch.Tensor:
    """Per-token random router-logit offsets (std 4 against the logits' ~1): routing uniform at
    random per token, in the op tables and in the forwards alike (variants.MoE.gate says why)."""
    return torch.randn(T, E, generator=gen, device=device, dtype=torch.bfloat16) * 4.0


def layer_ops(rs: RankShape) -> tuple:
    """The per-layer token ops of a forward, in order (PACK_FORMAT.md; MoE packs replace the MLP's
    three ops by the experts' three)."""
    mlp = ("moe_gate", "moe_experts", "moe_combine") if rs.moe else ("gate_up_proj", "act", "down_proj")
    return ("input_norm", "qkv_proj", "rope", "kv_write", "o_proj", "post_attn_norm") + mlp + ("residual_add",)


# ============================================================================== whole forwards
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


class Model:
    """A random-weight decoder with the rank shape's sizes (bf16, no downloads).

    Every layer has its own weights when memory allows (so no layer reads another's weights from
    L2); otherwise all layers share one set, which is said in the metadata.
    """

    def __init__(self, rs: RankShape, device, share_layers: Optional[bool] = None, seed: int = 0):
        self.rs = rs
        self.device = device
        dt = torch.bfloat16
        g = torch.Generator(device=device).manual_seed(seed)

        def r(*shape, scale=1.0):
            return torch.randn(*shape, generator=g, device=device, dtype=dt) * scale
        h, I = rs.h, rs.I
        mlp_params = 3 * rs.E * rs.MI * h + rs.E * h if rs.moe else 3 * I * h
        layer_bytes = 2 * (rs.qkv_out * h + h * rs.H * rs.D + mlp_params + 2 * h)
        if share_layers is None:
            share_layers = False
            if device.type == "cuda":
                free, _total = torch.cuda.mem_get_info(device)
                share_layers = layer_bytes * rs.L > 0.6 * free
        self.shared_layers = share_layers
        n_sets = 1 if share_layers else rs.L
        sets = []
        for _ in range(n_sets):
            lw = dict(in_norm=1.0 + 0.1 * r(h), qkv=rs.linear(r(rs.qkv_out, h, scale=h ** -0.5)),
                      o=rs.linear(r(h, rs.H * rs.D, scale=(rs.H * rs.D) ** -0.5)),
                      post_norm=1.0 + 0.1 * r(h))
            if rs.moe:
                lw["moe"] = MoE(rs.moe_shape(), device, g)
            else:
                lw.update(gu=rs.linear(r(2 * I, h, scale=h ** -0.5)), down=rs.linear(r(h, I, scale=I ** -0.5)))
            sets.append(lw)
        self.layers = [sets[i % n_sets] for i in range(rs.L)]
        self.embed = r(rs.V, h, scale=0.02)
        self.lm_head = self.embed if rs.tied else r(rs.V, h, scale=h ** -0.5)
        self.final_norm = 1.0 + 0.1 * r(h)
        self.cos_sin = make_cos_sin(rs.max_len + 2, rs.D, device, dt)


class Batch:
    """Static inputs of one composition: token ids, positions, KV slots, one layer's KV cache.

    The KV cache is flat [slots, KVH, D], sequence-major: each prefilling sequence owns
    prefill_ctx + prefill_len consecutive slots (new tokens last), each decode sequence
    decode_ctx + 1. The same buffers serve every layer: the timing is the same and memory is
    1 / num_layers of a real cache.
    """

    def __init__(self, comp: Composition, rs: RankShape, device, seed: int = 1,
                 chooser: Optional[BackendChooser] = None):
        self.comp = comp
        #: the SDPA backend of each attention call (None: whatever is enabled), chosen as the op
        #: tables chose it for the same kind and point
        c0 = comp
        self.prefill_backend = None if chooser is None or not c0.n_prefill else chooser.pick(
            "prefill_context" if c0.prefill_ctx > 0 else "prefill_causal", c0.prefill_len, c0.prefill_ctx)
        self.decode_backend = None if chooser is None or not c0.n_decode else chooser.pick(
            "decode", c0.n_decode, c0.decode_ctx)
        g = torch.Generator(device=device).manual_seed(seed)
        c = comp
        T = c.tokens
        self.T = T
        pos, slots, sample, self.prefills = [], [], [], []
        base = 0
        for i in range(c.n_prefill):
            ts = i * c.prefill_len
            pos.append(torch.arange(c.prefill_ctx, c.prefill_ctx + c.prefill_len))
            slots.append(base + c.prefill_ctx + torch.arange(c.prefill_len))
            sample.append(ts + c.prefill_len - 1)
            self.prefills.append((ts, ts + c.prefill_len, base, c.prefill_ctx + c.prefill_len))
            base += c.prefill_ctx + c.prefill_len
        self.dec_tok = c.n_prefill * c.prefill_len
        self.dec_base = base
        self.dec_len = c.decode_ctx + 1
        if c.n_decode:
            pos.append(torch.full((c.n_decode,), c.decode_ctx))
            slots.append(base + torch.arange(c.n_decode) * self.dec_len + c.decode_ctx)
            sample.extend(range(self.dec_tok, self.dec_tok + c.n_decode))
        self.positions = torch.cat(pos).to(device)
        self.slots = torch.cat(slots).to(device)
        self.sample_idx = torch.tensor(sample, dtype=torch.long, device=device)
        self.ids = torch.randint(0, rs.V, (T,), generator=g, device=device)
        S = c.kv_slots
        self.route_bias = route_bias(T, rs.E, device, g) if rs.moe else None
        self.k_cache = torch.randn(S, rs.KVH, rs.D, generator=g, device=device, dtype=torch.bfloat16)
        self.v_cache = torch.randn(S, rs.KVH, rs.D, generator=g, device=device, dtype=torch.bfloat16)


def forward(m: Model, b: Batch, all_reduce: Optional[Callable] = None):
    """embedding -> layers (norm, qkv, rope, kv_write, attention, o_proj, add, norm, gate_up, act,
    down, add) -> final norm and lm_head on one row per sequence. Returns the logits.

    Under TP (``all_reduce`` given, one process per rank) the o_proj and down_proj outputs are
    all-reduced in place before the residual add -- the two collectives per layer of the pack
    model; embedding and lm_head stay on the rank's vocab slice, as in the op tables."""
    rs = m.rs
    H, KVH, D, T = rs.H, rs.KVH, rs.D, b.T
    residual = embed_op(b.ids, m.embed)
    n_dec = b.comp.n_decode
    with BackendSwitch() as sw:  # each attention call on the backend the tables chose for it
        for lw in m.layers:
            hn = rms_norm_op(residual, lw["in_norm"])
            qkv = linear_op(hn, lw["qkv"])
            qk = rope_op(qkv, b.positions, m.cos_sin, H, KVH, D)
            kv_write_op(b.k_cache, b.v_cache, qk[:, H:], qkv[:, (H + KVH) * D:].view(T, KVH, D), b.slots)
            q = qk[:, :H]
            attn = torch.empty((T, H, D), device=qkv.device, dtype=qkv.dtype)
            for ts, te, ks, kl in b.prefills:
                sw.use(b.prefill_backend)
                attn_prefill_op(q[ts:te], b.k_cache[ks:ks + kl], b.v_cache[ks:ks + kl], attn[ts:te])
            if n_dec:
                s, e = b.dec_base, b.dec_base + n_dec * b.dec_len
                sw.use(b.decode_backend)
                attn_decode_op(q[b.dec_tok:], b.k_cache[s:e], b.v_cache[s:e], attn[b.dec_tok:],
                               n_dec, b.dec_len)
            o = linear_op(attn.view(T, H * D), lw["o"])
            if all_reduce is not None:
                all_reduce(o)
            residual = residual + o
            hn = rms_norm_op(residual, lw["post_norm"])
            if rs.moe:
                d = lw["moe"](hn, b.route_bias)
            else:
                d = linear_op(act_op(linear_op(hn, lw["gu"]), rs.I), lw["down"])
            if all_reduce is not None:
                all_reduce(d)
            residual = residual + d
    rows = residual.index_select(0, b.sample_idx)
    return linear_op(rms_norm_op(rows, m.final_norm), m.lm_head)


def validation_compositions(model: str, quick: bool) -> list[Composition]:
    """Batches for whole-iteration validation, chosen apart from the op grid (off-grid sizes such
    as 300 tokens, context 1500, batch 48) and apart from the overhead calibration batches."""
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


# ============================================================================== environment
def device_info(device) -> dict:
    info = dict(torch=torch.__version__, python=platform.python_version(), host=socket.gethostname())
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(gpu_name=p.name, gpu_mem_mib=int(p.total_memory // 2 ** 20),
                    sms=p.multi_processor_count, l2_bytes=int(getattr(p, "L2_cache_size", 0)),
                    cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
                    gpus_visible=torch.cuda.device_count())
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.mem,"
                                "power.limit,temperature.gpu", "--format=csv,noheader", "-i", "0"],
                               capture_output=True, text=True, timeout=20)
            f = [x.strip() for x in q.stdout.strip().splitlines()[0].split(",")]
            info.update(driver=f[0], sm_clock_at_start=f[1], mem_clock=f[2], power_limit=f[3],
                        temperature_c=f[4])
        except Exception as exc:
            info["driver"] = f"unknown ({type(exc).__name__})"
    else:
        info.update(gpu_name=f"CPU {platform.processor() or platform.machine()}", cuda=None)
    return info


def gpu_key(info: dict, override: Optional[str]) -> str:
    """Folder name under packs/ and validation/: a servesim.hardware.GPUS key where one fits."""
    if override:
        return override
    n = str(info.get("gpu_name", "")).lower()
    if info.get("cuda") is None:
        return "cpu"
    if "h200" in n:
        return "h200"
    if "h100" in n and ("80" in n or n.strip() == "nvidia h100"):
        return "h100-80g"
    if "a100" in n and "80" in n:
        return "a100-80g"
    return "".join(ch if ch.isalnum() else "-" for ch in n).strip("-") or "gpu"


def device_string(info: dict) -> str:
    if info.get("cuda") is None:
        return f"{info['gpu_name']}, torch {info['torch']}"
    return (f"{info['gpu_name']} {info['gpu_mem_mib']} MiB, driver {info.get('driver')}, "
            f"CUDA {info['cuda']}, cuDNN {info.get('cudnn')}, torch {info['torch']}")


def this_command() -> str:
    return "python " + " ".join(shlex.quote(a) for a in sys.argv)


# ============================================================================== writing
COLUMNS = ("op", "tokens", "batch", "context", "bytes", "time_ms", "std_ms")
VAL_COLUMNS = ("model", "tp", "cuda_graph", "n_prefill", "prefill_len", "prefill_ctx", "n_decode",
               "decode_ctx", "measured_ms", "std_ms")


def _check_time(t: float, what: str) -> None:
    if not (isinstance(t, float) and math.isfinite(t) and t > 0):
        raise ValueError(f"refusing to write non-positive or non-finite time {t!r} for {what}")


def write_rows(path: Path, rows: list[tuple]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(COLUMNS)
        for op, tokens, batch, context, nbytes, t, std in rows:
            _check_time(float(t), f"{op} {tokens} {batch} {context} {nbytes}")
            std_txt = "" if std is None or not math.isfinite(std) else f"{max(std, 0.0):.6g}"
            w.writerow([op, int(tokens), int(batch), int(context), int(nbytes), f"{float(t):.6g}", std_txt])


def read_rows(path: Path) -> list[tuple]:
    out = []
    with Path(path).open(newline="") as fh:
        for row in csv.DictReader(fh):
            std = float(row["std_ms"]) if row["std_ms"].strip() else float("nan")
            out.append((row["op"], int(row["tokens"]), int(row["batch"]), int(row["context"]),
                        int(row["bytes"]), float(row["time_ms"]), std))
    return out


def _yaml_scalar(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(str(v))  # a JSON string is a valid YAML double-quoted scalar


def _yaml_lines(d: dict, indent: int = 0) -> list[str]:
    """Block-style YAML for nested dicts/lists of scalars (used only where PyYAML is missing)."""
    pad = " " * indent
    lines = []
    for k, v in d.items():
        if isinstance(v, dict):
            if not v:
                lines.append(f"{pad}{k}: {{}}")
            elif all(not isinstance(x, (dict, list)) for x in v.values()) and len(v) <= 8:
                inner = ", ".join(f"{kk}: {_yaml_scalar(x)}" for kk, x in v.items())
                lines.append(f"{pad}{k}: {{{inner}}}")
            else:
                lines.append(f"{pad}{k}:")
                lines.extend(_yaml_lines(v, indent + 2))
        elif isinstance(v, list):
            if not v:
                lines.append(f"{pad}{k}: []")
            else:
                lines.append(f"{pad}{k}:")
                for x in v:
                    if isinstance(x, dict):
                        sub = _yaml_lines(x, indent + 4)
                        sub[0] = f"{pad}  - " + sub[0].lstrip()
                        lines.extend(sub)
                    else:
                        lines.append(f"{pad}  - {_yaml_scalar(x)}")
        else:
            lines.append(f"{pad}{k}: {_yaml_scalar(v)}")
    return lines


def _plain(x):
    """Plain Python types only (no numpy scalars, tuples or sets) so the YAML stays safe."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set)):
        return [_plain(v) for v in (sorted(x) if isinstance(x, set) else x)]
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    if isinstance(x, str) and type(x) is not str:  # e.g. torch.__version__ (TorchVersion)
        return str(x)
    return x


def write_yaml(path: Path, meta: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if yaml is not None:
        text = yaml.safe_dump(_plain(meta), sort_keys=False, width=100, default_flow_style=None)
    else:
        text = "\n".join(_yaml_lines(_plain(meta))) + "\n"
    path.write_text(text)


def read_yaml(path: Path) -> dict:
    if yaml is None:
        raise SystemExit("merge needs PyYAML to read metadata")
    return yaml.safe_load(Path(path).read_text())


def base_meta(gpu: str, model: str, tp: int, info: dict, rs: RankShape) -> dict:
    s = ALL_SHAPES[model]
    extra = {}
    if rs.weights != "bf16":
        extra.update(quantization=rs.weights, kv_cache_dtype="auto")
    if rs.moe:
        extra.update(routing="uniform at random per token (router logits + a per-token random offset, "
                             "std 4, in the op tables and the forwards: every expert about equally loaded; "
                             "real routers are skewed)")
    return dict(gpu=gpu, model=model, tp=tp, dtype=FORMAT_DTYPE[rs.weights], **extra,
                shape={k: s[k] for k in SHAPE_KEYS + (MOE_KEYS if rs.moe else ())},
                source="measured",
                origin=f"calibration/profile_gpu.py on {info.get('gpu_name')}",
                date=datetime.date.today().isoformat(),
                device=device_string(info),
                rank_shape=rs.as_dict(),
                environment=info)


# ============================================================================== setup
def setup(args) -> tuple[torch.device, Budget, dict]:
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device visible; use --device cpu for a logic test")
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    now = time.time()
    hard = args.deadline_epoch or (now + args.time_budget_s if args.time_budget_s else None)
    soft = args.soft_deadline_epoch or (now + 0.8 * args.time_budget_s if args.time_budget_s else None)
    return device, Budget(soft=soft, hard=hard), device_info(device)


def method_text(timer: Timer, extra: str = "") -> str:
    if timer.cuda:
        m = (f"CUDA events; {timer.warmup} warm-up calls; op captured R times back to back in a CUDA "
             f"graph (R so that one replay >= {timer.target_graph_ms} ms, at most {timer.max_r}), "
             f"time = replay / R; median of {timer.min_rep}-{timer.max_rep} replays (fewer for long "
             f"ops), std over them; weights and KV caches rotated among copies totalling >= 4x L2; "
             f"bf16 random weights")
    else:
        m = (f"wall clock on CPU (logic test only); {timer.warmup} warm-up calls; median of "
             f"{timer.min_rep}-{timer.max_rep} repeats; bf16 random weights")
    return m + extra


# ============================================================================== device peaks
def measure_peaks(device, timer: Timer, quick: bool = False) -> dict:
    """The two ceilings packs are compared with (achieved HBM bandwidth, achieved TFLOP/s): a
    device-to-device copy (bytes read + written / time) and a square bf16 GEMM on random data,
    timed like every op (graph replay, median). Datasheet peaks are leads; these are measured."""
    out: dict = {}
    if device.type != "cuda":
        return {"note": "not measured on CPU"}
    try:
        n = (64 << 20) if quick else (1 << 30)  # bytes per buffer: far beyond L2
        x = torch.randn(n // 2, device=device, dtype=torch.bfloat16)
        y = torch.empty_like(x)
        m = timer.measure([lambda: y.copy_(x)], "peak copy")
        if m is not None:
            out["copy_bytes_per_s"] = round(2 * n / (m.median_ms * 1e-3), -6)
            out["copy_ms"] = round(m.median_ms, 5)
        del x, y
        k = 2048 if quick else 8192
        a = torch.randn(k, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(k, k, device=device, dtype=torch.bfloat16)
        m = timer.measure([lambda: torch.mm(a, b)], "peak gemm")
        if m is not None:
            out["bf16_gemm_flops_per_s"] = round(2 * k ** 3 / (m.median_ms * 1e-3), -9)
            out["gemm_ms"] = round(m.median_ms, 5)
        del a, b
        torch.cuda.empty_cache()
        out["method"] = (f"copy_ of {n >> 20} MiB bf16 (2x bytes counted); {k}^3 bf16 torch.mm on "
                         f"random data; CUDA-graph replay, median")
    except Exception as exc:  # informative only
        out["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
    log(f"device peaks: {out}")
    return out


# ============================================================================== mode: ops
OPS_STAGES = ["token ops", "attn_decode", "overhead", "attn_prefill"]


def _csv_list(text, conv=str) -> list:
    return [conv(x) for x in str(text).split(",") if x.strip()]


def cmd_ops(args) -> int:
    """Op tables for every (model, TP) of ``--model`` x ``--tp`` (comma lists), in one process, so
    that equally shaped ops are timed once (``OpBench.sig``) and torch starts once."""
    device, budget, info = setup(args)
    models, tps = _csv_list(args.model), _csv_list(args.tp, int)
    for m in models:
        if m not in ALL_SHAPES:
            raise SystemExit(f"unknown model {m}; known: {', '.join(ALL_SHAPES)}")
    stages = _csv_list(args.stages) if args.stages else list(OPS_STAGES)
    bad = [x for x in stages if x not in OPS_STAGES]
    if bad:
        raise SystemExit(f"unknown stage(s) {bad}; known: {OPS_STAGES}")
    if args.skip_overhead and "overhead" in stages:
        stages.remove("overhead")
    memo: dict = {}
    t_all = time.time()
    for m in models:
        for tp in tps:
            ops_one(args, device, budget, info, m, tp, stages, memo)
    log(f"ops: {len(models) * len(tps)} pack(s) in {time.time() - t_all:.0f}s, "
        f"{len(memo)} distinct measurements")
    return 0


def ops_one(args, device, budget, info, model: str, tp: int, stages: list, memo: dict) -> None:
    gpu = gpu_key(info, args.gpu_key)
    rs = RankShape.of(model, tp, args.weights)
    out = Path(args.out)
    grid = "quick" if args.quick else args.grid
    log(f"ops: model={model} tp={tp} grid={grid} stages={stages} rank shape={rs.as_dict()} on "
        f"{device_string(info)}")
    timer = Timer(device, budget, quick=args.quick,
                  max_rep=args.max_rep or (10 if grid == "dense" else 20))
    sdpa = Sdpa(device)
    sdpa.check(rs.H, rs.KVH, rs.D, args.sdpa)
    sdpa.record_kernels(rs.H, rs.KVH, rs.D)
    log(f"SDPA ({sdpa.mode}): passing {sdpa.passing}; checks {sdpa.checks}; kernels {sdpa.kernels}")
    if ("peaks",) not in memo:
        memo[("peaks",)] = measure_peaks(device, timer, args.quick)
    l2 = int(info.get("l2_bytes") or 0) or 50 * 2 ** 20
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        kv_cap = int(min((48 if args.grid == "long" else 16) * 2 ** 30, 0.25 * free))
    else:
        kv_cap = 64 * 2 ** 20
    bench = OpBench(rs, device, timer, sdpa, args.quick, kv_cap_bytes=kv_cap, rot_bytes=4 * l2,
                    grid=args.grid, memo=memo)
    bench.prefill_max_rep = getattr(args, "prefill_max_rep", None)
    stem = rs.stem
    attention_from = None
    if args.attention_from:  # attention does not depend on the weights' format: reuse a bf16 pack's
        attention_from = Path(args.attention_from) / f"{pack_stem(model, tp)}.csv"
        src_meta = read_yaml(attention_from.with_suffix(".yaml"))
        for r in read_rows(attention_from):
            if r[0] in ("attn_prefill", "attn_decode"):
                m = Meas(float(r[5]), float(r[6] or 0), 0, "from pack")
                bench.table[(r[0], int(r[1]), int(r[2]), int(r[3]))] = m
                bench.rows.append((r[0], int(r[1]), int(r[2]), int(r[3]), int(r[4]), m.median_ms, m.std_ms))
        bench.external_chooser = BackendChooser.from_meta(src_meta)
        stages = [x for x in stages if x not in ("attn_decode", "attn_prefill")]
    tables_from = None
    if args.tables_from:  # overhead-only runs: the op sums come from a pack measured earlier
        tables_from = Path(args.tables_from) / f"{stem}.csv"
        for r in read_rows(tables_from):
            bench.table[(r[0], int(r[1]), int(r[2]), int(r[3]))] = Meas(float(r[5]), float(r[6] or 0), 0,
                                                                         "from pack")
        ymeta = tables_from.with_suffix(".yaml")
        if ymeta.is_file():  # the calibration forwards run the attention backends the tables chose
            bench.external_chooser = BackendChooser.from_meta(read_yaml(ymeta))
    done, skipped_stages = [], [f"{x} (not asked for)" for x in OPS_STAGES if x not in stages]
    overhead_notes: dict = {}
    t0 = time.time()
    with torch.inference_mode():
        for name in [x for x in OPS_STAGES if x in stages]:
            fn = {"token ops": bench.run_token_ops, "attn_decode": bench.run_decode,
                  "attn_prefill": bench.run_prefill,
                  "overhead": lambda: overhead_rows(bench, timer, device, args, overhead_notes)}[name]
            log(f"[{model} tp{tp}] stage {name} (t={time.time() - t0:.0f}s)")
            try:
                fn()
                done.append(name)
            except BudgetExceeded:
                skipped_stages.append(f"{name} (time budget ran out partway)")
                log(f"  time budget ran out in stage {name}; writing what was measured")
                break
    for name in stages:
        if name not in done and not any(x.startswith(name) for x in skipped_stages):
            skipped_stages.append(f"{name} (not reached: time budget)")
    csv_path = out / "packs" / gpu / f"{stem}.csv"
    rows = sorted(bench.rows, key=lambda r: (r[0], r[2], r[1], r[3], r[4]))
    if rows:
        write_rows(csv_path, rows)
    meta = base_meta(gpu, model, tp, info, rs)
    chooser = bench.chooser()
    backend = f"{sdpa.mode}: {chooser.summary()}"
    meta.update(
        method=method_text(timer, f"; SDPA {backend}"),
        command=args.parent_command or this_command(),
        grid=grid_text(grid),
        notes=ops_notes(rs, backend, overhead_notes),
        sdpa_backend=backend,
        sdpa=dict(mode=sdpa.mode, checks_rel_err=sdpa.checks, passing=sdpa.passing,
                  kernels=sdpa.kernels,
                  survey={k: v.to_meta() for k, v in bench.surveys.items()},
                  choice=chooser.to_meta(),
                  contested={k: v for k, v in bench.contested.items()},
                  backend_skips=bench.backend_skips[:200],
                  how=("every backend that passes the float64 check is timed on a survey lattice "
                       "per op kind; a backend within 5% of the fastest at every survey point is "
                       "the kind's backend, else each grid point times the backends within 10% of "
                       "the fastest at its 4 nearest survey points and keeps the fastest "
                       "(calibration/attn_backends.py)")),
        device_peaks=memo.get(("peaks",)),
        timing_methods={k: sorted(v) for k, v in bench.methods.items()},
        rows=len(rows), seconds=round(time.time() - t0, 1),
        shared_measurements=(f"{bench.reused} of {len(rows)} rows reuse a measurement of an op "
                             f"with the same kernel and input shapes taken earlier in this process"),
        stages_done=done, stages_skipped=skipped_stages,
        points_skipped=bench.skipped, points_dropped=timer.dropped,
        graph_capture_failures=timer.capture_failures,
        overhead=overhead_notes,
        collectives=("not merged: all_reduce needs a multi-GPU run (`allreduce`, then `merge`)"
                     if tp > 1 else "send_recv not merged (no multi-GPU run)"),
    )
    if tables_from is not None:
        meta["tables_from"] = str(tables_from)
    if rs.weights != "bf16" or rs.moe:
        meta["gemm_backend"] = bench.gemm_backend or "see tables_from"
    if rs.moe:
        meta["moe_backend"] = bench.moe_backend or "see tables_from"
    if attention_from is not None:
        meta["attention_from"] = (f"{attention_from}: attn_prefill / attn_decode rows and their SDPA "
                                  f"choice copied from the bf16 pack (measured {src_meta.get('date')} on "
                                  f"{src_meta.get('device')}); attention reads bf16 Q/K/V whatever the "
                                  f"weights' format")
        for k in ("sdpa_backend", "sdpa"):
            if k in src_meta:
                meta[k] = src_meta[k]
    if rows or overhead_notes.get("points"):  # an overhead run's points matter even if none is > 0
        write_yaml(csv_path.with_suffix(".yaml"), meta)
    log(f"wrote {csv_path} ({len(rows)} rows, {bench.reused} reused) in {time.time() - t0:.0f}s; "
        f"skipped {len(bench.skipped)} points, dropped {len(timer.dropped)}")
    if args.collectives and rows:
        merge_collectives_into(csv_path, [Path(args.collectives)])
    del bench
    if device.type == "cuda":
        torch.cuda.empty_cache()


def grid_text(grid: str) -> dict:
    g = GRIDS[grid]

    def span(v):
        return f"{len(v)} points {v[0]}..{v[-1]}: {v}"
    return dict(name=grid, tokens=span(g["tokens"]), decode_batch=span(g["decode_batch"]),
                decode_context=span(g["decode_ctx"]) + " (+ max_model_len - 1)",
                prefill_chunk=span(g["chunks"]), prefill_context=span(g["prefill_ctx"]))


def ops_notes(rs: RankShape, backend: str, ov: dict) -> str:
    parts = [
        f"Per-rank slice for tp={rs.tp}: heads {rs.H}, kv_heads {rs.KVH}, intermediate {rs.I}, "
        f"vocab {rs.V} (lm_head/embed). Eager PyTorch ops, unfused: rms_norm = F.rms_norm; rope = "
        f"neox rotary in 5 kernels (gather + 2 mul + 2 addcmul); kv_write = 2 index_copy_ into a "
        f"flat [slots, kv_heads, head_dim] cache at contiguous slots; act = silu * up (2 kernels); "
        f"attention = torch SDPA ({backend}) with enable_gqa on a sequence-major cache, output "
        f"copied into the attention buffer; attn_prefill with context uses bottom-right causal "
        f"alignment. embed under TP is a plain lookup in the rank's vocab slice (no masking).",
        "Op times exclude CPU launch cost (graph replay); it is in overhead_eager / "
        "overhead_cuda_graph.",
        f"lm_head and final_norm are keyed by sampled rows, measured up to {SAMPLED_MAX}.",
        "Qwen3's per-head q/k RMSNorm is not modelled (not in the pack op list).",
    ]
    if ov.get("note"):
        parts.append(ov["note"])
    return " ".join(parts)


def overhead_rows(bench: OpBench, timer: Timer, device, args, notes: dict) -> None:
    """overhead_eager / overhead_cuda_graph: a decode-only calibration forward's wall time minus
    the sum of its ops as the tables just measured predict. Non-positive differences are dropped
    and listed (never written)."""
    rs = bench.rs
    batches = QUICK_CALIB_BATCHES if args.quick else CALIB_BATCHES
    if getattr(args, "calib_batches", None):
        batches = _csv_list(args.calib_batches, int)
    model = Model(rs, device)
    notes.update(calibration_batches=batches, calibration_context=CALIB_CTX,
                 shared_layer_weights=model.shared_layers, points={}, dropped=[])
    notes["note"] = (f"Overheads from decode-only forwards (batch {batches}, context {CALIB_CTX}, one "
                     f"per-rank forward on one GPU) minus the table sum"
                     + ("; under TP that forward has no all-reduce, so NCCL launch cost is not in "
                        "the overhead" if rs.tp > 1 else "") + ".")
    modes = [("overhead_eager", False)] + ([("overhead_cuda_graph", True)] if timer.cuda else [])
    chooser = bench.chooser()
    notes["sdpa"] = chooser.summary()
    for B in batches:
        timer.budget.check()
        pred = bench.predict_decode_forward(B, CALIB_CTX)
        if pred is None:
            notes["dropped"].append(f"batch {B}: an op of the table is missing")
            continue
        batch = Batch(Composition(0, 0, 0, B, CALIB_CTX), rs, device, chooser=chooser)
        for op, graph in modes:
            try:
                m = timer.measure_forward(lambda: forward(model, batch), graph, f"{op} batch={B}")
            except BudgetExceeded:
                raise
            except Exception as exc:
                notes["dropped"].append(f"{op} batch {B}: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            if m is None:
                notes["dropped"].append(f"{op} batch {B}: no valid measurement")
                continue
            diff = m.median_ms - pred
            notes["points"][f"{op} batch={B}"] = dict(forward_ms=round(m.median_ms, 5),
                                                       forward_std_ms=round(m.std_ms, 5),
                                                       table_sum_ms=round(pred, 5),
                                                       diff_ms=round(diff, 5))
            log(f"  {op} batch={B}: forward {m.median_ms:.4f} ms, tables {pred:.4f} ms, "
                f"diff {diff:.4f} ms")
            if not (math.isfinite(diff) and diff > 0):
                notes["dropped"].append(f"{op} batch {B}: forward - tables = {diff:.5f} ms <= 0, "
                                        f"not written")
                continue
            bench.rows.append((op, B, B, 0, 0, diff, m.std_ms))
            bench.methods.setdefault(op, set()).add(m.method)
        del batch
    del model
    bench._free()


# ============================================================================== mode: survey
def cmd_survey(args) -> int:
    """Op surveys beyond the packs (calibration/surveys.py): GEMMs in every weight format, MoE
    layers, decode attention over bf16/fp8 KV to 128K, MLA decode. One CSV + YAML per survey."""
    from surveys import SURVEY_COLUMNS, SURVEYS, Survey

    device, budget, info = setup(args)
    gpu = gpu_key(info, args.gpu_key)
    which = _csv_list(args.which) if args.which else list(SURVEYS)
    bad = [w for w in which if w not in SURVEYS]
    if bad:
        raise SystemExit(f"unknown survey(s) {bad}; known: {SURVEYS}")
    timer = Timer(device, budget, quick=args.quick, max_rep=args.max_rep or 10)
    kv_cap = (int(min(32 * 2 ** 30, 0.3 * torch.cuda.mem_get_info(device)[0])) if device.type == "cuda"
              else 64 * 2 ** 20)
    sv = Survey(timer, device, quick=args.quick, kv_cap_bytes=kv_cap, log=log)
    with torch.inference_mode():
        sv.run(which)
    out = Path(args.out) / "surveys" / gpu
    out.mkdir(parents=True, exist_ok=True)
    for name in which:
        rows = [r for r in sv.rows if r[0] == name]
        if not rows:
            continue
        path = out / f"{name}.csv"
        with path.open("w", newline="") as fh:
            w = csv.writer(fh, lineterminator="\n")
            w.writerow(SURVEY_COLUMNS)
            for r in rows:
                _check_time(float(r[10]), str(r))
                w.writerow(r)
        meta = dict(gpu=gpu, survey=name, date=datetime.date.today().isoformat(), device=device_string(info),
                    method=method_text(timer), command=args.parent_command or this_command(),
                    kind="op survey (not a pack: no servesim run reads it)", rows=len(rows),
                    seconds=sv.meta.get("seconds", {}).get(name), skipped=[x for x in sv.skipped if x.startswith(name)],
                    dropped=[x for x in timer.dropped if x.startswith(name)], environment=info,
                    **{k: v for k, v in sv.meta.items() if k == name})
        write_yaml(path.with_suffix(".yaml"), meta)
        log(f"wrote {path} ({len(rows)} rows)")
    if sv.skipped:
        log(f"survey: {len(sv.skipped)} skipped: {sv.skipped[:20]}")
    return 0


# ============================================================================== mode: iterations
def load_chooser(args, gpu: str, sdpa: Sdpa, tp: int) -> tuple[BackendChooser, str]:
    """The attention backend choice of the (model, tp) pack under ``--backends-from`` (a pack
    folder or a packs/ root), checked against the backends that pass here; without it, the first
    passing backend per kind."""
    if not args.backends_from:
        return (BackendChooser.constant(sdpa.passing),
                "first backend passing the float64 check per kind (no --backends-from)")
    stem = pack_stem(args.model, tp, getattr(args, "weights", "bf16"))
    ymeta = Path(args.backends_from) / f"{stem}.yaml"
    if not ymeta.is_file():  # a packs/ root: the GPU's folder below it
        ymeta = Path(args.backends_from) / gpu / f"{stem}.yaml"
    if not ymeta.is_file():
        raise SystemExit(f"--backends-from: {ymeta} not found")
    chooser = BackendChooser.from_meta(read_yaml(ymeta))
    if chooser is None:
        raise SystemExit(f"--backends-from: {ymeta} records no SDPA choice")
    bad = {k: c.get("backend") for k, c in chooser.per_kind.items()
           if any(b not in sdpa.passing.get(k, []) for b in _chooser_backends(c))}
    if bad:
        raise SystemExit(f"--backends-from {ymeta}: backends {bad} do not pass the float64 "
                         f"check here ({sdpa.passing})")
    return chooser, str(ymeta)


def _chooser_backends(c: dict) -> list:
    if c.get("rule") == "per point":
        return sorted({p[2] for p in c.get("points", [])})
    return [c.get("backend")]


def cmd_iterations(args) -> int:
    if args.tp > 1:
        return cmd_iterations_tp(args)
    device, budget, info = setup(args)
    gpu = gpu_key(info, args.gpu_key)
    rs = RankShape.of(args.model, 1, args.weights)
    timer = Timer(device, budget, quick=args.quick)
    if args.fwd_max_rep:
        timer.fwd_max_rep = max(timer.min_rep, args.fwd_max_rep)
    if args.fwd_budget_ms:
        timer.fwd_budget_ms = args.fwd_budget_ms
    sdpa = Sdpa(device)
    sdpa.check(rs.H, rs.KVH, rs.D, args.sdpa)
    chooser, chooser_from = load_chooser(args, gpu, sdpa, 1)
    backend = chooser.summary()
    log(f"iterations: model={args.model} on {device_string(info)}; SDPA {backend} ({chooser_from})")
    comps = validation_compositions(args.model, args.quick)
    if args.every and args.every > 1:
        comps = comps[:: args.every]
    if args.max_compositions:
        comps = comps[: args.max_compositions]
    t0 = time.time()
    rows, skipped = [], []
    used: dict = {}
    with torch.inference_mode():
        model = Model(rs, device, share_layers=True if args.share_layer_weights else None)
        kv_cap = 0.5 * torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 2 ** 28
        for i, c in enumerate(comps):
            if 2 * c.kv_slots * rs.KVH * rs.D * 2 > kv_cap:
                skipped.append(f"{c.key()}: KV cache over memory cap")
                continue
            try:
                budget.check()
                batch = Batch(c, rs, device, chooser=chooser)
                used[c.key()] = dict(prefill=batch.prefill_backend, decode=batch.decode_backend)
                res = {}
                modes = [True] if timer.cuda else []
                if i % max(1, args.eager_every) == 0 or not timer.cuda:
                    modes.insert(0, False)
                for graph in modes:
                    try:
                        m = timer.measure_forward(lambda: forward(model, batch), graph,
                                                  f"iteration {c.key()}")
                    except (BudgetExceeded, torch.cuda.OutOfMemoryError):
                        raise
                    except Exception as exc:  # e.g. a capture failure: the other mode still counts
                        skipped.append(f"{c.key()} {'graph' if graph else 'eager'}: {type(exc).__name__}: "
                                       f"{str(exc).splitlines()[0][:160] if str(exc) else ''}")
                        log(f"  SKIP {c.key()} {'graph' if graph else 'eager'}: {type(exc).__name__}: {exc}")
                        timer.sync()
                        continue
                    if m is not None:
                        res[graph] = m
                        rows.append((args.model, 1, graph, c.n_prefill, c.prefill_len, c.prefill_ctx,
                                     c.n_decode, c.decode_ctx, m.median_ms, m.std_ms))
                del batch
                log(f"  [{i + 1}/{len(comps)}] {c.key()} tokens={c.tokens}: "
                    + ", ".join(f"{'graph' if g else 'eager'} {m.median_ms:.3f} ms ± {m.std_ms:.3f}"
                                for g, m in res.items()))
            except BudgetExceeded:
                skipped.extend(f"{x.key()}: time budget" for x in comps[i:])
                log(f"  time budget ran out; {len(comps) - i} compositions not measured")
                break
            except torch.cuda.OutOfMemoryError:
                skipped.append(f"{c.key()}: out of memory")
            except Exception as exc:
                skipped.append(f"{c.key()}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
                log(f"  SKIP {c.key()}: {type(exc).__name__}: {exc}")
            if device.type == "cuda":
                torch.cuda.empty_cache()
        shared = model.shared_layers
        del model
    path = Path(args.out) / "validation" / gpu / f"{rs.stem}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    quant = [] if rs.weights == "bf16" else [rs.weights, "auto"]  # PACK_FORMAT.md's optional columns
    with path.open("w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(VAL_COLUMNS + (("quantization", "kv_cache_dtype") if quant else ()))
        for r in rows:
            _check_time(float(r[8]), str(r))
            w.writerow([r[0], r[1], "true" if r[2] else "false", *r[3:8], f"{r[8]:.6g}",
                        f"{max(r[9], 0.0):.6g}"] + quant)
    meta = base_meta(gpu, args.model, 1, info, rs)
    meta.pop("source")
    meta.update(
        kind="whole-iteration validation data (never read by the fit)",
        method=("full random-weight forward (embedding, every layer, final norm, lm_head on one row "
                "per sequence); CUDA events around each forward (eager) or graph replay (graph, one "
                "capture per composition), device synchronized before each repeat; "
                f"{1 if args.quick else 2} warm-up forwards, median of {timer.min_rep}-"
                f"{timer.fwd_max_rep}; one layer's KV buffers reused by every layer"
                if timer.cuda else "wall clock on CPU (logic test only)"),
        command=args.parent_command or this_command(),
        sdpa_backend=backend, sdpa_choice_from=chooser_from, sdpa_choice=chooser.to_meta(),
        sdpa_per_composition=used,
        eager=("every composition" if args.eager_every <= 1 else
               f"every {args.eager_every}-th composition (CUDA graph: all)"),
        shared_layer_weights=shared, compositions=len(comps),
        subset=(f"every {args.every}-th of validation_compositions()" if args.every > 1 else "all"),
        rows=len(rows), seconds=round(time.time() - t0, 1), skipped=skipped,
        dropped=timer.dropped,
        notes=("Prefills: one SDPA call per prefilling sequence (bottom-right causal over its cached "
               "context); decodes: one batched SDPA call (all sequences equal context). Every "
               "sequence samples one row (lm_head rows = sequences). Same op functions as the op "
               "tables (calibration/profile_gpu.py). Compositions are disjoint from the overhead "
               "calibration batches (decode-only, batch in "
               f"{CALIB_BATCHES}, context {CALIB_CTX})."),
    )
    write_yaml(path.with_suffix(".yaml"), meta)
    log(f"wrote {path} ({len(rows)} rows, {len(skipped)} compositions skipped) in {time.time() - t0:.0f}s")
    return 0


# ============================================================================== iterations under TP
def _iter_tp_worker(rank: int, world: int, port: int, args, out_json: str) -> None:
    """One TP rank: the per-rank forward with NCCL all-reduces (gloo on CPU), every composition
    timed in lockstep with the other ranks. Each repeat lines the ranks up (a small all-reduce),
    times one forward (or graph replay) with CUDA events, and keeps the maximum over ranks; the
    repeat count is fixed, so every rank issues the same collectives."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    import torch.distributed as dist
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    info = device_info(device)
    gpu = gpu_key(info, args.gpu_key)
    rs = RankShape.of(args.model, args.tp)
    sdpa = Sdpa(device)
    sdpa.check(rs.H, rs.KVH, rs.D, args.sdpa)
    chooser, chooser_from = load_chooser(args, gpu, sdpa, args.tp)
    deadline = args.deadline_epoch or (time.time() + args.time_budget_s if args.time_budget_s else None)

    def all_reduce(x):
        if cuda:
            dist.all_reduce(x)
        else:  # gloo has no bf16 sum: reduce a float32 copy (logic tests only)
            y = x.float()
            dist.all_reduce(y)
            x.copy_(y)

    flag = torch.zeros(1, device=device)

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def timed(run) -> float:
        dist.all_reduce(flag)  # line the ranks up
        sync()
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            run()
            e1.record()
            sync()
            t = e0.elapsed_time(e1)
        else:
            t0 = time.perf_counter()
            run()
            t = (time.perf_counter() - t0) * 1e3
        tt = torch.tensor([t], device=device)
        dist.all_reduce(tt, op=dist.ReduceOp.MAX)
        return float(tt.item())

    n_rep = max(3, args.fwd_max_rep or (3 if args.quick else 5))
    comps = validation_compositions(args.model, args.quick)
    if args.every and args.every > 1:
        comps = comps[:: args.every]
    if args.max_compositions:
        comps = comps[: args.max_compositions]
    rows, skipped, used = [], [], {}
    t0 = time.time()
    with torch.inference_mode():
        model = Model(rs, device, share_layers=True if args.share_layer_weights else None, seed=rank)
        for i, c in enumerate(comps):
            # the same decision on every rank (rank 0's clock), or the collectives would diverge
            late = torch.tensor([1.0 if deadline and time.time() > deadline else 0.0], device=device)
            dist.broadcast(late, 0)
            if late.item():
                skipped.extend(f"{x.key()}: time budget" for x in comps[i:])
                break
            batch = Batch(c, rs, device, chooser=chooser)
            used[c.key()] = dict(prefill=batch.prefill_backend, decode=batch.decode_backend)
            modes = [False] + ([True] if cuda else [])
            if i % max(1, args.eager_every) and cuda:
                modes = [True]
            res = {}
            for graph in modes:
                fwd = (lambda: forward(model, batch, all_reduce))
                for _ in range(2):
                    fwd()
                sync()
                run, g = fwd, None
                if graph:
                    g = torch.cuda.CUDAGraph()
                    st = torch.cuda.Stream(device)
                    st.wait_stream(torch.cuda.current_stream(device))
                    with torch.cuda.stream(st):
                        g.capture_begin()
                        try:
                            fwd()
                        finally:
                            g.capture_end()
                    torch.cuda.current_stream(device).wait_stream(st)
                    run = g.replay
                    for _ in range(2):
                        run()
                    sync()
                times = [timed(run) for _ in range(n_rep)]
                del g
                arr = np.asarray(times)
                med, std = float(np.median(arr)), float(arr.std(ddof=1))
                if math.isfinite(med) and med > 0:
                    res[graph] = med
                    rows.append((args.model, args.tp, graph, c.n_prefill, c.prefill_len, c.prefill_ctx,
                                 c.n_decode, c.decode_ctx, med, std))
            del batch
            if cuda:
                torch.cuda.empty_cache()
            if rank == 0:
                log(f"  [{i + 1}/{len(comps)}] {c.key()} tokens={c.tokens}: "
                    + ", ".join(f"{'graph' if gr else 'eager'} {v:.3f} ms" for gr, v in res.items()))
    if rank == 0:
        with open(out_json, "w") as fh:
            json.dump(dict(rows=rows, skipped=skipped, used=used, gpu=gpu, info=_plain(info),
                           chooser=chooser.to_meta(), chooser_from=chooser_from,
                           backend=chooser.summary(), n_rep=n_rep, seconds=round(time.time() - t0, 1),
                           shared=model.shared_layers, compositions=len(comps),
                           nccl=(".".join(map(str, torch.cuda.nccl.version())) if cuda else None)), fh)
    dist.destroy_process_group()


def cmd_iterations_tp(args) -> int:
    """Whole-iteration validation forwards at TP > 1: one process per GPU (per-rank slices, NCCL
    all-reduces after o_proj and down_proj), eager and as a CUDA graph that holds the collectives
    too. Rows go to validation/<gpu>/<model>-tp<N>.csv (column tp = N)."""
    import tempfile
    import torch.multiprocessing as mp
    n = args.tp
    if args.device == "cuda" and torch.cuda.device_count() < n:
        raise SystemExit(f"iterations --tp {n} needs {n} GPUs, {torch.cuda.device_count()} visible")
    fd, tmp = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    log(f"iterations: model={args.model} tp={n}, {n} processes, NCCL_NVLS_ENABLE="
        f"{os.environ['NCCL_NVLS_ENABLE']}")
    mp.spawn(_iter_tp_worker, args=(n, port, args, tmp), nprocs=n, join=True)
    with open(tmp) as fh:
        got = json.load(fh)
    os.unlink(tmp)
    path = Path(args.out) / "validation" / got["gpu"] / f"{pack_stem(args.model, n)}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(VAL_COLUMNS)
        for r in got["rows"]:
            _check_time(float(r[8]), str(r))
            w.writerow([r[0], r[1], "true" if r[2] else "false", *r[3:8], f"{r[8]:.6g}",
                        f"{max(r[9], 0.0):.6g}"])
    rs = RankShape.of(args.model, n)
    meta = base_meta(got["gpu"], args.model, n, got["info"], rs)
    meta.pop("source")
    meta.update(
        kind="whole-iteration validation data (never read by the fit)",
        method=(f"one process per GPU (torch.distributed, NCCL), per-rank forward with all_reduce after "
                f"o_proj and down_proj; per repeat the ranks are lined up with a small all-reduce, "
                f"CUDA events around one forward (eager) or graph replay (graph: the collectives "
                f"captured too), time = max over ranks; 2 warm-up forwards, median of "
                f"{got['n_rep']} repeats"),
        command=args.parent_command or this_command(), nccl=got["nccl"],
        sdpa_backend=got["backend"], sdpa_choice_from=got["chooser_from"], sdpa_choice=got["chooser"],
        sdpa_per_composition=got["used"], shared_layer_weights=got["shared"],
        compositions=got["compositions"], rows=len(got["rows"]), seconds=got["seconds"],
        skipped=got["skipped"],
        env={k: os.environ[k] for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                        "NVSHMEM_DISABLE_NVLS")})
    write_yaml(path.with_suffix(".yaml"), meta)
    log(f"wrote {path} ({len(got['rows'])} rows, {len(got['skipped'])} skipped)")
    return 0


# ============================================================================== mode: backends
def cmd_backends(args) -> int:
    """Check every SDPA backend against float64 and time the passing ones on each attention kind's
    survey lattice (``attn_backends.SURVEY``): the evidence for the choice ``ops`` makes, without
    the dense grid (writes backends_<model>.json, no pack rows)."""
    device, budget, info = setup(args)
    rs = RankShape.of(args.model, args.tp)
    timer = Timer(device, budget, quick=args.quick)
    sdpa = Sdpa(device)
    sdpa.check(rs.H, rs.KVH, rs.D, args.sdpa)
    sdpa.record_kernels(rs.H, rs.KVH, rs.D)
    kv_cap = int(min(16 * 2 ** 30, 0.25 * torch.cuda.mem_get_info(device)[0])) \
        if device.type == "cuda" else 64 * 2 ** 20
    bench = OpBench(rs, device, timer, sdpa, args.quick, kv_cap_bytes=kv_cap,
                    rot_bytes=4 * (int(info.get("l2_bytes") or 0) or 50 * 2 ** 20))
    with torch.inference_mode():
        for kind in KINDS:
            bench.ensure_survey(kind)
    path = Path(args.out) / f"backends_{pack_stem(args.model, args.tp)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(device=device_string(info), model=args.model, tp=args.tp,
                                    checks=sdpa.checks, passing=sdpa.passing, kernels=sdpa.kernels,
                                    survey={k: v.to_meta() for k, v in bench.surveys.items()},
                                    backend_skips=bench.backend_skips), indent=1))
    log(f"wrote {path}")
    return 0


# ============================================================================== mode: allreduce
def _coll_worker(rank: int, world: int, port: int, cfg: dict) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    import torch.distributed as dist
    cuda = cfg["device"] == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
    else:
        dev = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    dtype = torch.bfloat16 if cuda else torch.float32
    esize = 2 if cuda else 4
    n_rep = 3 if cfg["quick"] else 10
    results: list = []
    eager: dict = {}
    methods: dict = {}
    graph_fail: dict = {}

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    def timed(fn, iters) -> float:
        """ms per call of fn over `iters` back-to-back calls, the maximum over ranks."""
        flag = torch.zeros(1, device=dev, dtype=torch.float32)
        dist.all_reduce(flag)  # line the ranks up
        sync()
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(iters):
                fn()
            e1.record()
            sync()
            t = e0.elapsed_time(e1) / iters
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            t = (time.perf_counter() - t0) * 1e3 / iters
        tt = torch.tensor([t], device=dev, dtype=torch.float32)
        dist.all_reduce(tt, op=dist.ReduceOp.MAX)
        return float(tt.item())

    def stats(times):
        good = [t for t in times if math.isfinite(t) and t > 0]
        if not good:
            raise RuntimeError("no positive finite time")
        arr = np.asarray(good)
        return float(np.median(arr)), (float(arr.std(ddof=1)) if len(arr) > 1 else 0.0)

    def graph_times(fn, iters) -> list:
        """Capture `iters` back-to-back calls in a CUDA graph (every rank the same), replay: the
        collective's GPU time without the eager per-call CPU cost, as the op tables are measured.
        Per repeat: ranks lined up, events around one replay, time = max over ranks / iters."""
        s = torch.cuda.Stream(dev)
        s.wait_stream(torch.cuda.current_stream(dev))
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(s):
            g.capture_begin()
            try:
                for _ in range(iters):
                    fn()
            finally:
                g.capture_end()
        torch.cuda.current_stream(dev).wait_stream(s)
        g.replay()
        g.replay()
        sync()
        out = []
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        flag = torch.zeros(1, device=dev, dtype=torch.float32)
        for _ in range(n_rep):
            dist.all_reduce(flag)
            sync()
            e0.record()
            g.replay()
            e1.record()
            sync()
            tt = torch.tensor([e0.elapsed_time(e1) / iters], device=dev, dtype=torch.float32)
            dist.all_reduce(tt, op=dist.ReduceOp.MAX)
            out.append(float(tt.item()))
        del g
        return out

    use_graph = cuda and not cfg.get("no_graph")
    for op in ("all_reduce", "send_recv"):
        if op == "send_recv" and world < 2:
            continue
        group = world if op == "all_reduce" else 2
        for nbytes in cfg["sizes"]:
            x = torch.randn(max(1, nbytes // esize), device=dev, dtype=dtype)
            nb = x.numel() * esize
            if op == "all_reduce":
                def fn():
                    dist.all_reduce(x)
            else:
                def fn():
                    if rank == 0:
                        dist.send(x, 1)
                    elif rank == 1:
                        dist.recv(x, 0)
            try:
                for _ in range(3):
                    fn()
                sync()
                one = timed(fn, 1)
                iters = max(1, min(20, int(2.0 / max(one, 1e-3))))
                med_e, std_e = stats([timed(fn, iters) for _ in range(n_rep)])
                eager[f"{op} {nb}"] = round(med_e, 6)
                med, std, how = med_e, std_e, f"eager x{iters}"
                if use_graph:
                    try:
                        giters = max(1, min(50, int(2.0 / max(med_e, 1e-3))))
                        med, std = stats(graph_times(fn, giters))
                        how = f"graph x{giters}"
                    except Exception as exc:  # keep the eager number and say so
                        graph_fail[f"{op} {nb}"] = f"{type(exc).__name__}: {str(exc)[:160]}"
                        med, std, how = med_e, std_e, f"eager x{iters} (graph failed)"
                        sync()
                results.append((op, 0, group, 0, nb, med, std))
                methods[f"{op} {nb}"] = how
                if rank == 0:
                    bw = nb / (med * 1e-3) / 1e9
                    print(f"{time.strftime('%H:%M:%S')}   {op} n={group} bytes={nb}: {med:.4f} ms "
                          f"± {std:.4f} ({how}; eager {med_e:.4f} ms; algbw {bw:.1f} GB/s)", flush=True)
            except Exception as exc:
                if rank == 0:
                    print(f"  SKIP {op} bytes={nbytes}: {type(exc).__name__}: {exc}", flush=True)
            del x
            if rank == 0:  # after every size, so a hang later still leaves these results
                with open(cfg["tmp"], "w") as fh:
                    json.dump(dict(rows=results, eager_ms=eager, methods=methods,
                                   graph_failures=graph_fail), fh)
    dist.destroy_process_group()


def cmd_allreduce(args) -> int:
    device, budget, info = setup(args)
    gpu = gpu_key(info, args.gpu_key)
    n = args.gpus
    if device.type == "cuda" and torch.cuda.device_count() < n:
        raise SystemExit(f"--gpus {n} but only {torch.cuda.device_count()} visible")
    import tempfile
    import torch.multiprocessing as mp
    fd, tmp = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = dict(device=device.type, quick=args.quick, tmp=tmp, no_graph=args.eager_collectives,
               sizes=QUICK_COLL_SIZES if args.quick else COLL_SIZES)
    log(f"allreduce: {n} processes, {len(cfg['sizes'])} sizes, NCCL_NVLS_ENABLE="
        f"{os.environ['NCCL_NVLS_ENABLE']} TORCH_SYMM_MEM_DISABLE_MULTICAST="
        f"{os.environ['TORCH_SYMM_MEM_DISABLE_MULTICAST']} NVSHMEM_DISABLE_NVLS="
        f"{os.environ['NVSHMEM_DISABLE_NVLS']}")
    t0 = time.time()
    ctx = mp.spawn(_coll_worker, args=(n, port, cfg), nprocs=n, join=False)
    limit = t0 + (args.time_budget_s or 300.0)
    if args.deadline_epoch:
        limit = min(limit, args.deadline_epoch)
    incomplete = None
    try:
        while not ctx.join(timeout=5):
            if time.time() > limit:
                incomplete = "time limit reached; workers terminated, partial results kept"
                break
    except Exception as exc:  # a worker failed: keep what rank 0 wrote so far
        incomplete = f"{type(exc).__name__}: {str(exc)[:300]}"
    if incomplete:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.terminate()
        log(f"allreduce incomplete: {incomplete}")
    if not os.path.getsize(tmp):
        raise SystemExit("allreduce: no results")
    with open(tmp) as fh:
        got = json.load(fh)
    rows = [tuple(r) for r in got["rows"]]
    os.unlink(tmp)
    path = Path(args.out) / "collectives" / gpu / f"collectives_{n}gpu.csv"
    write_rows(path, rows)
    topo, nccl_ver = "", None
    if device.type == "cuda":
        try:
            topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                                  timeout=20).stdout
        except Exception:
            pass
        try:
            v = torch.cuda.nccl.version()
            nccl_ver = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:
            pass
    write_yaml(path.with_suffix(".yaml"), dict(
        gpu=gpu, gpus=n, source="measured", date=datetime.date.today().isoformat(),
        device=device_string(info), nccl=nccl_ver,
        method=("torch.distributed, one process per GPU (NCCL; gloo on CPU); bf16 tensors; 3 warm-up "
                "calls; per repeat the ranks are lined up with a small all-reduce and time = max over "
                "ranks. time_ms (NCCL): `iters` back-to-back calls captured in one CUDA graph per "
                "rank (iters so that they take ~2 ms, 1..50), CUDA events around a replay, / iters, "
                "so the CPU launch cost is excluded as for the op tables; eager_ms (in the "
                "collectives YAML): events "
                "around `iters` eager back-to-back calls (1..20), which includes PyTorch's per-call "
                f"CPU cost for small messages. Median of {n_rep_text(args)} repeats. send_recv: rank 0 "
                "sends to rank 1."),
        row_methods=got.get("methods", {}), eager_ms=got.get("eager_ms", {}),
        graph_failures=got.get("graph_failures", {}), incomplete=incomplete,
        env={k: os.environ[k] for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                        "NVSHMEM_DISABLE_NVLS")},
        topology=topo, command=args.parent_command or this_command(), rows=len(rows),
        seconds=round(time.time() - t0, 1)))
    log(f"wrote {path} ({len(rows)} rows) in {time.time() - t0:.0f}s")
    return 0


def n_rep_text(args) -> int:
    return 3 if args.quick else 10


# ============================================================================== merge
def merge_collectives_into(pack_csv: Path, coll_csvs: list) -> None:
    """Put measured collectives into one pack: all_reduce rows whose group size equals the pack's
    TP (only for TP > 1) and send_recv rows (pipeline stages, any TP). Collective rows the pack
    already had are replaced, and the YAML records where the new ones came from."""
    tp = stem_tp(pack_csv.stem)
    add, sources, have_send = [], [], False
    for coll_csv in map(Path, coll_csvs):
        rows = read_rows(coll_csv)
        ar = [r for r in rows if r[0] == "all_reduce" and r[2] == tp and tp > 1]
        sr = [] if have_send else [r for r in rows if r[0] == "send_recv"]
        have_send = have_send or bool(sr)
        if ar or sr:
            ymeta = coll_csv.with_suffix(".yaml")
            cmeta = read_yaml(ymeta) if ymeta.is_file() else {}
            sources.append(dict(file=coll_csv.name, gpus=cmeta.get("gpus"), nccl=cmeta.get("nccl"),
                                method=cmeta.get("method"), command=cmeta.get("command"),
                                all_reduce_rows=len(ar), send_recv_rows=len(sr)))
        add += ar + sr
    rows = [r for r in read_rows(pack_csv) if r[0] not in ("all_reduce", "send_recv")] + add
    write_rows(pack_csv, rows)
    ymeta = pack_csv.with_suffix(".yaml")
    if ymeta.is_file():
        meta = read_yaml(ymeta)
        meta["collectives"] = sources or "none measured for this TP degree"
        meta["rows"] = len(rows)
        write_yaml(ymeta, meta)
    log(f"merged {len(add)} collective rows into {pack_csv}")


def cmd_merge(args) -> int:
    out = Path(args.out)
    for gpu_dir in sorted(p for p in (out / "packs").glob("*") if p.is_dir()):
        colls = sorted((out / "collectives" / gpu_dir.name).glob("collectives_*gpu.csv"))
        if not colls:
            log(f"no collectives for {gpu_dir.name}")
            continue
        for pack in sorted(gpu_dir.glob("*.csv")):
            merge_collectives_into(pack, colls)
    return 0


# ============================================================================== combine
OVERHEAD_OPS = ("overhead_eager", "overhead_cuda_graph")


def cmd_combine(args) -> int:
    """Finish packs measured in pieces (all on this machine, no GPU needed):

    * ``--keep-from DIR --keep-ops a,b``: rows of those ops are taken from the packs of the same
      name in DIR (an earlier measurement: e.g. attn_prefill and the collectives when only the
      token ops and decode attention were re-measured); the YAML says where they came from.
    * ``--replace-from DIR --replace-ops a,b``: the opposite: rows of those ops come from the packs
      of the same name in DIR (a newer measurement of only those ops, e.g. a denser attn_prefill
      grid). A pack that DIR lacks, or that has no rows of an op, takes them from a pack in DIR
      whose rank shape gives that op the same kernel and input shapes (``OpBench.sig``: e.g.
      attention of llama-3-8b = qwen3-8b), keeping the points within its max_model_len: the
      measurement ``ops`` would have shared within one process.
    * ``--add-from DIR [--add-ops a,b] [--add-alias target:source,...]``: rows of DIR's pack of
      the same name (or of the aliased source pack, e.g. qwen3-4b:qwen3-8b for attention, whose
      kernels and input shapes are the same) are appended where the pack has no row at that point
      (op, tokens, batch, context, bytes) -- the ``--grid long`` extension of a dense pack. Only
      points within this model's max_model_len are taken; the YAML lists what came from where.
    * ``--overheads-from D1,D2``: overhead rows measured again in other processes (``ops --stages
      overhead --tables-from``, same tables) are combined with the pack's own by the median, per op
      and batch, of forward - tables over all processes; every process's value is kept in the YAML.
      Batches that only some processes measured take the median of those (a pack combined before
      contributes every process it already lists). Why: the eager launch time of one forward
      varies between processes on a VM host (5-22 ms seen on the lent H200), so one process is a
      poor sample of it.
    """
    out = Path(args.out)
    keep_ops = _csv_list(args.keep_ops or "")
    replace_ops = _csv_list(getattr(args, "replace_ops", None) or "")
    others = [Path(x) for x in _csv_list(args.overheads_from or "")]
    alias = dict(x.split(":", 1) for x in _csv_list(getattr(args, "add_alias", None) or ""))
    for gpu_dir in sorted(p for p in (out / "packs").glob("*") if p.is_dir()):
        for pack in sorted(gpu_dir.glob("*.csv")):
            rows = read_rows(pack)
            meta = read_yaml(pack.with_suffix(".yaml"))
            if getattr(args, "add_from", None):
                rows = _add_rows(rows, meta, pack, Path(args.add_from), _csv_list(args.add_ops or ""), alias)
            if replace_ops:
                rows, meta["replaced_rows"] = _replace_rows(rows, pack, Path(args.replace_from),
                                                            replace_ops)
                for op, note in meta["replaced_rows"]["per_op"].items():
                    meta.setdefault("timing_methods", {})[op] = note.pop("timing_methods", None)
                    sd = note.pop("sdpa", None)
                    if op.startswith("attn_") and sd:  # the attention rows' backend choice with them
                        meta["sdpa"], meta["sdpa_backend"] = sd, note.pop("sdpa_backend", None)
                    g = note.get("grid") or {}
                    if op == "attn_prefill" and g.get("prefill_chunk"):
                        meta.setdefault("grid", {}).update(prefill_chunk=g["prefill_chunk"],
                                                           prefill_context=g.get("prefill_context"))
            if keep_ops:
                old = Path(args.keep_from) / pack.name
                kept = [r for r in read_rows(old) if r[0] in keep_ops]
                rows = [r for r in rows if r[0] not in keep_ops] + kept
                oldmeta = read_yaml(old.with_suffix(".yaml"))
                meta["kept_rows"] = dict(
                    ops=keep_ops, rows=len(kept), from_pack=str(old),
                    measured=oldmeta.get("date"), command=oldmeta.get("command"),
                    method=oldmeta.get("method"), collectives=oldmeta.get("collectives"))
                if {"all_reduce", "send_recv"} & set(keep_ops) and oldmeta.get("collectives"):
                    meta["collectives"] = oldmeta["collectives"]
                for op in keep_ops:
                    if op in (oldmeta.get("timing_methods") or {}):
                        meta.setdefault("timing_methods", {})[op] = oldmeta["timing_methods"][op]
            if others:
                ov = meta.get("overhead") or {}
                pts = ov.get("points") or {}
                before = (ov.get("combined") or {}).get("points") or {}
                old_sources = (ov.get("combined") or {}).get("sources") or ["this pack"]
                per: dict = {}
                for key, v in pts.items():
                    if key in before:  # combined earlier: every process it already lists
                        per.setdefault(key, []).extend(float(x) for x in before[key]["diff_ms_per_process"])
                    else:
                        per.setdefault(key, []).append(float(v["diff_ms"]))
                std = {(r[0], int(r[2])): r[6] for r in rows if r[0] in OVERHEAD_OPS}
                for d in others:
                    src = d / "packs" / gpu_dir.name / pack.with_suffix(".yaml").name
                    if not src.exists():
                        log(f"  {src} missing: no overhead points from {d}")
                        continue
                    om = read_yaml(src)
                    for key, v in ((om.get("overhead") or {}).get("points") or {}).items():
                        per.setdefault(key, []).append(float(v["diff_ms"]))
                        op, b = key.split(" batch=")
                        if not math.isfinite(std.get((op, int(b)), float("nan"))):
                            std[(op, int(b))] = float(v.get("forward_std_ms", float("nan")))
                rows = [r for r in rows if r[0] not in OVERHEAD_OPS]
                combined = {}
                for key, diffs in sorted(per.items()):
                    op, b = key.split(" batch=")
                    med = float(np.median(diffs))
                    combined[key] = dict(diff_ms_per_process=[round(x, 5) for x in diffs],
                                         median_ms=round(med, 5))
                    if math.isfinite(med) and med > 0:
                        sd = std.get((op, int(b)), float("nan"))
                        rows.append((op, int(b), int(b), 0, 0, med, sd))
                ov["combined"] = dict(
                    processes=max(len(v) for v in per.values()) if per else 1 + len(others),
                    sources=list(old_sources) + [str(d) for d in others],
                    rule="median over processes of forward - table sum, per op and batch", points=combined)
                meta["overhead"] = ov
            rows = sorted(rows, key=lambda r: (r[0], int(r[2]), int(r[1]), int(r[3]), int(r[4])))
            write_rows(pack, rows)
            meta["rows"] = len(rows)
            meta["combined"] = dict(command=this_command(), date=time.strftime("%Y-%m-%d"),
                                    note=args.note or "")
            write_yaml(pack.with_suffix(".yaml"), meta)
            log(f"combined {pack}: {len(rows)} rows")
    return 0


def _add_rows(rows: list, meta: dict, pack: Path, src_dir: Path, ops: list, alias: dict) -> list:
    """``combine --add-from``: append the source pack's rows at points this pack lacks."""
    name = alias.get(pack.stem, pack.stem)
    src = src_dir / f"{name}.csv"
    if not src.is_file():
        log(f"  {src} missing: nothing added to {pack.name}")
        return rows
    max_len = int((ALL_SHAPES.get(meta.get("model")) or {}).get("max_model_len", 1 << 62))
    have = {(r[0], int(r[1]), int(r[2]), int(r[3]), int(r[4])) for r in rows}
    added: dict = {}
    for r in read_rows(src):
        key = (r[0], int(r[1]), int(r[2]), int(r[3]), int(r[4]))
        if (ops and r[0] not in ops) or key in have or r[0] in OVERHEAD_OPS:
            continue
        if r[0] == "attn_prefill" and key[1] + key[3] > max_len:
            continue
        if r[0] == "attn_decode" and key[3] + 1 > max_len:
            continue
        rows.append(r)
        added[r[0]] = added.get(r[0], 0) + 1
    sm = read_yaml(src.with_suffix(".yaml"))
    meta.setdefault("added_rows", []).append(dict(
        from_pack=str(src), rows_per_op=added, measured=sm.get("date"), device=sm.get("device"),
        command=sm.get("command"), grid=sm.get("grid"), sdpa_backend=sm.get("sdpa_backend"),
        rule="appended at points this pack lacked (same op, kernel and input shapes)"))
    log(f"  {pack.name}: added {added} from {src}")
    return rows


def _attn_sig(meta: dict, op: str) -> tuple:
    rs = meta.get("rank_shape") or {}
    return (op, rs.get("num_heads"), rs.get("num_kv_heads"), rs.get("head_dim"))


def _replace_rows(rows: list, pack: Path, src_dir: Path, ops: list) -> tuple[list, dict]:
    """Rows of ``ops`` from ``src_dir``'s pack of the same name, else from a pack there whose
    rank shape gives the op the same kernel and input shapes (attention ops only), keeping the
    points within this model's max_model_len. Returns the rows and a provenance note."""
    meta = read_yaml(pack.with_suffix(".yaml"))
    max_len = ALL_SHAPES.get(meta.get("model"), {}).get("max_model_len")
    note: dict = dict(ops=ops, per_op={})
    rows = [r for r in rows if r[0] not in ops]
    for op in ops:
        src = src_dir / pack.name
        got = [r for r in read_rows(src) if r[0] == op] if src.exists() else []
        shared = False
        if not got and op.startswith("attn_"):
            for other in sorted(src_dir.glob("*.csv")):
                if other.name != pack.name and _attn_sig(read_yaml(other.with_suffix(".yaml")), op) \
                        == _attn_sig(meta, op):
                    cand = [r for r in read_rows(other) if r[0] == op]
                    if cand:
                        src, got, shared = other, cand, True
                        break
        if max_len:
            got = [r for r in got if r[1] + r[3] <= max_len] if op == "attn_prefill" else got
        if not got:
            raise SystemExit(f"combine: no {op} rows for {pack.name} in {src_dir}")
        sm = read_yaml(src.with_suffix(".yaml"))
        note["per_op"][op] = dict(rows=len(got), from_pack=str(src), measured=sm.get("date"),
                                  command=sm.get("command"), method=sm.get("method"),
                                  grid=sm.get("grid"), stages_skipped=sm.get("stages_skipped"),
                                  shared_from_equal_shape=shared,
                                  timing_methods=(sm.get("timing_methods") or {}).get(op),
                                  sdpa=sm.get("sdpa"), sdpa_backend=sm.get("sdpa_backend"))
        rows += got
    return rows, note


# ============================================================================== mode: all
@dataclass
class Task:
    name: str
    argv: list
    cost: float
    rc: Optional[int] = None
    seconds: float = 0.0


def cmd_all(args) -> int:
    """Run allreduce (all GPUs), then ops and iterations tasks spread over the GPUs (one process a
    task, one GPU each, longest first), then merge the collectives into the packs."""
    t_start = time.time()
    out = Path(args.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    models = [m for m in args.models.split(",") if m]
    tps = [int(x) for x in args.tps.split(",") if x]
    iter_models = models if args.iter_models is None else [m for m in args.iter_models.split(",") if m]
    for m in models + iter_models:
        if m not in ALL_SHAPES:
            raise SystemExit(f"unknown model {m}; known: {', '.join(ALL_SHAPES)}")
    cuda = args.device == "cuda"
    ngpu = torch.cuda.device_count() if cuda else 2
    workers = min(ngpu, args.workers) if args.workers else ngpu
    hard = t_start + args.time_budget_s - 25 if args.time_budget_s else None
    soft = t_start + 0.75 * args.time_budget_s if args.time_budget_s else None
    common = ["--out", str(out), "--device", args.device, "--sdpa", args.sdpa]
    grid_args = ["--grid", args.grid] + (["--max-rep", str(args.max_rep)] if args.max_rep else [])
    if args.quick:
        common.append("--quick")
    if args.gpu_key:
        common += ["--gpu-key", args.gpu_key]
    if hard:
        common += ["--deadline-epoch", f"{hard:.0f}", "--soft-deadline-epoch", f"{soft:.0f}"]
    parent = this_command()
    common += ["--parent-command", parent]
    me = [sys.executable, "-u", os.path.abspath(__file__)]
    log(f"all: models {models}, tp {tps}, iterations for {iter_models}, {workers} worker(s), "
        f"{ngpu} {'GPU(s)' if cuda else 'CPU slots'}")
    lock = threading.Lock()

    # 1. collectives first (they need every GPU at once)
    coll_rc = None
    want_coll = not args.skip_allreduce and ngpu >= 2
    if want_coll:
        coll_rc = _run_logged(me + ["allreduce", "--gpus", str(ngpu)] + common, None,
                              out / "logs" / "allreduce.log", "allreduce", lock)
    elif not args.skip_allreduce:
        log("only one GPU: all_reduce / send_recv not measured")

    # 2. ops and iterations, longest first, onto free GPUs
    def size(m):
        s = ALL_SHAPES[m]
        return s["num_layers"] * (3 * s["hidden_size"] * s["intermediate_size"] + 2 * s["hidden_size"] ** 2)
    tasks = [Task(f"ops-{pack_stem(m, tp)}", me + ["ops", "--model", m, "--tp", str(tp)] + grid_args + common,
                  cost=(1.0 if tp == 1 else 0.6) * size(m) * 1.2) for m in models for tp in tps]
    tasks.sort(key=lambda t: -t.cost)
    # iterations after every ops task: their forwards take the attention backends the op tables chose
    it_tasks = [Task(f"iterations-{m}", me + ["iterations", "--model", m, "--backends-from",
                                              str(out / "packs")] + common, cost=size(m))
                for m in iter_models]
    it_tasks.sort(key=lambda t: -t.cost)
    q: "queue.Queue[Task]" = queue.Queue()
    for t in tasks:
        q.put(t)

    def worker(slot: int):
        while True:
            try:
                t = q.get_nowait()
            except queue.Empty:
                return
            if hard and time.time() > hard:
                t.rc = -1
                log(f"not started (time budget): {t.name}")
                continue
            env = {"CUDA_VISIBLE_DEVICES": str(slot)} if cuda else {}
            t0 = time.time()
            t.rc = _run_logged(t.argv, env, out / "logs" / f"{t.name}.log", f"w{slot} {t.name}", lock)
            t.seconds = time.time() - t0
    for phase in (tasks, it_tasks):
        if phase is it_tasks:
            for t in it_tasks:
                q.put(t)
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(workers)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    tasks = tasks + it_tasks

    # 3. merge
    if want_coll and coll_rc == 0:
        cmd_merge(argparse.Namespace(out=str(out)))
    summary = dict(command=parent, seconds=round(time.time() - t_start, 1), allreduce_rc=coll_rc,
                   tasks=[dict(name=t.name, rc=t.rc, seconds=round(t.seconds, 1)) for t in tasks])
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    log("summary: " + json.dumps(summary))
    return 0 if all(t.rc == 0 for t in tasks) and coll_rc in (None, 0) else 1


def _run_logged(argv, env_add, logpath: Path, prefix: str, lock) -> int:
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env_add or {}))
    with open(logpath, "w") as lf:
        lf.write("$ " + " ".join(shlex.quote(a) for a in argv) + "\n")
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        assert p.stdout is not None
        for line in p.stdout:
            lf.write(line)
            lf.flush()
            with lock:
                print(f"[{prefix}] {line}", end="", flush=True)
        rc = p.wait()
    log(f"[{prefix}] exit {rc}")
    return rc


# ============================================================================== CLI
THEN = "--then"


def main(argv=None) -> int:
    """One mode, or several chained with ``--then`` and run one after another in this process
    (torch and CUDA start once; e.g. ``ops ... --then iterations ...``). The exit status is the
    first non-zero one."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if THEN in argv:
        parts, cur = [], []
        for a in argv:
            if a == THEN:
                parts.append(cur)
                cur = []
            else:
                cur.append(a)
        parts.append(cur)
        rc = 0
        for part in parts:
            log("chained: " + " ".join(shlex.quote(a) for a in part))
            r = _main_one(part)
            rc = rc or r
        return rc
    return _main_one(argv)


def _main_one(argv: list) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)

    def common(sp):
        sp.add_argument("--out", required=True, help="output folder (packs/, validation/, collectives/)")
        sp.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: wall-clock logic test (use with a tiny model)")
        sp.add_argument("--quick", action="store_true", help="tiny grids, for smoke tests")
        sp.add_argument("--sdpa", choices=["auto", "flash", "cudnn", "efficient", "math"], default="auto",
                        help="SDPA backend; auto tries flash, cudnn, efficient, math in that order")
        sp.add_argument("--gpu-key", default=None, help="folder name for the GPU (default: from its name)")
        sp.add_argument("--time-budget-s", type=float, default=None,
                        help="stop measuring after this many seconds (minimum repeats after 75-80%%)")
        sp.add_argument("--deadline-epoch", type=float, default=None, help=argparse.SUPPRESS)
        sp.add_argument("--soft-deadline-epoch", type=float, default=None, help=argparse.SUPPRESS)
        sp.add_argument("--parent-command", default=None, help=argparse.SUPPRESS)

    def add_grid_args(sp):
        sp.add_argument("--grid", choices=["dense", "sparse", "long"], default="dense",
                        help="op grid: dense (default; see DENSE_* in this file) or sparse (the "
                             "powers-of-two grid of the first H200 packs)")
        sp.add_argument("--max-rep", type=int, default=None,
                        help="most timed replays per point (default 10 dense, 20 sparse)")

    models = sorted(ALL_SHAPES)
    sp = sub.add_parser("ops", help="op tables (one pack per model and TP degree)")
    sp.add_argument("--model", required=True,
                    help=f"model, or a comma list (one process, shared measurements): {models}")
    sp.add_argument("--tp", default="1", help="TP degree, or a comma list")
    sp.add_argument("--collectives", default=None, help="collectives CSV to merge into the pack")
    sp.add_argument("--skip-overhead", action="store_true")
    sp.add_argument("--stages", default=None,
                    help=f"comma list of stages to run (default all): {OPS_STAGES}")
    sp.add_argument("--tables-from", default=None,
                    help="folder of packs whose op rows give the table sums (for --stages overhead)")
    sp.add_argument("--prefill-max-rep", type=int, default=None,
                    help="most timed replays per prefill attention point (default: --max-rep)")
    sp.add_argument("--calib-batches", default=None,
                    help=f"comma list: overhead calibration batches to measure (default {CALIB_BATCHES})")
    sp.add_argument("--weights", choices=PACK_WEIGHTS, default="bf16",
                    help="weight format of the projection GEMMs (fp8: e4m3 per-tensor, calibration/variants.py)")
    sp.add_argument("--attention-from", default=None,
                    help="packs/<gpu> folder of bf16 packs whose attention rows (and SDPA choice) to "
                         "reuse instead of measuring attention (for --weights fp8)")
    add_grid_args(sp)
    common(sp)
    sp = sub.add_parser("iterations", help="whole-forward validation data for one model (TP 1, or --tp N)")
    sp.add_argument("--model", required=True, choices=models)
    sp.add_argument("--weights", choices=PACK_WEIGHTS, default="bf16",
                    help="weight format of the projection GEMMs (as the pack's ops run)")
    sp.add_argument("--max-compositions", type=int, default=None)
    sp.add_argument("--every", type=int, default=1,
                    help="measure every k-th composition only (a stratified subset, e.g. for "
                         "run-to-run noise checks)")
    sp.add_argument("--share-layer-weights", action="store_true",
                    help="one set of layer weights for all layers (small GPUs)")
    sp.add_argument("--tp", type=int, default=1,
                    help="TP degree: > 1 runs one process per GPU with NCCL all-reduces "
                         "(validation/<gpu>/<model>-tp<N>.csv)")
    sp.add_argument("--backends-from", default=None,
                    help="folder of packs whose YAML (sdpa.choice) gives each attention call's "
                         "backend, so the forwards run what the op tables timed")
    sp.add_argument("--eager-every", type=int, default=1,
                    help="measure eager forwards for every k-th composition only (graph: all)")
    sp.add_argument("--fwd-max-rep", type=int, default=None, help="most timed forwards per mode (15)")
    sp.add_argument("--fwd-budget-ms", type=float, default=None,
                    help="GPU time spent on one composition's timed forwards per mode (400)")
    common(sp)
    sp = sub.add_parser("survey", help="op surveys: GEMM formats, MoE, fp8-KV and MLA decode attention")
    common(sp)
    sp.add_argument("--which", default=None, help="comma list of surveys (default all): gemm, moe, decode_kv, mla")
    sp.add_argument("--max-rep", type=int, default=None, help="most timed replays per point (10)")

    sp = sub.add_parser("allreduce", help="NCCL all_reduce over N GPUs and send_recv between 2")
    sp.add_argument("--gpus", type=int, default=2)
    sp.add_argument("--eager-collectives", action="store_true",
                    help="time eager calls only (no CUDA-graph capture of the collectives)")
    common(sp)
    sp = sub.add_parser("all", help="collectives, then ops and iterations for several models")
    add_grid_args(sp)
    sp.add_argument("--models", default=",".join(SHAPES))
    sp.add_argument("--tps", default="1,2")
    sp.add_argument("--iter-models", default=None, help="models for iterations (default: --models; '' none)")
    sp.add_argument("--workers", type=int, default=0, help="parallel tasks (default: one per GPU)")
    sp.add_argument("--skip-allreduce", action="store_true")
    common(sp)
    sp = sub.add_parser("backends", help="time a few attention shapes on each SDPA backend")
    sp.add_argument("--model", required=True, choices=models)
    sp.add_argument("--tp", type=int, default=1)
    common(sp)
    sp = sub.add_parser("merge", help="merge collectives/<gpu>/*.csv into the packs under --out")
    sp.add_argument("--out", required=True)
    sp = sub.add_parser("combine", help="keep some ops' rows from older packs; median overheads "
                                        "over several processes (no GPU needed)")
    sp.add_argument("--out", required=True, help="folder whose packs/<gpu>/*.csv are rewritten")
    sp.add_argument("--keep-from", default=None, help="folder of older packs (same file names)")
    sp.add_argument("--keep-ops", default=None, help="comma list of ops whose rows to keep from them")
    sp.add_argument("--replace-from", default=None,
                    help="folder of newer packs (same file names) whose --replace-ops rows replace these")
    sp.add_argument("--replace-ops", default=None, help="comma list of ops to take from --replace-from")
    sp.add_argument("--overheads-from", default=None,
                    help="comma list of --out folders of `ops --stages overhead --tables-from` runs")
    sp.add_argument("--note", default=None, help="provenance text stored in each YAML (combined.note)")
    sp.add_argument("--add-from", default=None, help="folder of packs whose rows at new points to append")
    sp.add_argument("--add-ops", default=None, help="comma list: only these ops' rows (default all but overheads)")
    sp.add_argument("--add-alias", default=None,
                    help="comma list target:source, e.g. qwen3-4b:qwen3-8b (source pack for a target)")
    args = p.parse_args(argv)
    try:
        return {"ops": cmd_ops, "iterations": cmd_iterations, "survey": cmd_survey, "allreduce": cmd_allreduce,
                "all": cmd_all, "merge": cmd_merge, "backends": cmd_backends,
                "combine": cmd_combine}[args.mode](args)
    except SystemExit:
        raise
    except Exception:
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    sys.exit(main())
