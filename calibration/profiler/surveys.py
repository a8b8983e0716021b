"""Surveys: op timings over precisions, expert counts and long contexts that no pack holds yet.

Why: a pack times one model's ops in one format. Planning questions reach further (is INT4 worth
it at batch 64? what does an fp8 KV cache save at 64K context? how does a 256-expert layer scale
with tokens per expert? what does MLA decode cost?), and servesim's derivation and roofline rules
for such cases need measured curves to be checked against. Each survey writes one long-format CSV
(``SURVEY_COLUMNS``) and a YAML beside it with the backends that ran and their accuracy against a
float64 reference. Run on the GPU machine by ``profile_gpu.py survey`` (mode_misc.py); the timing itself is
timing.py's ``Timer`` (graph replay, median of repeats).
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from .triton_decode import TritonDecode, decode_reference, triton
from .variants import FP8, WEIGHT_FORMATS, MoE, MoEShape, QLinear, rel_err

SURVEY_COLUMNS = ("survey", "variant", "tokens", "batch", "context", "n", "k", "experts", "top_k",
                  "inter", "time_ms", "std_ms", "backend")
SURVEYS = ("gemm", "moe", "decode_kv", "mla")

#: (name, out_features, in_features): llama-3-8b's projections at TP1 (qkv, gate_up, down)
GEMM_SHAPES = [("qkv", 6144, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)]
GEMM_TOKENS = [1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
#: (name, experts, top_k, per-expert intermediate, hidden): public configs at TP1
#: (the two with published single-GPU figures first, so that a budget cut drops the others)
MOE_CONFIGS = [("qwen3-30b-a3b", 128, 8, 768, 2048),
               ("deepseek-v2-lite", 64, 6, 1408, 2048),  # routed experts only (shared ones are dense)
               ("mixtral-8x7b", 8, 2, 14336, 4096), ("gpt-oss-120b", 128, 4, 2880, 2880),
               ("deepseek-v3", 256, 8, 2048, 7168)]
MOE_TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
#: the experts' backends a survey times (variants.MOE_BACKENDS; loop only where neither runs)
MOE_SURVEY_BACKENDS = ("triton-fused", "grouped_mm")
DECODE_BATCH = [1, 8, 32, 64, 128, 256, 512]
DECODE_CTX = [1024, 4096, 16384, 32768, 65536, 131072]
#: MLA (DeepSeek-V3): 128 query heads at TP1, 16 at TP8; one latent KV head of 512 + 64 rope dims
MLA_HEADS = [128, 16]
QUICK = dict(gemm_tokens=[1, 64, 512], moe_tokens=[4, 16], batch=[1, 8], ctx=[256, 1024],
             gemm_shapes=[("tiny", 256, 128)], moe_configs=[("tiny", 8, 2, 64, 128)],
             mla_heads=[16])


def _row(survey, variant, tokens=0, batch=0, context=0, n=0, k=0, experts=0, top_k=0, inter=0, m=None,
         backend=""):
    """One CSV row; ``backend``: the MoE survey's experts backend (variants.MOE_BACKENDS), empty
    elsewhere (there the variant names the kernel)."""
    return (survey, variant, tokens, batch, context, n, k, experts, top_k, inter,
            round(m.median_ms, 6), round(m.std_ms, 6), backend)


class Survey:
    """Runs the surveys with ``timer.measure(fns, label)`` (timing.Timer) on ``device``."""

    def __init__(self, timer, device, quick: bool = False, kv_cap_bytes: int = 32 << 30,
                 log: Callable[[str], None] = print):
        self.timer = timer
        self.device = device
        self.quick = quick
        self.kv_cap = kv_cap_bytes
        self.log = log
        self.rows: list[tuple] = []
        self.meta: dict = {}
        self.skipped: list[str] = []
        self.gen = torch.Generator(device=device).manual_seed(0)

    def rnd(self, *shape, scale: float = 1.0, dtype=torch.bfloat16):
        return (torch.randn(*shape, generator=self.gen, device=self.device, dtype=torch.float32)
                * scale).to(dtype)

    def _time(self, fns, label: str):
        try:
            return self.timer.measure(fns, label)
        except torch.cuda.OutOfMemoryError:
            self.skipped.append(f"{label}: out of memory")
        except Exception as exc:
            if type(exc).__name__ == "BudgetExceeded":
                raise
            self.skipped.append(f"{label}: {type(exc).__name__}: {str(exc).splitlines()[0][:140] if str(exc) else ''}")
        self.log(f"  SKIP {self.skipped[-1]}")
        return None

    def _free(self):
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # --- GEMMs in every weight format -------------------------------------------------------
    def gemm(self) -> None:
        shapes = QUICK["gemm_shapes"] if self.quick else GEMM_SHAPES
        tokens = QUICK["gemm_tokens"] if self.quick else GEMM_TOKENS
        backends, errors = {}, {}
        for name, n, k in shapes:
            w = self.rnd(n, k, scale=k ** -0.5)
            for fmt in WEIGHT_FORMATS:
                try:
                    lin = QLinear(w, fmt)
                    x = self.rnd(64, k)
                    errors[f"{name} {fmt}"] = round(rel_err(lin(x), x.double() @ lin.dequantized().double().t()), 5)
                except Exception as exc:
                    self.skipped.append(f"gemm {name} {fmt}: {type(exc).__name__}: {str(exc)[:140]}")
                    self.log(f"  SKIP {self.skipped[-1]}")
                    continue
                backends[fmt] = lin.backend
                for T in tokens:
                    self.timer.budget.check()
                    x = lin.prepare(self.rnd(T, k))  # fp8_static: quantized upstream, untimed
                    m = self._time([lambda: lin(x)], f"gemm {name} {fmt} tokens={T}")
                    if m is not None:
                        self.rows.append(_row("gemm", fmt, tokens=T, n=n, k=k, m=m))
                        self.log(f"  gemm {name} {n}x{k} {fmt} T={T}: {m.median_ms:.4f} ms")
                del lin
                self._free()
            del w
        self.meta["gemm"] = dict(shapes=shapes, backends=backends,
                                 rel_err_vs_dequantized_float64=errors,
                                 note="time includes the activation's quantization (fp8, fp8_channel, "
                                      "int8), as engines run it per call; fp8_static's input is quantized "
                                      "before the timed call (engines fuse it upstream); int4 is "
                                      "weight-only (bf16 activations)")

    # --- MoE layers over expert counts and tokens per expert, on every experts backend ----------
    def moe(self) -> None:
        """gate, experts, combine rows per (config, tokens, backend): the same weights and routing
        for every backend; the log gives the experts' achieved bandwidth on the weights of the
        experts hit (``weight_gbps`` in the YAML)."""
        configs = QUICK["moe_configs"] if self.quick else MOE_CONFIGS
        tokens = QUICK["moe_tokens"] if self.quick else MOE_TOKENS
        backends, errors, gbps, unavailable = {}, {}, {}, {}
        for name, E, K, inter, h in configs:
            try:
                moe = MoE(MoEShape(E, K, inter, h), self.device, self.gen, backend="loop")
            except torch.cuda.OutOfMemoryError:
                self.skipped.append(f"moe {name}: out of memory")
                continue
            kinds = [b for b in MOE_SURVEY_BACKENDS if moe.available(b)] or ["loop"]
            unavailable.update({f"{name} {b}": moe.failed[b] for b in MOE_SURVEY_BACKENDS if b in moe.failed})
            x = self.rnd(4, h)
            ref = moe.reference(x)
            for kind in kinds:
                moe.use(kind)
                backends[f"{name} {kind}"] = moe.backend
                errors[f"{name} {kind}"] = round(rel_err(moe(x), ref), 5)
            for T in tokens:
                self.timer.budget.check()
                x = self.rnd(T, h)
                w, idx = moe.gate(x)
                wbytes = int(torch.unique(idx).numel()) * 3 * inter * h * 2
                for kind in kinds:
                    moe.use(kind)
                    lab = f"moe {name} {kind} T={T}"
                    m = self._time([lambda: moe.gate(x)], f"{lab} gate")
                    if m is not None:
                        self.rows.append(_row("moe", "gate", tokens=T, k=h, experts=E, top_k=K, inter=inter, m=m,
                                              backend=kind))
                    y, order = moe.experts(x, idx, w)  # eager first: the fused kernel tunes its tiles here
                    m = self._time([lambda: moe.experts(x, idx, w)], f"{lab} experts")
                    if m is not None:
                        self.rows.append(_row("moe", "experts", tokens=T, k=h, experts=E, top_k=K, inter=inter,
                                              m=m, backend=kind))
                        bw = wbytes / (m.median_ms * 1e6)
                        gbps.setdefault(name, {}).setdefault(kind, {})[T] = round(bw, 1)
                        self.log(f"  moe {name} T={T} ({T * K / E:.2f} tokens/expert) {kind}: experts "
                                 f"{m.median_ms:.4f} ms, {bw:.0f} GB/s of hit experts' weights")
                    m = self._time([lambda: moe.combine(y, order, w, T)], f"{lab} combine")
                    if m is not None:
                        self.rows.append(_row("moe", "combine", tokens=T, k=h, experts=E, top_k=K, inter=inter,
                                              m=m, backend=kind))
                    del y, order
                del x, w, idx
            del moe
            self._free()
        from .triton_moe import FusedMoE
        self.meta["moe"] = dict(
            configs=configs, backends=backends, unavailable=unavailable, rel_err_vs_float64=errors,
            routing="uniform (random router weights)",
            columns=("backend: the experts' kernels (triton-fused: our fused Triton kernel, "
                     "calibration/profiler/triton_moe.py; grouped_mm: torch._grouped_mm after a sort by "
                     "expert). Per backend the three ops split the layer differently: triton-fused's experts "
                     "include the routing-weight multiply (combine = sum over k), grouped_mm's combine is the "
                     "weighted index_add; gate is the same code for both"),
            weight_gbps=gbps, tile_configs=FusedMoE.tuned_configs(),
            weight_gbps_means=("bytes of the distinct experts hit by the call (3 I h bf16 each) / experts time; "
                               "activations not counted"))

    # --- decode attention over bf16 and fp8 KV, to long contexts --------------------------------
    def _decode_points(self, bytes_per_token: int, batches, ctxs):
        return [(b, c) for b in batches for c in ctxs if b * (c + 1) * bytes_per_token <= self.kv_cap]

    def decode_kv(self, H: int = 32, KVH: int = 8, D: int = 128) -> None:
        if triton is None:
            self.skipped.append("decode_kv: Triton not installed")
            return
        batches = QUICK["batch"] if self.quick else DECODE_BATCH
        ctxs = QUICK["ctx"] if self.quick else DECODE_CTX
        kern = TritonDecode(H, KVH, D, D, sms=self._sms())
        errors = self._decode_errors(kern, H, KVH, D, 0, D)
        self.meta["decode_kv"] = dict(heads=H, kv_heads=KVH, head_dim=D, backend=kern.backend,
                                      sdpa="torch SDPA (bf16 only; the fastest enabled backend)",
                                      rel_err_vs_float64=errors,
                                      layout="sequence-major contiguous cache, equal context per sequence")
        for B, ctx in self._decode_points(2 * KVH * D * 2, batches, ctxs):
            self.timer.budget.check()
            L = ctx + 1
            try:
                q = self.rnd(B, H, D)
                out = torch.empty(B, H, D, device=self.device, dtype=torch.bfloat16)
                k = self.rnd(B * L, KVH, D)
                v = self.rnd(B * L, KVH, D)
            except torch.cuda.OutOfMemoryError:
                self.skipped.append(f"decode_kv B={B} ctx={ctx}: out of memory")
                self._free()
                continue
            qs = q.unsqueeze(2)
            ks = k.view(B, L, KVH, D).transpose(1, 2)
            vs = v.view(B, L, KVH, D).transpose(1, 2)
            fns = {"sdpa-bf16": lambda: torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True),
                   "triton-bf16": lambda: kern(q, k, v, out, B, L)}
            for variant, fn in fns.items():
                m = self._time([fn], f"decode_kv {variant} B={B} ctx={ctx}")
                if m is not None:
                    self.rows.append(_row("decode_kv", variant, batch=B, context=ctx, n=H, k=D, m=m))
            del qs, ks, vs, fns
            k8, v8 = k.to(FP8), v.to(FP8)
            del k, v
            m = self._time([lambda: kern(q, k8, v8, out, B, L, 1.0, 1.0)], f"decode_kv triton-fp8 B={B} ctx={ctx}")
            if m is not None:
                self.rows.append(_row("decode_kv", "triton-fp8", batch=B, context=ctx, n=H, k=D, m=m))
            self.log(f"  decode_kv B={B} ctx={ctx}: " + ", ".join(
                f"{r[1]} {r[10]:.4f}" for r in self.rows[-3:] if r[3] == B and r[4] == ctx))
            del q, out, k8, v8
            self._free()

    def _sms(self) -> int:
        if self.device.type == "cuda":
            return torch.cuda.get_device_properties(self.device).multi_processor_count
        return 4

    def _decode_errors(self, kern: "TritonDecode", H, KVH, D, DPE, DV) -> dict:
        """Relative error of the kernel in bf16 and fp8 against float64 at one small point."""
        B, L = 3, 300
        q = self.rnd(B, H, D + DPE)
        k = self.rnd(B * L, KVH, D + DPE)
        v = k[..., :DV] if DPE else self.rnd(B * L, KVH, DV)
        out = torch.empty(B, H, DV, device=self.device, dtype=torch.bfloat16)
        errs = {}
        try:
            errs["bf16"] = round(rel_err(kern(q, k, v, out, B, L), decode_reference(q, k, v, B, L, D, DPE)), 5)
            k8 = k.to(FP8)
            v8 = k8[..., :DV] if DPE else v.to(FP8)
            errs["fp8 vs its own dequantized cache"] = round(rel_err(
                kern(q, k8, v8, out, B, L), decode_reference(q, k8.to(torch.bfloat16), v8.to(torch.bfloat16),
                                                             B, L, D, DPE)), 5)
            errs["fp8 vs the bf16 cache"] = round(rel_err(out, decode_reference(q, k, v, B, L, D, DPE)), 5)
        except Exception as exc:
            errs["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
        self.log(f"  decode kernel accuracy H={H} KVH={KVH} D={D}+{DPE}: {errs}")
        return errs

    # --- MLA decode (weight-absorbed: one latent KV head, values = its first 512 dims) ------------
    def mla(self, latent: int = 512, rope: int = 64) -> None:
        if triton is None:
            self.skipped.append("mla: Triton not installed")
            return
        batches = QUICK["batch"] if self.quick else DECODE_BATCH
        ctxs = QUICK["ctx"] if self.quick else DECODE_CTX
        heads = QUICK["mla_heads"] if self.quick else MLA_HEADS
        D = 64 if self.quick else latent
        P = 16 if self.quick else rope
        meta = {}
        for H in heads:
            kern = TritonDecode(H, 1, D, D, DPE=P, sms=self._sms())
            meta[f"heads {H}"] = dict(backend=kern.backend + f"; latent {D} + rope {P}, values = latent",
                                      rel_err_vs_float64=self._decode_errors(kern, H, 1, D, P, D))
            for B, ctx in self._decode_points((D + P) * 2, batches, ctxs):
                self.timer.budget.check()
                L = ctx + 1
                try:
                    q = self.rnd(B, H, D + P)
                    kv = self.rnd(B * L, 1, D + P)
                    out = torch.empty(B, H, D, device=self.device, dtype=torch.bfloat16)
                except torch.cuda.OutOfMemoryError:
                    self.skipped.append(f"mla H={H} B={B} ctx={ctx}: out of memory")
                    self._free()
                    continue
                m = self._time([lambda: kern(q, kv, kv[..., :D], out, B, L)], f"mla bf16 H={H} B={B} ctx={ctx}")
                if m is not None:
                    self.rows.append(_row("mla", "triton-bf16", batch=B, context=ctx, n=H, k=D + P, m=m))
                kv8 = kv.to(FP8)
                del kv
                m8 = self._time([lambda: kern(q, kv8, kv8[..., :D], out, B, L)], f"mla fp8 H={H} B={B} ctx={ctx}")
                if m8 is not None:
                    self.rows.append(_row("mla", "triton-fp8", batch=B, context=ctx, n=H, k=D + P, m=m8))
                self.log(f"  mla H={H} B={B} ctx={ctx}: bf16 {m.median_ms if m else float('nan'):.4f} ms, "
                         f"fp8 {m8.median_ms if m8 else float('nan'):.4f} ms")
                del q, kv8, out
                self._free()
        self.meta["mla"] = meta

    def run(self, which) -> None:
        for name in which:
            t0 = time.time()
            self.log(f"survey {name}")
            try:
                getattr(self, name)()
            except Exception as exc:
                if type(exc).__name__ == "BudgetExceeded":
                    self.skipped.append(f"{name}: time budget ran out partway")
                    self.log(f"  time budget ran out in survey {name}")
                    break
                self.skipped.append(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
                self.log(f"  FAILED survey {name}: {self.skipped[-1]}")
            self.meta.setdefault("seconds", {})[name] = round(time.time() - t0, 1)
