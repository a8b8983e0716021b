"""Which step-time model a scenario runs, and the provenance every output records.

A calibrated answer is the default: ``step_time: {model: auto}`` (what a scenario without
``step_time`` gets) runs the calibration pack of (gpu, model, tp) when one exists and fits the
model's shape, precision and parallelism; only where none does it falls back to the roofline with
its default factors, and then every output says ``roofline (uncalibrated)`` with the reason. An
explicit ``{model: roofline}`` is uncalibrated too (and says whether a pack exists that it
ignores); ``{model: pack}`` must find its pack (the build fails in one line otherwise).

:func:`choose` is cheap (a file lookup; the pack's CSV is parsed once per process and kept), so the
console header, summary.json, the capacity JSON and the sweep rows all ask it, never a second
rule of their own.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from servesim.errors import ServesimError

@dataclass(frozen=True)
class StepChoice:
    """The step-time model of one replica (group) and where its numbers come from."""

    model: str  # what runs: "pack", "roofline" or "constant"
    asked: str  # the scenario's step_time.model ("auto" when not given)
    calibrated: bool  # measured kernel timings of this (gpu, model, tp) price the iterations
    pack: str | None = None  # "<gpu>/<pack stem>": the pack run, or the pack a roofline fit used
    pack_id: str | None = None  # the pack with the first 16 hex of its files' sha256
    reason: str | None = None  # why the run is not calibrated (None when it is)
    note: str = ""  # e.g. the constant's seconds
    derived: str | None = None  # a derived pack's origin ("derived from ..."): no op of it measured
    kv_rule: str | None = None  # an FP8 KV cache priced on ``pack`` by rule (servesim/perf/kvfp8.py)

    @property
    def label(self) -> str:
        """One line: ``pack a100-80g/llama-3-8b``, ``pack h200/qwen3-30b-a3b (derived from ...)``,
        ``pack h100-80g/llama-3.1-8b with an FP8 KV cache by rule (...)`` or ``roofline
        (uncalibrated): <reason>``."""
        kv = f" with an FP8 KV cache by rule ({self.kv_rule})" if self.kv_rule else ""
        if self.model == "pack":
            if not self.calibrated:
                return f"pack {self.reason}{kv}"
            return f"pack {self.pack}" + (f" ({self.derived})" if self.derived else "") + kv
        if self.model == "constant":
            return f"constant {self.note} (uncalibrated: {self.reason})"
        if self.pack is not None:  # a roofline fitted to a pack
            return f"roofline fitted to pack {self.pack} (uncalibrated for this model: {self.reason})"
        return f"roofline (uncalibrated): {self.reason}"

    def to_dict(self) -> dict:
        return {"model": self.model, "asked": self.asked, "calibrated": self.calibrated, "pack": self.pack,
                "pack_id": self.pack_id, "reason": self.reason, "label": self.label,
                **({"derived": self.derived} if self.derived else {}),
                **({"kv_rule": self.kv_rule} if self.kv_rule else {})}


def choose(sc) -> StepChoice:
    """The step-time model ``sc`` (one replica's scenario) runs; see the module docstring."""
    from servesim.scenario import AutoStepConfig, ConstantStepConfig, PackStepConfig, RooflineStepConfig

    st = sc.step_time
    asked = st.model
    if isinstance(st, ConstantStepConfig):
        return StepChoice("constant", asked, False, reason="step_time.model is constant (a theory device)",
                          note=f"{st.seconds * 1e3:g} ms per iteration")
    gpu, shape, tp, pp = sc.hardware.gpu, sc.model_shape, sc.tp, sc.pp
    cuda_graph = bool(getattr(st, "cuda_graph", False))
    if isinstance(st, PackStepConfig):
        kv = _fp8_kv_choice(asked, gpu, shape, tp, pp, cuda_graph, own_only=True)
        if isinstance(kv, StepChoice):  # the GPU's own pack of the model's KV dtype, FP8 KV by rule
            return kv
        ref = _ref(gpu, shape, tp)
        return StepChoice("pack", asked, True, pack=ref, pack_id=_pack_id(gpu, shape, tp),
                          derived=_derived_origin(gpu, shape, tp))
    if isinstance(st, RooflineStepConfig):
        if st.fit is not None:
            from servesim.scenario import pack_ref_parts

            g, m, t = pack_ref_parts(st.fit)
            return StepChoice("roofline", asked, False, pack=_ref(g, m, t), pack_id=_pack_id(g, m, t),
                              reason=f"mfu, mbu and overhead fitted to {st.fit}, not measured for "
                                     f"{_ref(gpu, shape, tp)}")
        why = "step_time.model is roofline in the scenario"
        if pack_problem(gpu, shape, tp, pp, cuda_graph=False) is None:
            why += f" (a pack exists: {_ref(gpu, shape, tp)}; remove step_time to use it)"
        return StepChoice("roofline", asked, False, reason=why)
    if isinstance(st, AutoStepConfig):
        problem = pack_problem(gpu, shape, tp, pp, cuda_graph) or _expert_parallel_problem(sc)
        if problem is not None and problem.startswith("expert parallelism"):
            return StepChoice("roofline", asked, False, reason=problem)
        if problem is None:  # the pack of the model's own precision (a shipped kvfp8 pack too) wins
            return StepChoice("pack", asked, True, pack=_ref(gpu, shape, tp), pack_id=_pack_id(gpu, shape, tp),
                              derived=_derived_origin(gpu, shape, tp))
        kv_why = None
        if shape.kv_cache_dtype != "auto":  # an FP8 KV cache on the pack of the model's own KV dtype
            kv = _fp8_kv_choice(asked, gpu, shape, tp, pp, cuda_graph)
            if isinstance(kv, StepChoice):
                return kv
            kv_why = kv
        choice = _own_or_transferred(asked, gpu, shape, tp, pp, cuda_graph, problem)
        if kv_why and choice.model == "roofline":
            choice = StepChoice("roofline", asked, False, reason=f"{problem}; no FP8 KV rule: {kv_why}")
        return choice
    raise TypeError(f"unknown step_time config {st!r}")  # pragma: no cover


def _own_or_transferred(asked: str, gpu: str, shape, tp: int, pp: int, cuda_graph: bool,
                        problem: str | None) -> StepChoice:
    """The pack of ``shape`` on ``gpu``, else one of its GPU class transferred, else the roofline
    (``problem``: why ``gpu`` has no pack of ``shape``)."""
    if problem is None:
        return StepChoice("pack", asked, True, pack=_ref(gpu, shape, tp), pack_id=_pack_id(gpu, shape, tp),
                          derived=_derived_origin(gpu, shape, tp))
    src = _transfer_source(gpu, shape, tp, pp, cuda_graph)  # servesim/perf/transfer.py
    if src is not None:
        derived = _derived_origin(src, shape, tp)
        return StepChoice("pack", asked, False, pack=_ref(src, shape, tp),
                          pack_id=_pack_id(src, shape, tp), derived=derived,
                          reason=f"transferred from {_ref(src, shape, tp)}"
                                 + (f" ({derived})" if derived else "") + " by op-wise efficiency "
                                 f"(no pack for {gpu}; {problem})")
    return StepChoice("roofline", asked, False, reason=problem)


def _fp8_kv_choice(asked: str, gpu: str, shape, tp: int, pp: int, cuda_graph: bool,
                   own_only: bool = False) -> StepChoice | str | None:
    """An FP8 KV cache priced by rule (servesim/perf/kvfp8.py) on the pack -- measured, derived or
    transferred -- the run would use with the model's own KV dtype; or why not (one line; None
    where this GPU's own kvfp8 pack exists but does not fit: its reason stands alone). ``own_only``
    (an explicit ``step_time: {model: pack}``): this GPU's own pack, never a transfer.
    The own GPU's base pack comes before a kvfp8 pack of another GPU of its class transferred."""
    from dataclasses import replace

    from servesim.models import with_precision
    from servesim.perf.kvfp8 import kv_rule_problem, rule_text

    from servesim.perf.pack import pack_path

    why = kv_rule_problem(shape)
    if why is not None:
        return why
    if pack_path(gpu, shape, tp).is_file():  # a kvfp8 pack of this GPU that does not fit: no rule hides that
        return None
    base = with_precision(shape, kv_cache_dtype="auto")
    if own_only:
        why = pack_problem(gpu, base, tp, pp, cuda_graph)
        if why is not None:
            return why
        return StepChoice("pack", asked, True, pack=_ref(gpu, base, tp), pack_id=_pack_id(gpu, base, tp),
                          derived=_derived_origin(gpu, base, tp), kv_rule=rule_text(gpu))
    choice = _own_or_transferred(asked, gpu, base, tp, pp, cuda_graph, pack_problem(gpu, base, tp, pp, cuda_graph))
    if choice.model != "pack":
        return f"no pack of the model's own KV dtype either ({choice.reason})"
    if not choice.calibrated and _transfer_source(gpu, shape, tp, pp, cuda_graph) is not None:
        return "a kvfp8 pack of the GPU class transfers"  # the file of its own KV dtype, as measured or derived
    return replace(choice, kv_rule=rule_text(gpu))


def pack_problem(gpu: str, shape, tp: int, pp: int, cuda_graph: bool) -> str | None:
    """Why no pack can price (gpu, shape, tp, pp) -- None when one can: the pack named for the
    GPU, the model in its precision (``<model>[-<quantization>][-kv<dtype>][-tp<N>]``) and the TP
    exists, was measured for this shape (experts included), weight dtype, quantization and KV
    dtype, and holds every op the parallelism and launch mode need (send/recv for pipelines,
    all-reduce for TP). A latent-attention (MLA) model needs a pack timed for its latent shape (a
    derived one: servesim/tools/derive_variants.py)."""
    from servesim.perf.pack import available_packs, load_pack, pack_name, pack_path, required_ops

    try:
        path = pack_path(gpu, shape, tp)
    except (ValueError, ServesimError) as exc:  # a name no pack can have (an inline shape)
        return f"no calibration pack can exist for model {shape.name!r}: {_first_line(exc)}"
    if not path.is_file():
        here = [f"{g}/{m}" + (f"-tp{t}" if t > 1 else "") for g, m, t in available_packs() if g == gpu]
        unlike = shape.unlike_bf16_packs()  # what the bf16 dense packs do not price
        return (f"no calibration pack for {gpu}/{pack_name(shape)} tp {tp} ("
                + (f"the model runs {unlike}, which bf16 dense-decoder packs do not price; " if unlike else "")
                + f"packs for {gpu}: {', '.join(here) if here else 'none'})")
    try:
        pack = load_pack(gpu, shape, tp)  # checks the shape and the precision against the model's
        pack.require(required_ops(tp, pp, cuda_graph, moe=pack.is_moe))
    except ServesimError as exc:
        return f"pack {_ref(gpu, shape, tp)} does not fit: {_first_line(exc)}"
    return None


def _expert_parallel_problem(sc) -> str | None:
    """Packs time each MoE layer with its experts TP-sharded (all-reduce after it); with
    ``engine.enable_expert_parallel`` over TP > 1 the experts are split whole with an all-to-all,
    which no pack holds rows for: the roofline prices that (docs/models.md)."""
    if getattr(sc.engine, "enable_expert_parallel", False) and sc.tp > 1 and getattr(sc.model_shape, "is_moe", False):
        return (f"expert parallelism over {sc.tp} GPUs: packs time TP-sharded experts (no all-to-all rows); "
                f"the roofline prices EP")
    return None


def _transfer_source(gpu: str, shape, tp: int, pp: int, cuda_graph: bool) -> str | None:
    """A GPU of ``gpu``'s class whose pack of (model, tp) fits, to transfer from; None if none
    (expert and latent-attention packs too: servesim/perf/transfer.py has rules for their ops)."""
    from servesim.perf.pack import pack_name, pack_path
    from servesim.perf.transfer import transfer_source

    try:
        if pack_path(gpu, shape, tp).is_file():
            return None  # this GPU's own pack exists but does not fit: no transfer hides that
        src = transfer_source(gpu, pack_name(shape), tp)
    except (ValueError, ServesimError):
        return None
    return src if src is not None and pack_problem(src, shape, tp, pp, cuda_graph) is None else None


def _derived_origin(gpu: str, shape, tp: int) -> str | None:
    """``derived from <sources>`` of a derived pack (its YAML ``origin`` up to the first
    parenthesis), None for a measured or imported one."""
    from servesim.perf.pack import load_pack

    try:
        meta = load_pack(gpu, shape, tp).meta
    except (ValueError, ServesimError):
        return None
    if meta.get("source") != "derived":
        return None
    origin = str(meta.get("origin", "")).split(" (")[0].strip()
    return origin if origin.startswith("derived") else f"derived from {origin or '?'}"


def _ref(gpu: str, model, tp: int) -> str:
    """``<gpu>/<pack stem>`` of a model (a shape: its name and precision; or a pack name)."""
    from servesim.perf.pack import pack_stem

    try:
        return f"{gpu}/{pack_stem(model, tp)}"
    except (ValueError, ServesimError):  # pragma: no cover
        return f"{gpu}/{getattr(model, 'name', model)}" + (f"-tp{tp}" if tp > 1 else "")


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _pack_id(gpu: str, model, tp: int) -> str | None:
    """``<gpu>/<pack> sha256:<16 hex>`` over the pack's CSV and YAML (None: no such files)."""
    from servesim.perf.pack import pack_path

    try:
        csv_path = pack_path(gpu, model, tp)
    except (ValueError, ServesimError):
        return None
    files = [p for p in (csv_path, csv_path.with_suffix(".yaml")) if p.is_file()]
    if not files:
        return None
    digest = hashlib.sha256()
    for p in files:
        st = p.stat()
        digest.update(_file_digest(str(p), st.st_mtime_ns, st.st_size).encode())
    return f"{gpu}/{csv_path.stem} sha256:{digest.hexdigest()[:16]}"


@lru_cache(maxsize=64)
def _file_digest(path: str, mtime_ns: int, size: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def choices(sc) -> list[tuple[str, StepChoice]]:
    """(group name, choice) of every replica group of ``sc`` (one, named "default", for a lone
    replica or a one-group fleet)."""
    groups = sc.replica_groups
    return [(getattr(g, "name", "default") or "default", choose(g.scenario)) for g in groups]


def provenance(sc) -> dict:
    """summary.json's ``step_model``: the choice of a uniform scenario at the top level (model,
    calibrated, pack, pack_id, reason, label), each group's under ``groups`` when they differ."""
    per = choices(sc)
    first = per[0][1].to_dict()
    if len({c.label for _, c in per}) == 1:
        return first
    return {"model": "mixed", "asked": first["asked"], "calibrated": all(c.calibrated for _, c in per),
            "pack": None, "pack_id": None,
            "reason": "; ".join(f"{n}: {c.reason}" for n, c in per if c.reason) or None,
            "label": "; ".join(f"{n}: {c.label}" for n, c in per),
            "groups": {n: c.to_dict() for n, c in per}}


def provenance_label(sc) -> str:
    """The one line the header, sweep rows and capacity answers print."""
    return provenance(sc)["label"]
