"""Which step-time model a scenario runs, and the provenance every output records.

A calibrated answer is the default: ``step_time: {model: auto}`` (what a scenario without
``step_time`` gets) runs the calibration pack of (gpu, model, tp) when one exists and fits the
model's shape, precision and parallelism; only where none does it falls back to the roofline with
its default factors, and then every output says ``roofline (uncalibrated)`` with the reason. An
explicit ``{model: roofline}`` is uncalibrated too (and says whether a pack exists that it
ignores); ``{model: pack}`` must find its pack (the build fails in one line otherwise).

Packs are named for a model, but their timings are those of its layer shapes. Where the GPU has no
pack of the model's own name (in its precision and TP), a pack of the same GPU whose recorded
shape and precision equal the model's runs instead (a *twin*: Llama-3.1-8B on the A100's
Llama-3-8B pack, a config.json fine-tune on its base model's; servesim/perf/pack.py
``same_shape_packs``), labelled ``same layer shapes as <model>``. The order: the model's own pack
of this GPU; a twin of this GPU; the FP8 KV rule on the own or twin pack of the model's own KV
dtype; a pack of the GPU class (own name first, then a twin) transferred; the roofline.

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
    twin_of: str | None = None  # ``pack`` is another model's, of the same layer shapes as this model
    pack_source: str | None = None  # a twin's ``source`` (measured, imported, derived), for its label

    @property
    def _twin_words(self) -> str:
        """``imported; same layer shapes as llama-3.1-8b`` (``derived from ...; ...``), or ""."""
        if not self.twin_of:
            return ""
        return f"{self.derived or self.pack_source or '?'}; same layer shapes as {self.twin_of}"

    @property
    def pack_csv(self) -> Path | None:
        """The CSV of ``pack`` under the pack folder (None: no pack): the file this choice reads
        (a twin's, or the base of the FP8 KV rule), or the one a roofline was fitted to."""
        if self.pack is None:
            return None
        from servesim.perf.pack import pack_root

        gpu, stem = self.pack.split("/", 1)
        return pack_root() / gpu / f"{stem}.csv"

    @property
    def label(self) -> str:
        """One line: ``pack a100-80g/llama-3-8b``, ``pack h200/qwen3-30b-a3b (derived from ...)``,
        ``pack h100-80g/llama-3.1-8b with an FP8 KV cache by rule (...)`` or ``roofline
        (uncalibrated): <reason>``."""
        kv = f" with an FP8 KV cache by rule ({self.kv_rule})" if self.kv_rule else ""
        if self.model == "pack":
            if not self.calibrated:
                return f"pack {self.reason}{kv}"
            if self.twin_of:
                return f"pack {self.pack} ({self._twin_words})" + kv
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
                **({"kv_rule": self.kv_rule} if self.kv_rule else {}),
                **({"same_layer_shapes_as": self.twin_of} if self.twin_of else {})}


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
        twin = _twin(gpu, shape, tp, pp, cuda_graph)  # this GPU's pack of the same layer shapes
        if twin is not None:
            return _pack_choice(asked, gpu, gpu, shape, tp, twin)
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
        elif (twin := _twin(gpu, shape, tp, pp, cuda_graph=False)) is not None:
            why += (f" (a pack of the same layer shapes exists: {_ref(gpu, twin, tp)}; remove step_time "
                    f"to use it)")
        return StepChoice("roofline", asked, False, reason=why)
    if isinstance(st, AutoStepConfig):
        problem = pack_problem(gpu, shape, tp, pp, cuda_graph) or _expert_parallel_problem(sc)
        if problem is not None and problem.startswith("expert parallelism"):
            return StepChoice("roofline", asked, False, reason=problem)
        # the pack of the model's own precision (a shipped kvfp8 pack too), else a twin of this GPU
        here = _own_or_twin(asked, gpu, shape, tp, pp, cuda_graph, problem)
        if here is not None:
            return here
        kv_why = None
        if shape.kv_cache_dtype != "auto":  # an FP8 KV cache on the pack of the model's own KV dtype
            kv = _fp8_kv_choice(asked, gpu, shape, tp, pp, cuda_graph)
            if isinstance(kv, StepChoice):
                return kv
            kv_why = kv
        choice = _transferred(asked, gpu, shape, tp, pp, cuda_graph, problem)
        if kv_why and choice.model == "roofline":
            choice = StepChoice("roofline", asked, False, reason=f"{problem}; no FP8 KV rule: {kv_why}")
        return choice
    raise TypeError(f"unknown step_time config {st!r}")  # pragma: no cover


def _own_or_twin(asked: str, gpu: str, shape, tp: int, pp: int, cuda_graph: bool,
                 problem: str | None) -> StepChoice | None:
    """The pack of ``shape`` on ``gpu`` (``problem`` None: it fits), else a twin of ``gpu`` (same
    layer shapes); None where ``gpu`` has neither."""
    if problem is None:
        return StepChoice("pack", asked, True, pack=_ref(gpu, shape, tp), pack_id=_pack_id(gpu, shape, tp),
                          derived=_derived_origin(gpu, shape, tp))
    twin = _twin(gpu, shape, tp, pp, cuda_graph)
    return _pack_choice(asked, gpu, gpu, shape, tp, twin) if twin is not None else None


def _own_or_transferred(asked: str, gpu: str, shape, tp: int, pp: int, cuda_graph: bool,
                        problem: str | None) -> StepChoice:
    """The pack of ``shape`` on ``gpu``, else a twin of ``gpu`` (same layer shapes), else one of
    its GPU class transferred (own name, then a twin), else the roofline (``problem``: why ``gpu``
    has no pack of ``shape``)."""
    return (_own_or_twin(asked, gpu, shape, tp, pp, cuda_graph, problem)
            or _transferred(asked, gpu, shape, tp, pp, cuda_graph, problem))


def _transferred(asked: str, gpu: str, shape, tp: int, pp: int, cuda_graph: bool, problem: str) -> StepChoice:
    """A pack of ``gpu``'s class transferred (own name, then a twin), else the roofline."""
    found = _transfer_source(gpu, shape, tp, pp, cuda_graph)  # servesim/perf/transfer.py
    if found is not None:
        return _pack_choice(asked, gpu, found[0], shape, tp, found[1], problem)
    return StepChoice("roofline", asked, False, reason=problem)


def _pack_choice(asked: str, gpu: str, src: str, shape, tp: int, name: str, problem: str = "") -> StepChoice:
    """The pack ``name`` of ``src`` run for ``shape`` on ``gpu``: calibrated where ``src`` is
    ``gpu``, transferred otherwise; a twin (another model's name) says so."""
    from servesim.perf.pack import load_pack, pack_name

    twin_of = shape.name if name != pack_name(shape) else None
    source = str(load_pack(src, name, tp).meta.get("source")) if twin_of else None
    ref, derived = _ref(src, name, tp), _derived_origin(src, name, tp)
    if src == gpu:
        return StepChoice("pack", asked, True, pack=ref, pack_id=_pack_id(src, name, tp), derived=derived,
                          twin_of=twin_of, pack_source=source)
    what = "; ".join(w for w in (derived, twin_of and f"same layer shapes as {twin_of}") if w)
    return StepChoice("pack", asked, False, pack=ref, pack_id=_pack_id(src, name, tp), derived=derived,
                      twin_of=twin_of, pack_source=source,
                      reason=f"transferred from {ref}" + (f" ({what})" if what else "")
                             + f" by op-wise efficiency (no pack for {gpu}; {problem})")


def _own_file(gpu: str, shape, tp: int) -> bool:
    """Whether ``gpu`` has a pack file of the model's own name, precision and TP (fitting or not)."""
    from servesim.perf.pack import pack_path

    try:
        return pack_path(gpu, shape, tp).is_file()
    except (ValueError, ServesimError):  # a name no pack can have (an inline or config.json shape)
        return False


def _twin(gpu: str, shape, tp: int, pp: int, cuda_graph: bool) -> str | None:
    """The pack name of ``gpu``'s best pack of the same layer shapes and precision as ``shape``
    that holds the ops the parallelism needs (servesim/perf/pack.py ``same_shape_packs``); None
    where there is none, or where the model's own pack file exists (fitting or not: no twin
    hides why it does not fit)."""
    from servesim.perf.pack import required_ops, same_shape_packs

    if _own_file(gpu, shape, tp):
        return None
    for pack in same_shape_packs(gpu, shape, tp):
        try:
            pack.require(required_ops(tp, pp, cuda_graph, moe=pack.is_moe))
        except ServesimError:
            continue
        return pack.name
    return None


def read_as(choice: StepChoice, shape):
    """``shape`` under the name of the model whose pack ``choice`` reads: the shape itself, or for
    a twin the same numbers named for the pack's model, so that the pack is found by its file name
    and checked (shape, precision) against the model's own numbers."""
    from dataclasses import replace

    from servesim.perf.pack import split_stem

    if not choice.twin_of:
        return shape
    return replace(shape, name=split_stem(choice.pack.split("/", 1)[1])[0])


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

    why = kv_rule_problem(shape)
    if why is not None:
        return why
    if _own_file(gpu, shape, tp):  # a kvfp8 pack of this GPU that does not fit: no rule hides that
        return None
    base = with_precision(shape, kv_cache_dtype="auto")
    if own_only:
        why = pack_problem(gpu, base, tp, pp, cuda_graph)
        here = _own_or_twin(asked, gpu, base, tp, pp, cuda_graph, why)
        return why if here is None else replace(here, kv_rule=rule_text(gpu))
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
    derived one: servesim/tools/derive_variants.py). Where the model's name can have no pack (an
    inline or config.json shape) the reason says that none of the GPU's packs has its layer shapes:
    it is shown only after :func:`_twin` found none."""
    from servesim.hardware import GPUS
    from servesim.perf.pack import available_packs, load_pack, pack_name, pack_path, required_ops

    try:
        path = pack_path(gpu, shape, tp)
    except (ValueError, ServesimError) as exc:  # a name no pack can have (an inline or config.json shape)
        if gpu not in GPUS:
            return f"no calibration pack can exist for model {shape.name!r}: {_first_line(exc)}"
        here = [f"{g}/{m}" + (f"-tp{t}" if t > 1 else "") for g, m, t in available_packs() if g == gpu]
        return (f"no calibration pack for {gpu}/{pack_name(shape)} tp {tp}: packs are named for library "
                f"models, and none of {gpu}'s has this model's layer shapes and precision "
                f"(packs for {gpu}: {', '.join(here) if here else 'none'})")
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


def _transfer_source(gpu: str, shape, tp: int, pp: int, cuda_graph: bool) -> tuple[str, str] | None:
    """(GPU, pack name) of ``gpu``'s class to transfer from: the model's own pack where one fits,
    else a twin (same layer shapes; the GPU ranked as servesim/perf/transfer.py ranks: a measured
    twin first, then the GPU nearest in memory bandwidth); None if none (expert and latent-attention
    packs too: transfer.py has rules for their ops)."""
    from servesim.hardware import GPUS
    from servesim.perf.pack import available_packs, load_pack, pack_name
    from servesim.perf.transfer import source_rank, transfer_source

    if _own_file(gpu, shape, tp):
        return None  # this GPU's own pack exists but does not fit: no transfer hides that
    try:
        src = transfer_source(gpu, pack_name(shape), tp)
    except (ValueError, ServesimError):
        src = None
    if src is not None and pack_problem(src, shape, tp, pp, cuda_graph) is None:
        return src, pack_name(shape)
    twins = []
    for g in sorted({g for g, _, t in available_packs() if t == tp and g != gpu and GPUS[g].arch == GPUS[gpu].arch}):
        name = _twin(g, shape, tp, pp, cuda_graph)
        if name is not None:
            twins.append((source_rank(gpu, g, load_pack(g, name, tp)), g, name))
    return min(twins)[1:] if twins else None


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
