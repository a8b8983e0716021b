"""Calibration packs: find, read and validate measured op timings (format: calibration/PACK_FORMAT.md).

A pack is one CSV of per-op medians plus a YAML of provenance for one (GPU, model shape, TP). This
module only reads and checks them; turning op timings into iteration times is
:mod:`servesim.perf.packmodel`. Every defect a user can cause (missing file, unknown GPU or model,
wrong columns, a bad value, an op the model needs but the pack lacks) is a one-line
:class:`~servesim.errors.PackError` naming the file, the line or op, the value and what is allowed,
so the CLI can print it and exit 2.

Packs ship inside the wheel as the package ``servesim.packs`` (pyproject maps it to
``calibration/packs/``). In a source checkout that package does not exist, so the repository folder
is the fallback.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import yaml

from servesim.errors import PackError
from servesim.hardware import GPUS
from servesim.models import KV_CACHE_DTYPES, MODELS, WEIGHT_FORMATS, ModelShape, with_precision
from servesim.models.precision import split_pack_name  # (re-exported: configs below perf read it)

COLUMNS: tuple[str, ...] = ("op", "tokens", "batch", "context", "bytes", "time_ms", "std_ms")

#: Per-layer ops keyed by the iteration's token count, in forward order (a dense decoder).
LAYER_TOKEN_OPS: tuple[str, ...] = (
    "input_norm", "qkv_proj", "rope", "kv_write", "o_proj", "post_attn_norm",
    "gate_up_proj", "act", "down_proj", "residual_add",
)
#: A mixture-of-experts pack's per-layer token ops: the router, the routed experts and their
#: weighted sum take the dense MLP's three places (so the kernels' tables keep their rows).
MOE_LAYER_TOKEN_OPS: tuple[str, ...] = (
    "input_norm", "qkv_proj", "rope", "kv_write", "o_proj", "post_attn_norm",
    "moe_gate", "moe_experts", "moe_combine", "residual_add",
)
MOE_OPS: tuple[str, ...] = ("moe_gate", "moe_experts", "moe_combine")
#: Once-per-iteration ops keyed by tokens (``embed``: all tokens; the others: sampled rows).
ITERATION_TOKEN_OPS: tuple[str, ...] = ("embed", "final_norm", "lm_head")
ATTENTION_OPS: tuple[str, ...] = ("attn_prefill", "attn_decode")
OVERHEAD_OPS: tuple[str, ...] = ("overhead_eager", "overhead_cuda_graph")
COMM_OPS: tuple[str, ...] = ("all_reduce", "send_recv")
OPS: tuple[str, ...] = LAYER_TOKEN_OPS + ITERATION_TOKEN_OPS + ATTENTION_OPS + OVERHEAD_OPS + COMM_OPS + MOE_OPS

REQUIRED_META: tuple[str, ...] = ("gpu", "model", "tp", "source")
#: measured on the GPU; imported from public profiles; derived from other models' measurements
SOURCES: tuple[str, ...] = ("measured", "imported", "derived")
SHAPE_KEYS: tuple[str, ...] = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                               "intermediate_size", "vocab_size")
#: an MoE pack's ``shape`` records these too (its expert GEMMs are timed for them)
MOE_SHAPE_KEYS: tuple[str, ...] = ("num_experts", "num_experts_per_tok", "moe_intermediate_size")
#: a latent-attention (MLA) pack's ``shape`` records these too (derived packs only so far)
MLA_SHAPE_KEYS: tuple[str, ...] = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                   "v_head_dim")
#: the weight dtype (``dtype`` in a pack's YAML) each quantization's packs are measured in
WEIGHT_DTYPES: dict[str, str] = {"none": "bf16", "fp8": "fp8", "fp8_static": "fp8", "int8": "int8", "awq": "int4", "gptq": "int4",
                                 "nvfp4": "fp4", "mxfp4": "fp4"}
_DTYPE_ALIASES = {"fp16": "bf16", "float16": "bf16", "bfloat16": "bf16"}  # 16-bit packs price each other


def required_ops(tp: int = 1, pp: int = 1, cuda_graph: bool = False, moe: bool = False) -> tuple[str, ...]:
    """Ops a pack must hold to predict iterations at this parallelism and launch mode (``moe``:
    an expert pack's per-layer ops)."""
    ops = (MOE_LAYER_TOKEN_OPS if moe else LAYER_TOKEN_OPS) + ITERATION_TOKEN_OPS + ATTENTION_OPS + ("overhead_eager",)
    if cuda_graph:
        ops += ("overhead_cuda_graph",)
    if tp > 1:
        ops += ("all_reduce",)
    if pp > 1:
        ops += ("send_recv",)
    return ops


@dataclass(frozen=True)
class OpRows:
    """All rows of one op, as parallel arrays in file order (``line`` = 1-based CSV line)."""

    tokens: np.ndarray
    batch: np.ndarray
    context: np.ndarray
    bytes: np.ndarray
    time_ms: np.ndarray
    std_ms: np.ndarray
    line: np.ndarray

    def __len__(self) -> int:
        return len(self.time_ms)

    def where(self, mask: np.ndarray) -> "OpRows":
        return OpRows(*(getattr(self, f)[mask] for f in self.__dataclass_fields__))


@dataclass(frozen=True)
class Pack:
    """The parsed, validated content of one pack (CSV + YAML)."""

    gpu: str
    model: str
    tp: int
    csv_path: Path
    meta: Mapping[str, Any]
    ops: Mapping[str, OpRows] = field(repr=False)

    def has(self, op: str) -> bool:
        return op in self.ops

    def rows(self, op: str) -> OpRows:
        if op not in self.ops:
            raise PackError(f"{self.csv_path}: op '{op}' is needed but missing; ops present: "
                            f"{', '.join(sorted(self.ops))}")
        return self.ops[op]

    def require(self, ops: tuple[str, ...]) -> None:
        missing = [op for op in ops if op not in self.ops]
        if missing:
            raise PackError(f"{self.csv_path}: op '{missing[0]}' is needed (tp={self.tp}) but missing"
                            f"{' (also: ' + ', '.join(missing[1:]) + ')' if missing[1:] else ''}; "
                            f"ops present: {', '.join(sorted(self.ops))}")

    def shape(self) -> ModelShape:
        """The model shape the pack was measured for (from ``servesim.models.MODELS``), in the
        pack's precision."""
        return with_precision(MODELS[self.model], self.quantization, self.kv_cache_dtype)

    @property
    def quantization(self) -> str:
        return str(self.meta.get("quantization", "none"))

    @property
    def kv_cache_dtype(self) -> str:
        return str(self.meta.get("kv_cache_dtype", "auto"))

    @property
    def name(self) -> str:
        """``<model>[-<quantization>][-kv<dtype>]``: the pack's stem without its TP."""
        return pack_name(self.model, self.quantization, self.kv_cache_dtype)

    @property
    def stem(self) -> str:
        return pack_stem(self.name, self.tp)

    @property
    def is_moe(self) -> bool:
        """An expert pack: its shape records experts, or (no shape recorded) it holds expert ops."""
        shape = self.meta.get("shape") or {}
        if "num_experts" in shape:
            return int(shape["num_experts"]) > 0
        return any(op in self.ops for op in MOE_OPS)

    @property
    def is_mla(self) -> bool:
        """A latent-attention pack: its shape records a KV latent."""
        return int((self.meta.get("shape") or {}).get("kv_lora_rank", 0) or 0) > 0

    @property
    def layer_token_ops(self) -> tuple[str, ...]:
        """The per-layer token ops of the pack's kind (dense or MoE), in forward order."""
        return MOE_LAYER_TOKEN_OPS if self.is_moe else LAYER_TOKEN_OPS

    @property
    def notes(self) -> str:
        return str(self.meta.get("notes", ""))


# --- locating packs ---------------------------------------------------------------------------

def pack_root() -> Path:
    """Folder holding ``<gpu>/<model>[-tp<N>].csv``: the installed package, else the repo folder."""
    try:
        from importlib.resources import files

        root = Path(str(files("servesim.packs")))
        if root.is_dir():
            return root
    except (ModuleNotFoundError, TypeError):
        pass
    return Path(__file__).resolve().parents[2] / "calibration" / "packs"


# Pack names: ``<model>[-<quantization>][-kv<kv_cache_dtype>]``, the stem ``<name>[-tp<N>]``.
# Model names hold hyphens, so a stem is read back by stripping the known suffixes from its end:
# the TP, then the KV dtype, then the quantization (servesim.models.precision's names).

def pack_name(model: str | ModelShape, quantization: str = "none", kv_cache_dtype: str = "auto") -> str:
    """The pack name of a model served in a precision; a :class:`ModelShape` brings its own."""
    if isinstance(model, ModelShape):
        model, quantization, kv_cache_dtype = model.name, model.quantization, model.kv_cache_dtype
    return (model + (f"-{quantization}" if quantization != "none" else "")
            + (f"-kv{kv_cache_dtype}" if kv_cache_dtype != "auto" else ""))


def pack_stem(model: str | ModelShape, tp: int, quantization: str = "none", kv_cache_dtype: str = "auto") -> str:
    """``<model>[-<quantization>][-kv<dtype>][-tp<N>]`` (``model`` may already be a pack name)."""
    name = pack_name(model, quantization, kv_cache_dtype)
    return name if tp == 1 else f"{name}-tp{tp}"


def split_stem(stem: str) -> tuple[str, int, str, str]:
    """A pack file's stem -> (model, tp, quantization, kv_cache_dtype)."""
    name, tp = stem, 1
    head, sep, tail = stem.rpartition("-tp")
    if sep and tail.isdigit():
        name, tp = head, int(tail)
    model, quant, kv = split_pack_name(name)
    return model, tp, quant, kv


def pack_path(gpu: str, model: str | ModelShape, tp: int = 1, root: Path | None = None) -> Path:
    """CSV path of the pack for (gpu, model, tp); checks the names, not the file's existence.
    ``model``: a pack name (``llama-3-8b``, ``llama-3-8b-fp8``) or a shape (its name and precision)."""
    name = pack_name(model)
    _check_names(gpu, name, tp)
    return (root or pack_root()) / gpu / f"{pack_stem(name, tp)}.csv"


def available_packs(root: Path | None = None) -> list[tuple[str, str, int]]:
    """(gpu, pack name, tp) of every pack CSV found under the pack folder, sorted; the pack name is
    the model's, with ``-<quantization>`` / ``-kv<dtype>`` for packs of another precision."""
    root = root or pack_root()
    found = []
    for csv_file in sorted(root.glob("*/*.csv")):
        model, tp, quant, kv = split_stem(csv_file.stem)
        found.append((csv_file.parent.name, pack_name(model, quant, kv), tp))
    return sorted(found)


def _check_names(gpu: str, name: str, tp: int) -> None:
    if gpu not in GPUS:
        raise PackError(f"unknown GPU '{gpu}' for a calibration pack; allowed: {', '.join(sorted(GPUS))}")
    model = split_pack_name(name)[0]
    if model not in MODELS:
        raise PackError(f"unknown model '{model}' for a calibration pack; allowed: "
                        f"{', '.join(sorted(MODELS))}")
    if not isinstance(tp, int) or tp < 1:
        raise PackError(f"tensor-parallel degree must be an integer >= 1, got {tp!r}")


def pack_shape(name: str) -> ModelShape:
    """The library model a pack name stands for, in the name's precision."""
    model, quant, kv = split_pack_name(name)
    if model not in MODELS:
        raise PackError(f"unknown model '{model}' for a calibration pack; allowed: {', '.join(sorted(MODELS))}")
    return with_precision(MODELS[model], quant, kv)


def load_pack(gpu: str, model: str | ModelShape, tp: int = 1) -> Pack:
    """Find and read the pack for (gpu, model, tp); a missing pack names what exists. ``model``: a
    pack name, or a shape (its pack name; the pack's shape and precision are checked against it)."""
    name = pack_name(model)
    path = pack_path(gpu, name, tp)
    if not path.is_file():
        raise PackError(missing_pack_message(gpu, name, tp, path))
    pack = _read_cached(str(path), path.stat().st_mtime_ns)
    if pack.gpu != gpu or pack.name != name or pack.tp != tp:
        raise PackError(f"{path.with_suffix('.yaml')}: metadata says gpu={pack.gpu} model={pack.model} "
                        f"quantization={pack.quantization} kv_cache_dtype={pack.kv_cache_dtype} tp={pack.tp}, "
                        f"but the file is named for gpu={gpu} {name} tp={tp}")
    if isinstance(model, ModelShape):
        check_shape(pack, model)
        check_precision(pack, model)
    return pack


#: a twin's preference (:func:`same_shape_packs`): measured on the GPU, then imported, then derived
SOURCE_ORDER: tuple[str, ...] = ("measured", "imported", "derived")


def same_shape_packs(gpu: str, shape: ModelShape, tp: int = 1) -> list[Pack]:
    """Packs of ``gpu`` and ``tp`` named for another model whose recorded ``shape`` and precision
    equal ``shape``'s (what :func:`check_shape` and :func:`check_precision` compare: the layer keys,
    plus the expert and latent keys of an MoE or MLA model): timings of the same kernels on the same
    GPU, whatever the model is called (Llama-3-8B and Llama-3.1-8B, or a config.json fine-tune).
    A twin must record every layer key (and every latent key for an MLA model): an absent key is
    not compared by check_shape, so a pack recording less cannot be matched by it. Best first:
    measured, imported, derived (SOURCE_ORDER); then the pack whose decode attention was measured
    to the longest context (the H100's llama-3.1-8b pack reaches 131,071 tokens, its llama-3-8b
    pack 8,191: a Llama-3.1 fine-tune's long contexts should be read, not extrapolated); then by
    pack name."""
    own = pack_name(shape)
    out = []
    for g, name, t in available_packs():
        if g != gpu or t != tp or name == own or split_pack_name(name)[1:] != (shape.quantization, shape.kv_cache_dtype):
            continue
        path = pack_path(gpu, name, tp)
        yaml_path = path.with_suffix(".yaml")
        if not yaml_path.is_file():
            continue
        try:
            recorded = _meta_cached(str(yaml_path), yaml_path.stat().st_mtime_ns).get("shape") or {}
            keys = SHAPE_KEYS + (MLA_SHAPE_KEYS if shape.is_mla else ())
            if any(k not in recorded or int(recorded[k]) != getattr(shape, k) for k in keys):
                continue  # cheap: most packs differ in a layer key, their CSV is never read
            pack = load_pack(gpu, name, tp)
            check_shape(pack, shape)
            check_precision(pack, shape)
        except (PackError, TypeError, ValueError):
            continue
        out.append(pack)
    rank = {s: i for i, s in enumerate(SOURCE_ORDER)}
    return sorted(out, key=lambda p: (rank.get(str(p.meta.get("source")), len(rank)), -_attention_reach(p), p.name))


def _attention_reach(pack: Pack) -> int:
    """The longest context a pack's decode attention was measured at (0 without such rows)."""
    if not pack.has("attn_decode"):
        return 0
    ctx = pack.rows("attn_decode").context
    return int(ctx.max()) if len(ctx) else 0


@lru_cache(maxsize=256)
def _meta_cached(path: str, mtime_ns: int) -> dict[str, Any]:
    return read_meta(Path(path))


def missing_pack_message(gpu: str, model: str, tp: int, path: Path) -> str:
    """What exists for this GPU, and the fallback: a roofline fitted to one of its packs."""
    found = available_packs()
    here = [f"{g}/{pack_stem(m, t)}" for g, m, t in found if g == gpu]
    other = sorted({g for g, _, _ in found if g != gpu})
    same = [f"{g}/{pack_stem(m, t)}" for g, m, t in found if g == gpu and m == model]
    fit = (same or here or [f"{gpu}/<model>"])[0]  # a pack of the same model (another TP) fits best
    return (f"no calibration pack for gpu={gpu} model={model} tp={tp}: {path} not found; "
            f"available for {gpu}: {', '.join(here) or 'none'}"
            f"{' (packs exist for ' + ', '.join(other) + ')' if other else ''}; "
            f"fallback: step_time: {{model: roofline, fit: {fit}}} fits the roofline's mfu, mbu and "
            f"overhead to a pack of {gpu}"
            f"{'' if here else ' (none yet: profile one with calibration/profile_gpu.py)'}")


@lru_cache(maxsize=64)
def _read_cached(path: str, mtime_ns: int) -> Pack:
    return read_pack(Path(path))


# --- reading and validating -------------------------------------------------------------------

def read_pack(csv_path: Path, yaml_path: Path | None = None) -> Pack:
    """Parse and validate one pack; the YAML defaults to the CSV's sibling."""
    csv_path = Path(csv_path)
    yaml_path = Path(yaml_path) if yaml_path else csv_path.with_suffix(".yaml")
    meta = read_meta(yaml_path)
    ops = read_rows(csv_path)
    pack = Pack(gpu=str(meta["gpu"]), model=str(meta["model"]), tp=int(meta["tp"]),
                csv_path=csv_path, meta=meta, ops=ops)
    return pack


def read_meta(yaml_path: Path) -> dict[str, Any]:
    if not yaml_path.is_file():
        raise PackError(f"{yaml_path}: pack metadata file not found (every pack CSV needs a YAML "
                        f"next to it, see calibration/PACK_FORMAT.md)")
    try:
        meta = yaml.safe_load(yaml_path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise PackError(f"{yaml_path}{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(meta, dict):
        raise PackError(f"{yaml_path}: metadata must be a mapping with keys {', '.join(REQUIRED_META)}")
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise PackError(f"{yaml_path}: metadata key '{missing[0]}' is missing; required: "
                        f"{', '.join(REQUIRED_META)}")
    if meta["gpu"] not in GPUS:
        raise PackError(f"{yaml_path}: unknown gpu '{meta['gpu']}'; allowed: {', '.join(sorted(GPUS))}")
    if meta["model"] not in MODELS:
        raise PackError(f"{yaml_path}: unknown model '{meta['model']}'; allowed: "
                        f"{', '.join(sorted(MODELS))}")
    if not isinstance(meta["tp"], int) or isinstance(meta["tp"], bool) or meta["tp"] < 1:
        raise PackError(f"{yaml_path}: tp must be an integer >= 1, got {meta['tp']!r}")
    if meta["source"] not in SOURCES:
        raise PackError(f"{yaml_path}: source must be one of {', '.join(SOURCES)}, got {meta['source']!r}")
    for key, allowed in (("quantization", WEIGHT_FORMATS), ("kv_cache_dtype", KV_CACHE_DTYPES)):
        if key in meta and meta[key] not in allowed:
            raise PackError(f"{yaml_path}: {key} {meta[key]!r} is unknown; allowed: {', '.join(allowed)}")
    shape = meta.get("shape")
    if shape is not None and not isinstance(shape, dict):
        raise PackError(f"{yaml_path}: shape must be a mapping of {', '.join(SHAPE_KEYS)}")
    return meta


def check_shape(pack: Pack, shape: ModelShape) -> None:
    """The pack's recorded shape must equal the model's: timings do not transfer across shapes.
    An expert model needs an expert pack that records its expert shape; latent attention (MLA)
    and dense first layers have no pack format."""
    recorded = pack.meta.get("shape") or {}
    where = pack.csv_path.with_suffix(".yaml")
    if shape.is_mla and "kv_lora_rank" not in recorded:
        raise PackError(f"{where}: model '{shape.name}' uses latent attention (MLA) but the pack records no "
                        f"shape.kv_lora_rank; allowed: a pack timed for latent attention "
                        f"(servesim calibrate derive, servesim/tools/derive_variants.py)")
    if shape.is_moe and shape.num_dense_layers and "num_dense_layers" not in recorded:
        raise PackError(f"{where}: model '{shape.name}' has {shape.num_dense_layers} dense first layers, "
                        f"which this expert pack does not price (no shape.num_dense_layers: every layer "
                        f"is timed as MoE)")
    if shape.is_moe and not pack.is_moe:
        raise PackError(f"{where}: model '{shape.name}' is a mixture of experts but the pack holds dense-MLP "
                        f"timings (no shape.num_experts, no moe_* ops)")
    if pack.is_moe and not shape.is_moe:
        raise PackError(f"{where}: the pack holds mixture-of-experts timings but model '{shape.name}' is dense")
    keys = SHAPE_KEYS + (MOE_SHAPE_KEYS + ("shared_expert_intermediate_size",) if shape.is_moe else ())
    # a derived pack folds dense first layers into its expert ops, and a latent-attention pack is
    # timed for its latent shape: both record those keys (servesim/tools/derive_variants.py)
    keys += tuple(k for k in ("num_dense_layers",) + MLA_SHAPE_KEYS if k in recorded)
    if pack.is_mla and not shape.is_mla:
        raise PackError(f"{where}: the pack holds latent-attention (MLA) timings but model '{shape.name}' "
                        f"uses grouped-query attention")
    for key in keys:
        if key in MOE_SHAPE_KEYS and key not in recorded:
            raise PackError(f"{where}: shape.{key} is missing; an expert pack records "
                            f"{', '.join(MOE_SHAPE_KEYS)}")
        have = recorded.get(key, 0 if key == "shared_expert_intermediate_size" else None)
        if have is not None and int(have) != getattr(shape, key):
            raise PackError(f"{where}: shape.{key} is {have} but "
                            f"model '{shape.name}' has {getattr(shape, key)}; a pack only fits the "
                            f"shape it was measured for")


def check_precision(pack: Pack, shape: ModelShape) -> None:
    """The pack's weight dtype, quantization scheme and KV-cache dtype must be the model's: a
    GEMM or an attention read timed in one precision does not price another."""
    where = pack.csv_path.with_suffix(".yaml")
    if pack.quantization != shape.quantization:
        raise PackError(f"{where}: quantization is {pack.quantization} but model '{shape.name}' runs "
                        f"{shape.quantization}; a pack only fits the precision it was measured in")
    want = WEIGHT_DTYPES.get(shape.quantization)
    have = str(pack.meta.get("dtype", "bf16")).lower()
    have = _DTYPE_ALIASES.get(have, have)
    if shape.quantization == "none":
        want = {1: "fp8", 2: "bf16", 4: "fp32"}.get(shape.dtype_bytes)  # 16 bits: bf16 or fp16 packs
    if want is not None and have != want:
        raise PackError(f"{where}: dtype is {pack.meta.get('dtype')} but model '{shape.name}' "
                        f"(quantization {shape.quantization}) runs {want} weights")
    if pack.kv_cache_dtype != shape.kv_cache_dtype:
        raise PackError(f"{where}: kv_cache_dtype is {pack.kv_cache_dtype} but model '{shape.name}' runs "
                        f"kv_cache_dtype {shape.kv_cache_dtype}; attention timed on one KV dtype does not "
                        f"price another")


def _parse_int(text: str, where: str, col: str) -> int:
    try:
        value = int(text) if text.strip() else 0
    except ValueError:
        try:
            f = float(text)
        except ValueError:
            f = math.nan
        if not f.is_integer():
            raise PackError(f"{where}: {col} '{text}' is not an integer; allowed: integers >= 0") from None
        value = int(f)
    if value < 0:
        raise PackError(f"{where}: {col} {value} is negative; allowed: integers >= 0")
    return value


def read_rows(csv_path: Path) -> dict[str, OpRows]:
    """Read and check every row; returns rows grouped by op."""
    if not csv_path.is_file():
        raise PackError(f"{csv_path}: pack file not found")
    cols: dict[str, list[list[float]]] = {}
    with csv_path.open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise PackError(f"{csv_path}: empty file; expected header {','.join(COLUMNS)}")
        header = [h.strip() for h in header]
        if sorted(header) != sorted(COLUMNS):
            missing = [c for c in COLUMNS if c not in header]
            extra = [c for c in header if c not in COLUMNS]
            what = (f"missing column '{missing[0]}'" if missing else f"unexpected column '{extra[0]}'")
            raise PackError(f"{csv_path} line 1: {what}; expected columns {','.join(COLUMNS)}")
        idx = {c: header.index(c) for c in COLUMNS}
        for lineno, row in enumerate(reader, start=2):
            if not row or all(not c.strip() for c in row):
                continue
            where = f"{csv_path} line {lineno}"
            if len(row) != len(header):
                raise PackError(f"{where}: {len(row)} fields, expected {len(header)} ({','.join(header)})")
            op = row[idx["op"]].strip()
            if op not in OPS:
                raise PackError(f"{where}: unknown op '{op}'; allowed: {', '.join(OPS)}")
            ints = [_parse_int(row[idx[c]], where, c) for c in ("tokens", "batch", "context", "bytes")]
            time_ms = _parse_time(row[idx["time_ms"]], where, op)
            std_txt = row[idx["std_ms"]].strip()
            std = _parse_std(std_txt, where, op) if std_txt else math.nan
            cols.setdefault(op, []).append([*ints, time_ms, std, lineno])
    if not cols:
        raise PackError(f"{csv_path}: no data rows")
    out = {}
    for op, rows in cols.items():
        a = np.asarray(rows, dtype=np.float64)
        out[op] = OpRows(tokens=a[:, 0].astype(np.int64), batch=a[:, 1].astype(np.int64),
                         context=a[:, 2].astype(np.int64), bytes=a[:, 3].astype(np.int64),
                         time_ms=a[:, 4], std_ms=a[:, 5], line=a[:, 6].astype(np.int64))
        _check_keys(csv_path, op, out[op])
    return out


def _parse_time(text: str, where: str, op: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise PackError(f"{where}: op {op} time_ms '{text}' is not a number; allowed: finite > 0") from None
    if not math.isfinite(value) or value <= 0:
        raise PackError(f"{where}: op {op} time_ms {text.strip()} is not allowed; time_ms must be "
                        f"finite and > 0")
    return value


def _parse_std(text: str, where: str, op: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise PackError(f"{where}: op {op} std_ms '{text}' is not a number; allowed: empty or "
                        f"finite >= 0") from None
    if not math.isfinite(value) or value < 0:
        raise PackError(f"{where}: op {op} std_ms {text.strip()} is not allowed; std_ms must be empty "
                        f"or finite >= 0")
    return value


#: Which key columns must be positive for each op family (the others are ignored).
_KEYS = {**{op: ("tokens",) for op in LAYER_TOKEN_OPS + MOE_OPS + ITERATION_TOKEN_OPS},
         "attn_prefill": ("tokens",), "attn_decode": ("batch",),
         "overhead_eager": ("batch",), "overhead_cuda_graph": ("batch",),
         "all_reduce": ("batch", "bytes"), "send_recv": ("batch", "bytes")}


def _check_keys(csv_path: Path, op: str, rows: OpRows) -> None:
    for key in _KEYS[op]:
        bad = np.flatnonzero(getattr(rows, key) <= 0)
        if bad.size:
            raise PackError(f"{csv_path} line {rows.line[bad[0]]}: op {op} needs {key} >= 1, got "
                            f"{getattr(rows, key)[bad[0]]}")


# --- writing (importers and profilers) --------------------------------------------------------

def write_pack(rows: list[tuple], meta: Mapping[str, Any], csv_path: Path) -> None:
    """Write rows ``(op, tokens, batch, context, bytes, time_ms, std_ms)`` and the YAML next to them.

    Times are written with 9 significant digits, which keeps the
    imported medians exact (Vidur stores microsecond-resolution values).
    """
    csv_path = Path(csv_path)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with csv_path.open("w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(COLUMNS)
        for op, tokens, batch, context, nbytes, t, std in rows:
            std_txt = "" if std is None or not math.isfinite(std) else f"{std:.6g}"
            w.writerow([op, int(tokens), int(batch), int(context), int(nbytes), f"{t:.9g}", std_txt])
    with csv_path.with_suffix(".yaml").open("w") as fh:
        yaml.safe_dump(dict(meta), fh, sort_keys=False, width=100)
