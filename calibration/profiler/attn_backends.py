"""Attention kernels as a serving engine selects them: every SDPA backend that computes the right
result is timed, and each attention op keeps the fastest.

Why: the first H200 packs forced PyTorch's flash backend (FlashAttention-2) for every attention
call. On Hopper that reads a large decode batch's KV at 2.2-2.7 TB/s, while PyTorch's cuDNN backend
reads the same KV at 4.1-4.3 TB/s (86-90% of the 4.8 TB/s peak) -- the class of kernel vLLM and
SGLang run there (FlashAttention-3, FlashInfer). An engine picks its attention kernel per GPU and
often per shape; a pack that times one slow kernel overpredicts every long decode.

How (per attention shape, i.e. per (q heads, kv heads, head dim) of a TP rank):

1. **Check.** Each backend (flash, cuDNN, memory-efficient, math) computes small decode,
   causal-prefill and cached-context-prefill cases laid out exactly as the op functions lay them
   out; it is a candidate for an op kind only if its result is within 2e-2 (relative norm) of a
   float64 reference. Nothing falls back silently: every call runs with exactly one backend
   enabled (:func:`only`), so a call the backend cannot serve raises.
2. **Survey.** Every candidate is timed on a coarse lattice of each kind (``SURVEY``). If one
   backend is within ``STABLE_TOL`` of the fastest at every survey point, it is the kind's backend
   ("per op": the choice is stable). Otherwise the choice is made per point.
3. **Dense grid.** At each point of the pack's grid the *contenders* are the backends within
   ``CONTEND_TOL`` of the fastest at the ``NEAREST`` nearest survey points (log distance); each
   contender is timed and the fastest is kept. Far from a crossover that is one backend; near one,
   both sides are measured, so the grid point keeps the faster measurement -- and at a crossover
   the two are nearly equal anyway, so a survey too coarse to place it exactly costs little.
   Timing every candidate at every dense point would triple the attention device time.
4. **Forwards make the same choice.** :class:`BackendChooser` (stored in the pack YAML) gives the
   backend of any attention call: the kind's backend, or that of the nearest dense grid point.
   Whole-iteration validation forwards and the overhead calibration forwards switch backends per
   call with it (:class:`BackendSwitch`), so what they run is what the tables timed.

Standalone (only PyTorch), like the whole profiler package: the GPU machines have no servesim.
"""

from __future__ import annotations

import contextlib
import math
from typing import Optional

import torch
import torch.nn.functional as F

try:  # bottom-right causal mask for a prefill chunk over cached context (torch >= 2.2)
    from torch.nn.attention.bias import causal_lower_right
except Exception:  # pragma: no cover - old torch
    causal_lower_right = None

#: every PyTorch SDPA backend, in the order tried
BACKENDS = ("flash", "cudnn", "efficient", "math")
BACKEND_NAMES = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                 "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}
#: attention op kinds: one decode batch; a chunk with no cached context (is_causal); a chunk over
#: cached context (bottom-right causal). A backend may serve some and not others.
KINDS = ("decode", "prefill_causal", "prefill_context")
CHECK_TOL = 2e-2
#: a backend within this of the fastest at every survey point of a kind is the kind's backend
STABLE_TOL = 0.05
#: a backend within this of the fastest at a nearby survey point is timed at a dense point
CONTEND_TOL = 0.10
#: survey points that decide a dense point's contenders
NEAREST = 4
#: largest materialized tensor (bytes) the math backend may need at a survey point (it expands
#: GQA heads and materializes the score matrix; beyond this it is skipped as out of reach)
MATH_BYTES_CAP = 4 << 30

#: survey lattices: (first key = batch for decode, chunk tokens for prefill; context)
SURVEY = {
    "decode": dict(a=[1, 4, 16, 32, 64, 128, 256, 512], ctx=[128, 1024, 4096, 16384]),
    "prefill_causal": dict(a=[16, 64, 256, 512, 1024, 2048, 4096, 8192], ctx=[0]),
    "prefill_context": dict(a=[16, 64, 256, 1024, 2048, 4096], ctx=[512, 2048, 8192, 24576]),
}
QUICK_SURVEY = {
    "decode": dict(a=[1, 8, 32], ctx=[128, 1024]),
    "prefill_causal": dict(a=[16, 256, 1024], ctx=[0]),
    "prefill_context": dict(a=[16, 256], ctx=[512, 1024]),
}


def kind_of(op: str, context: int) -> str:
    """Attention op kind of a pack row: ``attn_decode``, or ``attn_prefill`` with / without context."""
    if op == "attn_decode":
        return "decode"
    return "prefill_context" if context > 0 else "prefill_causal"


# ============================================================================== enabling one backend
def _flags() -> tuple:
    b = torch.backends.cuda
    return (b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.math_sdp_enabled(),
            b.cudnn_sdp_enabled() if hasattr(b, "cudnn_sdp_enabled") else False)


def _set_flags(flash: bool, efficient: bool, math_: bool, cudnn: bool) -> None:
    b = torch.backends.cuda
    b.enable_flash_sdp(flash)
    b.enable_mem_efficient_sdp(efficient)
    b.enable_math_sdp(math_)
    if hasattr(b, "enable_cudnn_sdp"):
        b.enable_cudnn_sdp(cudnn)


def set_only(name: str) -> None:
    """Enable exactly one SDPA backend (the flags are global: CPU and CUDA)."""
    if name not in BACKENDS:
        raise ValueError(f"unknown SDPA backend {name!r}; known: {BACKENDS}")
    _set_flags(name == "flash", name == "efficient", name == "math", name == "cudnn")


@contextlib.contextmanager
def only(name: Optional[str]):
    """Run the body with exactly backend ``name`` enabled (``None``: leave the flags alone)."""
    if name is None:
        yield
        return
    saved = _flags()
    set_only(name)
    try:
        yield
    finally:
        _set_flags(*saved)


class BackendSwitch:
    """Per-call backend switching inside one forward: ``use(name)`` changes the flags only when the
    backend changes (a forward whose calls share one backend sets them once); the flags are restored
    when the ``with`` block ends. Under CUDA-graph capture the dispatch happens at capture time, so
    the graph replays the kernels of the backends in force then."""

    def __enter__(self) -> "BackendSwitch":
        self._saved = _flags()
        self._current: Optional[str] = None
        return self

    def use(self, name: Optional[str]) -> None:
        if name is not None and name != self._current:
            set_only(name)
            self._current = name

    def __exit__(self, *exc) -> None:
        _set_flags(*self._saved)


# ============================================================================== the calls
class Sdpa:
    """The attention calls, their float64 reference, and which backends pass the check per kind."""

    def __init__(self, device: torch.device):
        self.device = device
        #: backend -> kind -> relative error vs float64, or the reason it failed
        self.checks: dict[str, dict[str, object]] = {}
        #: kind -> passing backends, in BACKENDS order
        self.passing: dict[str, list[str]] = {k: [] for k in KINDS}
        #: backend -> kind -> CUDA kernels launched (proof of what ran)
        self.kernels: dict[str, dict[str, list[str]]] = {}
        self.mode = "auto"

    # --- the calls ---------------------------------------------------------------------------
    @staticmethod
    def prefill(q, k, v):
        """q [1,H,Tq,D], k/v [1,KVH,Tk,D] with Tk >= Tq: causal, bottom-right aligned."""
        tq, tk = q.shape[-2], k.shape[-2]
        if tq == tk:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(tq, tk),
                                              enable_gqa=True)

    @staticmethod
    def decode(q, k, v):
        """q [B,H,1,D], k/v [B,KVH,ctx+1,D]: one query sees every key, no mask needed."""
        return F.scaled_dot_product_attention(q, k, v, is_causal=False, enable_gqa=True)

    @staticmethod
    def reference(q, k, v):
        """float64 attention with explicit GQA expansion and a bottom-right causal mask."""
        qd, kd, vd = q.double(), k.double(), v.double()
        rep = q.shape[1] // k.shape[1]
        kd = kd.repeat_interleave(rep, dim=1)
        vd = vd.repeat_interleave(rep, dim=1)
        tq, tk = q.shape[-2], k.shape[-2]
        s = (qd @ kd.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        qi = torch.arange(tq, device=q.device)[:, None]
        ki = torch.arange(tk, device=q.device)[None, :]
        s = s.masked_fill(ki > qi + (tk - tq), float("-inf"))
        return torch.softmax(s, dim=-1) @ vd

    def cases(self, H: int, KVH: int, D: int):
        """Small inputs laid out exactly as the op functions lay them out (strided views)."""
        g = torch.Generator(device=self.device).manual_seed(1234)

        def r(*shape):
            return torch.randn(*shape, generator=g, device=self.device, dtype=torch.bfloat16)
        B, L = 3, 51
        qk = r(B, H + KVH, D)
        kc, vc = r(B * L, KVH, D), r(B * L, KVH, D)
        q = qk[:, :H].unsqueeze(2)
        k = kc.view(B, L, KVH, D).transpose(1, 2)
        v = vc.view(B, L, KVH, D).transpose(1, 2)
        yield "decode", (q, k, v), self.decode
        for name, tq, ctx in (("prefill_causal", 40, 0), ("prefill_context", 48, 80)):
            qk = r(tq, H + KVH, D)
            kc, vc = r(ctx + tq, KVH, D), r(ctx + tq, KVH, D)
            q = qk[:, :H].unsqueeze(0).transpose(1, 2)
            yield name, (q, kc.unsqueeze(0).transpose(1, 2), vc.unsqueeze(0).transpose(1, 2)), self.prefill

    # --- which backends compute the right thing ---------------------------------------------
    def check(self, H: int, KVH: int, D: int, prefer: str = "auto") -> dict[str, list[str]]:
        """Run every case on every backend (``prefer``: one backend only, forced) against float64."""
        from torch.nn.attention import SDPBackend

        self.mode = "auto" if prefer == "auto" else f"forced {prefer}"
        order = BACKENDS if prefer == "auto" else (prefer,)
        self.checks, self.passing = {}, {k: [] for k in KINDS}
        for name in order:
            res: dict[str, object] = {}
            self.checks[name] = res
            if getattr(SDPBackend, BACKEND_NAMES[name], None) is None:
                for kind in KINDS:
                    res[kind] = "not in this torch"
                continue
            for kind, (q, k, v), fn in self.cases(H, KVH, D):
                try:
                    with only(name):
                        out = fn(q, k, v).double()
                    ref = self.reference(q, k, v)
                    rel = float((out - ref).norm() / ref.norm())
                    if not math.isfinite(rel) or rel > CHECK_TOL:
                        res[kind] = f"relative error {rel:.3g} vs float64 reference"
                        continue
                    res[kind] = round(rel, 6)
                    self.passing[kind].append(name)
                except Exception as exc:
                    res[kind] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
        lacking = [k for k in KINDS if not self.passing[k]]
        if lacking:
            raise SystemExit(f"no SDPA backend passed the float64 check for {lacking}: {self.checks}")
        return self.passing

    def record_kernels(self, H: int, KVH: int, D: int) -> None:
        """Name the CUDA kernels each passing backend launches per kind (proof of what ran)."""
        if self.device.type != "cuda":
            return
        try:
            from torch.profiler import ProfilerActivity, profile
            for kind, (q, k, v), fn in self.cases(H, KVH, D):
                for name in self.passing[kind]:
                    with only(name):
                        fn(q, k, v)
                        torch.cuda.synchronize()
                        with profile(activities=[ProfilerActivity.CUDA]) as prof:
                            fn(q, k, v)
                            torch.cuda.synchronize()
                    names = sorted({e.name for e in prof.events()
                                    if "CUDA" in str(getattr(e, "device_type", ""))})
                    self.kernels.setdefault(name, {})[kind] = [n[:160] for n in names][:6]
        except Exception as exc:  # informative only
            self.kernels["error"] = {"all": [f"{type(exc).__name__}: {exc}"[:200]]}


# ============================================================================== choosing
def _log_point(kind: str, a: float, ctx: float) -> tuple[float, float]:
    return (math.log2(max(a, 1)), math.log2(ctx + 1) if kind != "prefill_causal" else 0.0)


def _nearest(kind: str, points: list, a: float, ctx: float, n: int) -> list[int]:
    pa, pc = _log_point(kind, a, ctx)
    d = []
    for i, (x, c) in enumerate(points):
        qa, qc = _log_point(kind, x, c)
        d.append(((qa - pa) ** 2 + (qc - pc) ** 2, i))
    return [i for _, i in sorted(d)[:n]]


class KindSurvey:
    """Every candidate backend's time at the survey points of one kind, and what follows from it:
    the stable backend (if any) and the contenders at any other point."""

    def __init__(self, kind: str, points: list, ms: dict[str, list]):
        self.kind, self.points, self.ms = kind, [tuple(p) for p in points], ms
        self.best = []
        for i in range(len(self.points)):
            got = [v[i] for v in ms.values() if v[i] is not None]
            self.best.append(min(got) if got else None)
        self.stable = self._stable()

    def _stable(self) -> Optional[str]:
        ok = []
        for b, times in self.ms.items():
            pairs = [(t, best) for t, best in zip(times, self.best) if best is not None]
            if pairs and all(t is not None and t <= (1 + STABLE_TOL) * best for t, best in pairs):
                ok.append((sum(t for t, _ in pairs), b))
        return min(ok)[1] if ok else None

    def winners_at_survey(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for i, best in enumerate(self.best):
            if best is None:
                continue
            b = min((v[i], b) for b, v in self.ms.items() if v[i] is not None)[1]
            out[b] = out.get(b, 0) + 1
        return out

    def contenders(self, a: float, ctx: float) -> list[str]:
        if self.stable is not None:
            return [self.stable]
        near = [i for i in _nearest(self.kind, self.points, a, ctx, len(self.points))
                if self.best[i] is not None][:NEAREST]
        out = []
        for i in near:
            for b, v in self.ms.items():
                if v[i] is not None and v[i] <= (1 + CONTEND_TOL) * self.best[i] and b not in out:
                    out.append(b)
        return [b for b in BACKENDS if b in out]

    def to_meta(self) -> dict:
        return dict(points=[list(p) for p in self.points],
                    ms={b: [None if t is None else round(t, 6) for t in v] for b, v in self.ms.items()},
                    stable=self.stable, fastest_at=self.winners_at_survey(),
                    rule=(f"stable: {self.stable} within {STABLE_TOL:.0%} of the fastest at every point"
                          if self.stable else
                          f"per point: contenders = backends within {CONTEND_TOL:.0%} of the fastest "
                          f"at the {NEAREST} nearest survey points"))


class BackendChooser:
    """Which backend runs an attention call of kind ``kind`` at (``a``, ``ctx``) (``a`` = decode
    batch or prefill chunk tokens): the kind's backend, or that of the nearest measured grid point.
    Stored in the pack YAML (``sdpa.choice``) so that later processes (overhead forwards, whole
    iterations) make the same choice as the op tables."""

    def __init__(self, per_kind: dict[str, dict]):
        self.per_kind = per_kind

    @classmethod
    def constant(cls, passing: dict[str, list[str]]) -> "BackendChooser":
        return cls({k: dict(rule="per op", backend=v[0]) for k, v in passing.items() if v})

    @classmethod
    def from_winners(cls, winners: dict[str, dict], fallback: dict[str, str]) -> "BackendChooser":
        """``winners[kind][(a, ctx)] = backend`` measured on the grid; one backend -> per op."""
        per: dict[str, dict] = {}
        for kind in KINDS:
            w = winners.get(kind) or {}
            used = sorted(set(w.values()))
            if not w:
                if kind in fallback:
                    per[kind] = dict(rule="per op", backend=fallback[kind])
                continue
            if len(used) == 1:
                per[kind] = dict(rule="per op", backend=used[0], points=len(w))
                continue
            counts = {b: sum(1 for x in w.values() if x == b) for b in used}
            per[kind] = dict(rule="per point", backend=max(counts, key=counts.get), counts=counts,
                             points=[[int(a), int(c), b] for (a, c), b in sorted(w.items())])
        return cls(per)

    @classmethod
    def from_meta(cls, meta: dict) -> Optional["BackendChooser"]:
        """From a pack YAML: ``sdpa.choice`` (this module), or the single ``sdpa_backend`` of packs
        made before per-op selection; None if neither is there."""
        sd = meta.get("sdpa") if isinstance(meta, dict) else None
        if isinstance(sd, dict) and isinstance(sd.get("choice"), dict):
            return cls(sd["choice"])
        b = meta.get("sdpa_backend") if isinstance(meta, dict) else None
        if isinstance(b, str) and b in BACKENDS:
            return cls({k: dict(rule="per op", backend=b) for k in KINDS})
        return None

    def pick(self, kind: str, a: float, ctx: float) -> Optional[str]:
        c = self.per_kind.get(kind)
        if c is None:
            return None
        if c.get("rule") != "per point":
            return c["backend"]
        pts = c["points"]
        i = _nearest(kind, [(p[0], p[1]) for p in pts], a, ctx, 1)[0]
        return pts[i][2]

    def summary(self) -> str:
        parts = []
        for kind in KINDS:
            c = self.per_kind.get(kind)
            if c is None:
                continue
            if c.get("rule") == "per point":
                parts.append(f"{kind}: per point {c.get('counts')}")
            else:
                parts.append(f"{kind}: {c['backend']}")
        return "; ".join(parts)

    def to_meta(self) -> dict:
        return self.per_kind


def math_fits(kind: str, H: int, KVH: int, D: int, a: int, ctx: int) -> bool:
    """The math backend expands K/V to every q head and materializes the scores: skip points where
    that needs more than MATH_BYTES_CAP (it is 10-60x slower than the fused kernels anyway)."""
    if kind == "decode":
        need = 2 * a * H * (ctx + 1) * D * 2 + a * H * (ctx + 1) * 4
    else:
        need = 2 * H * (ctx + a) * D * 2 + H * a * (ctx + a) * 4
    return need <= MATH_BYTES_CAP
