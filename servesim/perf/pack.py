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
from servesim.models import MODELS, ModelShape

COLUMNS: tuple[str, ...] = ("op", "tokens", "batch", "context", "bytes", "time_ms", "std_ms")

#: Per-layer ops keyed by the iteration's token count, in forward order.
LAYER_TOKEN_OPS: tuple[str, ...] = (
    "input_norm", "qkv_proj", "rope", "kv_write", "o_proj", "post_attn_norm",
    "gate_up_proj", "act", "down_proj", "residual_add",
)
#: Once-per-iteration ops keyed by tokens (``embed``: all tokens; the others: sampled rows).
ITERATION_TOKEN_OPS: tuple[str, ...] = ("embed", "final_norm", "lm_head")
ATTENTION_OPS: tuple[str, ...] = ("attn_prefill", "attn_decode")
OVERHEAD_OPS: tuple[str, ...] = ("overhead_eager", "overhead_cuda_graph")
COMM_OPS: tuple[str, ...] = ("all_reduce", "send_recv")
OPS: tuple[str, ...] = LAYER_TOKEN_OPS + ITERATION_TOKEN_OPS + ATTENTION_OPS + OVERHEAD_OPS + COMM_OPS

REQUIRED_META: tuple[str, ...] = ("gpu", "model", "tp", "source")
#: measured on the GPU; imported from public profiles; derived from other models' measurements
SOURCES: tuple[str, ...] = ("measured", "imported", "derived")
SHAPE_KEYS: tuple[str, ...] = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                               "intermediate_size", "vocab_size")


def required_ops(tp: int = 1, pp: int = 1, cuda_graph: bool = False) -> tuple[str, ...]:
    """Ops a pack must hold to predict iterations at this parallelism and launch mode."""
    ops = LAYER_TOKEN_OPS + ITERATION_TOKEN_OPS + ATTENTION_OPS + ("overhead_eager",)
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
        """The model shape the pack was measured for (from ``servesim.models.MODELS``)."""
        return MODELS[self.model]

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


def pack_stem(model: str, tp: int) -> str:
    return model if tp == 1 else f"{model}-tp{tp}"


def pack_path(gpu: str, model: str, tp: int = 1, root: Path | None = None) -> Path:
    """CSV path of the pack for (gpu, model, tp); checks the names, not the file's existence."""
    _check_names(gpu, model, tp)
    return (root or pack_root()) / gpu / f"{pack_stem(model, tp)}.csv"


def available_packs(root: Path | None = None) -> list[tuple[str, str, int]]:
    """(gpu, model, tp) of every pack CSV found under the pack folder, sorted."""
    root = root or pack_root()
    found = []
    for csv_file in sorted(root.glob("*/*.csv")):
        gpu, stem = csv_file.parent.name, csv_file.stem
        model, tp = stem, 1
        if "-tp" in stem:
            head, _, tail = stem.rpartition("-tp")
            if tail.isdigit():
                model, tp = head, int(tail)
        found.append((gpu, model, tp))
    return sorted(found)


def _check_names(gpu: str, model: str, tp: int) -> None:
    if gpu not in GPUS:
        raise PackError(f"unknown GPU '{gpu}' for a calibration pack; allowed: {', '.join(sorted(GPUS))}")
    if model not in MODELS:
        raise PackError(f"unknown model '{model}' for a calibration pack; allowed: "
                        f"{', '.join(sorted(MODELS))}")
    if not isinstance(tp, int) or tp < 1:
        raise PackError(f"tensor-parallel degree must be an integer >= 1, got {tp!r}")


def load_pack(gpu: str, model: str | ModelShape, tp: int = 1) -> Pack:
    """Find and read the pack for (gpu, model, tp); a missing pack names what exists."""
    name = model.name if isinstance(model, ModelShape) else model
    path = pack_path(gpu, name, tp)
    if not path.is_file():
        raise PackError(missing_pack_message(gpu, name, tp, path))
    pack = _read_cached(str(path), path.stat().st_mtime_ns)
    if pack.gpu != gpu or pack.model != name or pack.tp != tp:
        raise PackError(f"{path.with_suffix('.yaml')}: metadata says gpu={pack.gpu} model={pack.model} "
                        f"tp={pack.tp}, but the file is named for gpu={gpu} model={name} tp={tp}")
    if isinstance(model, ModelShape):
        check_shape(pack, model)
    return pack


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
    shape = meta.get("shape")
    if shape is not None and not isinstance(shape, dict):
        raise PackError(f"{yaml_path}: shape must be a mapping of {', '.join(SHAPE_KEYS)}")
    return meta


def check_shape(pack: Pack, shape: ModelShape) -> None:
    """The pack's recorded shape must equal the model's: timings do not transfer across shapes."""
    recorded = pack.meta.get("shape") or {}
    for key in SHAPE_KEYS:
        if key in recorded and int(recorded[key]) != getattr(shape, key):
            raise PackError(f"{pack.csv_path.with_suffix('.yaml')}: shape.{key} is {recorded[key]} but "
                            f"model '{shape.name}' has {getattr(shape, key)}; a pack only fits the "
                            f"shape it was measured for")


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
_KEYS = {**{op: ("tokens",) for op in LAYER_TOKEN_OPS + ITERATION_TOKEN_OPS},
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
