"""Op tables: every op of one (model, TP) rank shape timed on its grid, attention on the fastest
SDPA backend that passes the float64 check (attn_backends.py), as pack rows."""

from __future__ import annotations

import math
import time
from typing import Optional

import torch

from .attn_backends import QUICK_SURVEY, SURVEY, BackendChooser, KindSurvey, Sdpa, kind_of, math_fits, only
from .common import BudgetExceeded, Meas, log
from .grids import GRIDS, SAMPLED_MAX, decode_points, prefill_points
from .ops import (act_op, attn_decode_op, attn_prefill_op, embed_op, kv_write_op, layer_ops, linear_op,
                  make_cos_sin, rms_norm_op, rope_op, route_bias)
from .shapes import RankShape
from .timing import Timer
from .variants import MoE


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
            # fp8_static's norms and act write e4m3 (another kernel set); the final norm never does
            "input_norm": ("rms_norm", rs.h, rs.act_fp8), "post_attn_norm": ("rms_norm", rs.h, rs.act_fp8),
            "final_norm": ("rms_norm", rs.h, False), "residual_add": ("add", rs.h),
            "qkv_proj": ("linear", wf, rs.qkv_out, rs.h), "o_proj": ("linear", wf, rs.h, rs.H * rs.D),
            "gate_up_proj": ("linear", wf, 2 * rs.I, rs.h), "down_proj": ("linear", wf, rs.h, rs.I),
            "moe_gate": ("moe_gate", rs.E, rs.K, rs.h),
            "moe_experts": ("moe_experts", rs.E, rs.K, rs.MI, rs.h),
            "moe_combine": ("moe_combine", rs.E, rs.K, rs.h),
            "lm_head": ("linear", rs.V, rs.h), "embed": ("embed", rs.V, rs.h),
            "rope": ("rope", rs.H, rs.KVH, rs.D, rs.max_len), "kv_write": ("kv_write", rs.KVH, rs.D),
            "act": ("act", rs.I, rs.act_fp8),
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
        return prefill_points(self.grid, self.rs.max_len)

    def decode_grid(self):
        return decode_points(self.grid, self.rs.max_len, self.rs.KVH, self.rs.D, self.kv_cap, self.quick)

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
            q8 = rs.act_fp8  # fp8_static: the norms and act write e4m3 (ops.py), the linears take it
            self.point("input_norm", [lambda: rms_norm_op(x, w_norm, q8)], tokens=T)
            xq = _prepared(w_qkv, x)
            self.point("qkv_proj", [lambda w=w: linear_op(xq, w) for w in w_qkv], tokens=T)
            del xq
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
            a = _prepared(w_o, r(T, H * D))
            self.point("o_proj", [lambda w=w: linear_op(a, w) for w in w_o], tokens=T)
            del a
            self.point("post_attn_norm", [lambda: rms_norm_op(x, w_norm, q8)], tokens=T)
            if moe is not None:
                self.moe_points(moe, x, T)
            else:
                xq = _prepared(w_gu, x)
                self.point("gate_up_proj", [lambda w=w: linear_op(xq, w) for w in w_gu], tokens=T)
                del xq
                gu = r(T, 2 * I)
                self.point("act", [lambda: act_op(gu, I, q8)], tokens=T)
                del gu
                m = _prepared(w_down, r(T, I))
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
        y, order = moe.experts(x, idx, w)  # eager first: the fused backend tunes its tiles here
        self.point("moe_experts", [lambda: moe.experts(x, idx, w)], tokens=T)
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


def _prepared(ws: list, x: torch.Tensor) -> torch.Tensor:
    """A linear's input as its timed call takes it: pre-quantized where the weight format's
    activation quantization is upstream work (variants.QLinear.prepare: fp8_static), else ``x``.
    Every copy of a weight shares the static scale, so one prepared input serves them all."""
    return x if not ws or isinstance(ws[0], torch.Tensor) else ws[0].prepare(x)
