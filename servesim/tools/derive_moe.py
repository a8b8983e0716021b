"""Expert (MoE) layers of a derived pack: ``moe_gate``, ``moe_experts``, ``moe_combine`` from the
GPU's MoE survey (rule: :mod:`servesim.tools.derive_variants`' module doc, "Experts"). Split from
derive_variants.py (the 600-line bound); derive_variants re-exports these names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import pandas as pd

from servesim.errors import PackError
from servesim.hardware import GPUS
from servesim.models import ModelShape
from servesim.tools.derive_common import _idw, _interp_log, read_survey

#: the MoE survey's experts backends, most engine-like first: ``triton-fused`` is a fused MoE
#: Triton kernel of the class vLLM and SGLang run (calibration/profiler/triton_moe.py);
#: ``grouped_mm`` is PyTorch's grouped GEMM after a sort-by-expert permutation (~48 % of HBM peak
#: at batch 10 on the H200: docs/models.md, "MoE and MLA on one GPU")
ENGINE_BACKENDS = ("triton-fused", "grouped_mm")


def _backends(frame: pd.DataFrame) -> pd.DataFrame:
    if "backend" not in frame.columns:  # the first survey, before the fused kernel: grouped_mm only
        frame = frame.assign(backend="grouped_mm")
    frame["backend"] = frame["backend"].fillna("").astype(str).replace("", "grouped_mm")
    return frame


def moe_survey(gpu: str, backend: Optional[str] = None) -> tuple[pd.DataFrame, str, str]:
    """The MoE survey rows a derivation on ``gpu`` reads: ``(rows, backend, survey gpu)``.

    The backend is ``backend`` if given, else the most engine-like one surveyed
    (``ENGINE_BACKENDS``), looked for first in ``gpu``'s own survey, then in the surveys of the
    other GPUs of its architecture (``GPUSpec.arch``): an engine-class kernel timed on a sibling
    GPU says more than a slower kernel timed on this one, and :class:`MoeRule` carries it over by
    efficiency (achieved / peak), the transfer rule of servesim/perf/transfer.py. A survey without
    a ``backend`` column (before the fused kernel) timed ``grouped_mm`` only."""
    from servesim.tools.derive_common import survey_root

    arch = GPUS[gpu].arch
    gpus = [gpu] + sorted(g for g in GPUS if g != gpu and arch and GPUS[g].arch == arch
                          and (survey_root() / g / "moe.csv").is_file())
    frames = {}
    for g in gpus:
        try:
            frames[g] = _backends(read_survey(g, "moe"))
        except PackError:
            continue
    if not frames:
        read_survey(gpu, "moe")  # says which survey is missing and what exists
    order = [backend] if backend else list(ENGINE_BACKENDS)
    for b in order:
        for g, m in frames.items():
            if b in set(m.backend):
                return m[m.backend == b].drop(columns="backend").reset_index(drop=True), b, g
    have = sorted({f"{g} {b}" for g, m in frames.items() for b in set(m.backend)})
    raise PackError(f"moe survey for {gpu}: backend {backend!r} not surveyed; surveyed: {', '.join(have)}")


@dataclass(frozen=True)
class MoeShape:
    """One MoE layer on one rank: experts, top-k, the expert's intermediate (per rank), hidden."""

    experts: int
    top_k: int
    inter: int
    hidden: int

    @classmethod
    def of(cls, shape: ModelShape, tp: int) -> "MoeShape":
        return cls(shape.num_experts, shape.num_experts_per_tok, max(1, shape.moe_intermediate_size // tp),
                   shape.hidden_size)

    def label(self) -> str:
        return f"{self.experts} experts top-{self.top_k}, I {self.inter}, h {self.hidden}"


class MoeRule:
    """Expert, router and combine times of an MoE layer from the MoE survey (rule: module doc)."""

    def __init__(self, moe: pd.DataFrame, gpu: str, exclude: Optional[MoeShape] = None,
                 survey_gpu: Optional[str] = None):
        """``survey_gpu`` (default ``gpu``): the GPU the survey was timed on; its efficiencies are
        taken over to ``gpu``'s peaks, its bandwidth-bound router and combine by the HBM ratio."""
        src = GPUS[survey_gpu or gpu]
        self.flops, self.bw = src.bf16_flops_per_s, src.hbm_bytes_per_s
        self.sources = []
        for (E, k, inter, h), g in moe.groupby(["experts", "top_k", "inter", "k"]):
            cfg = MoeShape(int(E), int(k), int(inter), int(h))
            if cfg == exclude:
                continue
            curves = {}
            for v, gv in g.groupby("variant"):
                gv = gv.sort_values("tokens")
                curves[v] = (gv.tokens.to_numpy(np.float64), gv.time_ms.to_numpy(np.float64))
            M, t = curves["experts"]
            eff = self.ideal_ms(cfg, M) / t
            self.sources.append((cfg, M * cfg.top_k / cfg.experts, eff, curves))
        if not self.sources:
            raise PackError("MoE survey: no configuration left to derive from")
        spec = GPUS[gpu]  # the efficiencies above are the survey GPU's; predictions are gpu's
        self.width_scale = src.hbm_bytes_per_s / spec.hbm_bytes_per_s
        self.flops, self.bw = spec.bf16_flops_per_s, spec.hbm_bytes_per_s

    def ideal_ms(self, cfg: MoeShape, M, imbalance: float = 1.0) -> np.ndarray:
        M = np.asarray(M, np.float64)
        E, k, inter, h = cfg.experts, cfg.top_k, cfg.inter, cfg.hidden
        hit = E * (1 - (1 - k / E) ** M)
        nbytes = 2 * (hit * 3 * h * inter + M * k * (2 * h + 3 * inter))
        flops = 2 * M * k * 3 * h * inter * imbalance
        return 1e3 * np.maximum(flops / self.flops, nbytes / self.bw)

    def _weights(self, cfg: MoeShape) -> np.ndarray:
        d = np.array([np.hypot(np.log(3 * s.hidden * s.inter / (3 * cfg.hidden * cfg.inter)),
                               np.log(s.experts / cfg.experts)) for s, _, _, _ in self.sources])
        return _idw(d)

    def experts_ms(self, cfg: MoeShape, M, imbalance: float = 1.0) -> np.ndarray:
        M = np.asarray(M, np.float64)
        w = self._weights(cfg)
        x = M * cfg.top_k / cfg.experts
        eff = sum(wi * _interp_log(x, xs, e) for wi, (_, xs, e, _) in zip(w, self.sources)) / w.sum()
        return self.ideal_ms(cfg, M, imbalance) / eff

    def _width_ms(self, op: str, cfg: MoeShape, M, width) -> np.ndarray:
        from servesim.perf.packtables import Curve

        M = np.asarray(M, np.float64)
        ws = np.array([width(s) for s, _, _, _ in self.sources], np.float64)
        wt = float(width(cfg))
        d = np.abs(np.log(ws / wt))
        w = _idw(d)
        out = sum(wi * Curve(*src[3][op], monotone=False)(M * wt / wsi)
                  for wi, wsi, src in zip(w, ws, self.sources))
        return self.width_scale * out / w.sum()

    def gate_ms(self, cfg: MoeShape, M) -> np.ndarray:
        return self._width_ms("gate", cfg, M, lambda s: s.hidden + s.experts)

    def combine_ms(self, cfg: MoeShape, M) -> np.ndarray:
        return self._width_ms("combine", cfg, M, lambda s: s.top_k * s.hidden)


def moe_layer_rows(rule: MoeRule, transfer, shape: ModelShape, tp: int, grid: np.ndarray,
                   imbalance: float = 1.0) -> tuple[list[tuple], dict]:
    """``moe_gate``, ``moe_experts``, ``moe_combine`` rows of (shape, tp) on ``grid``, shared
    experts and dense first layers folded in (module doc)."""
    cfg = MoeShape.of(shape, tp)
    h = shape.hidden_size
    M = np.asarray(grid, np.float64)
    L, d = shape.num_layers, shape.num_dense_layers
    f = (L - d) / L

    def mlp(inter: int) -> np.ndarray:
        act = transfer.width_ms("act", inter, M)
        return (transfer.gemm_ms(h, 2 * inter, M) + transfer.gemm_ms(inter, h, M)
                + (act if act is not None else 0.0))

    experts = rule.experts_ms(cfg, M, imbalance)
    shared_i = shape.shared_expert_intermediate_size // tp
    if shared_i:
        experts = experts + mlp(shared_i)
    if d:
        experts = f * experts + (1 - f) * mlp(shape.intermediate_size // tp)
    gate, combine = f * rule.gate_ms(cfg, M), f * rule.combine_ms(cfg, M)
    rows = []
    for op, t in (("moe_gate", gate), ("moe_experts", experts), ("moe_combine", combine)):
        rows += [(op, int(m), 0, 0, 0, float(x), None) for m, x in zip(M, t)]
    names = ", ".join(f"{s.label()}" for s, _, _, _ in rule.sources)
    notes = {
        "moe_experts": (f"{cfg.label()}: roofline of hit experts' weights + routed GEMMs (imbalance "
                        f"{imbalance:g}) / efficiency at the same tokens per expert, IDW over the MoE "
                        f"survey's {names}"
                        + (f"; + shared experts (I {shared_i}) as a dense MLP" if shared_i else "")
                        + (f"; x {f:.4f} + the dense MLP (I {shape.intermediate_size // tp}) x {1 - f:.4f} "
                           f"({d} dense first layers of {L})" if d else "")),
        "moe_gate": "router: t_src(M (h + E) / w_src) from the MoE survey" + (f", x {f:.4f}" if d else ""),
        "moe_combine": "combine: t_src(M k h / w_src) from the MoE survey" + (f", x {f:.4f}" if d else ""),
    }
    return rows, notes
