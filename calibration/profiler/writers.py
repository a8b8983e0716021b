"""Writing and reading the profiler's files, torch-free: pack rows (calibration/PACK_FORMAT.md's
columns; a non-positive or non-finite time is refused, never written), validation columns, and
the YAML beside each CSV (PyYAML where installed, else a small block-style writer).

Why not servesim.perf.pack.write_pack: it writes 9 significant digits for imported medians and
needs servesim's dependencies, which the GPU machines lack; these files keep the 6 digits every
measured pack was written with. tests/test_calibration_profiler.py holds ``COLUMNS`` equal to
servesim's and reads what ``write_rows`` writes with servesim's pack reader.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np

try:  # optional: nicer YAML; a small writer below is used without it
    import yaml  # type: ignore
except Exception:  # pragma: no cover - depends on the machine
    yaml = None


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
