"""Reading trace and length files row by row, with validation.

Files are streamed (``csv`` / one JSON object per line; ``.gz`` transparently) into compact typed
buffers (``array``), so a large trace is never held twice, and rows outside the replay window
are dropped as they are read. A malformed row becomes one line, ``FILE:LINE: column COL: VALUE is
not ...``: raised at once with ``on_bad_row: error``, counted (and the first one shown in the run
header) with ``on_bad_row: skip``. The replay logic on top of these readers is in
:mod:`servesim.workload.traces`.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import zlib
from array import array
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from servesim.errors import TraceError
from servesim.fields import MAX_TOKENS
from servesim.config.traces import LengthsConfig, TraceConfig


# ------------------------------------------------------------------------------------ file I/O
def resolve_path(file: str, base_dir: Path | str | None) -> Path:
    """A path from a scenario: absolute as written, relative to the scenario file's folder."""
    p = Path(file).expanduser()
    if not p.is_absolute() and base_dir is not None:
        p = Path(base_dir) / p
    return p


def _open_text(path: Path) -> io.TextIOBase:
    if not path.is_file():
        raise TraceError(f"{path}: no such file" + (" (it is a folder)" if path.is_dir() else ""))
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


class BadRows:
    """``on_bad_row`` policy: raise the first malformed row, or count them."""

    def __init__(self, policy: str) -> None:
        self.policy = policy
        self.count = 0
        self.first = ""

    def __call__(self, message: str) -> None:
        if self.policy == "error":
            raise TraceError(message)
        self.count += 1
        self.first = self.first or message

    def note(self, label: str) -> tuple[str, ...]:
        if not self.count:
            return ()
        return (f"{label}: skipped {self.count:,} malformed rows (first: {self.first})",)


class _Bad(Exception):
    """A malformed field; carries the one-line message."""


def _int(value: object, where: str, col: str) -> int:
    """A token count 0..MAX_TOKENS; ``12``, ``"12"`` and ``"12.0"`` are accepted, nothing else.
    Larger counts are malformed rows (``on_bad_row`` applies): the engine's token columns are
    32-bit, where 4294967297 would read as 1 token."""
    x: int | None = None
    if isinstance(value, bool):
        x = None
    elif isinstance(value, int):
        x = value
    elif isinstance(value, float):
        x = int(value) if value.is_integer() else None
    elif isinstance(value, str):
        try:
            x = int(value)
        except ValueError:
            if value.strip().isdigit():  # over Python's 4,300 digits: far more than any count
                x = MAX_TOKENS + 1
            else:
                try:
                    f = float(value)
                    x = int(f) if f.is_integer() else None
                except ValueError:
                    x = None
    if x is None or x < 0:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise _Bad(f"{where}: column {col}: {shown} is not a non-negative integer")
    if x > MAX_TOKENS:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise _Bad(f"{where}: column {col}: {shown} tokens is more than the {MAX_TOKENS:,} a request may have")
    return x


def _seconds(value: object, where: str, col: str) -> float:
    try:
        f = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        f = float("nan")
    if not (math.isfinite(f) and f >= 0) or isinstance(value, bool):
        raise _Bad(f"{where}: column {col}: {value!r} is not a non-negative number")
    return f


def _csv_rows(path: Path, required: Sequence[str]) -> Iterator[tuple[int, dict[str, int], list[str]]]:
    """(line number, column index, fields) for each non-blank data row, after checking the
    header holds every ``required`` column. A row of the wrong width comes with empty fields
    (the caller reports it, so ``on_bad_row`` applies)."""
    with _open_text(path) as fh:
        reader = csv.reader(fh)
        try:
            header = next(reader, None)
            if header is None:
                raise TraceError(f"{path}: empty file (expected a header line with {', '.join(required)})")
            header = [h.strip().lstrip("\ufeff") for h in header]
            twice = [h for i, h in enumerate(header) if h in header[:i]]
            if twice:  # (the last copy was read silently)
                raise TraceError(f"{path}:1: column {twice[0]!r} appears twice in the header; allowed: each "
                                 f"column once (which copy holds the data is not known)")
            index = {h: i for i, h in enumerate(header)}
            missing = [c for c in required if c not in index]
            if missing:
                raise TraceError(
                    f"{path}:1: missing column {missing[0]!r} (header has: {', '.join(header)})"
                )
            width = len(header)
            for fields in reader:
                if not fields or (len(fields) == 1 and not fields[0].strip()):
                    continue
                if len(fields) != width:
                    yield reader.line_num, index, []  # empty = wrong width, reported by the caller
                    continue
                yield reader.line_num, index, fields
        except UnicodeDecodeError:
            raise TraceError(f"{path}: not UTF-8 text (a binary or compressed file without .gz?)") from None
        except csv.Error as exc:
            raise TraceError(f"{path}:{reader.line_num}: not valid CSV ({exc})") from None
        except _READ_ERRORS as exc:
            raise TraceError(_read_error(path, exc)) from None


def _jsonl_rows(path: Path) -> Iterator[tuple[int, object]]:
    """(line number, parsed value) per non-blank line; undecodable lines give the message."""
    with _open_text(path) as fh:
        try:
            for line_no, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    yield line_no, json.loads(line)
                except json.JSONDecodeError as exc:
                    yield line_no, _Bad(f"{path}:{line_no}: not a JSON object ({exc.msg} at column {exc.colno})")
                except ValueError:  # an integer over Python's 4,300 digits (no count is near that)
                    yield line_no, _Bad(f"{path}:{line_no}: holds an integer too long to read (over 4,300 digits)")
        except UnicodeDecodeError:
            raise TraceError(f"{path}: not UTF-8 text (a binary or compressed file without .gz?)") from None
        except _READ_ERRORS as exc:
            raise TraceError(_read_error(path, exc)) from None


_READ_ERRORS = (OSError, EOFError, zlib.error)  # a .gz that is not gzip, truncated, or corrupt


def _read_error(path: Path, exc: Exception) -> str:
    if path.suffix == ".gz":
        return f"{path}: not a readable gzip file ({exc}); a .gz trace must be gzip-compressed text"
    return f"{path}: cannot be read ({exc})"


# -------------------------------------------------------------------------------- row buffers
@dataclass
class Rows:
    """Columns of the rows kept while reading (typed buffers, not Python objects per row)."""

    extra_names: tuple[str, ...]
    line: array = field(default_factory=lambda: array("q"))
    t: array = field(default_factory=lambda: array("d"))
    prompt: array = field(default_factory=lambda: array("q"))
    output: array = field(default_factory=lambda: array("q"))
    hash_len: array = field(default_factory=lambda: array("q"))
    hash_ids: array = field(default_factory=lambda: array("q"))
    extras: list[list[str]] = field(default_factory=list)
    with_hashes: bool = False
    read: int = 0  # well-formed rows read (in or out of the window)
    outside: int = 0  # well-formed rows outside the time window

    def __post_init__(self) -> None:
        self.extras = [[] for _ in self.extra_names]

    def add(self, line: int, t: float, prompt: int, output: int, extras: Sequence[str], hashes=None) -> None:
        self.line.append(line)
        self.t.append(t)
        self.prompt.append(prompt)
        self.output.append(output)
        for buf, v in zip(self.extras, extras):
            buf.append(v)
        if hashes is not None:
            self.with_hashes = True
            self.hash_len.append(len(hashes))
            self.hash_ids.extend(hashes)

    def arrays(self) -> dict[str, np.ndarray]:
        """Zero-copy numpy views of the buffers (``offsets``/``hash_ids`` when rows had hashes)."""
        out = {name: _view(getattr(self, name)) for name in ("line", "t", "prompt", "output")}
        if self.with_hashes:
            out["offsets"] = np.concatenate([[0], np.cumsum(_view(self.hash_len))]).astype(np.int64)
            out["hash_ids"] = _view(self.hash_ids)
        return out


def _view(buf: array) -> np.ndarray:
    dtype = np.float64 if buf.typecode == "d" else np.int64
    return np.frombuffer(buf, dtype=dtype) if len(buf) else np.empty(0, dtype=dtype)


class _Window:
    """Trace-time window [start, end); rows before it are kept only when sessions need history."""

    def __init__(self, cfg: TraceConfig) -> None:
        self.start = cfg.start_s
        self.end = math.inf if cfg.duration_s is None else cfg.start_s + cfg.duration_s
        self.keep_history = cfg.sessions is not None

    def admits(self, t: float) -> bool:
        if t >= self.end:
            return False
        return self.keep_history or t >= self.start


# --------------------------------------------------------------------------------- readers
class _AzureClock:
    """Azure TIMESTAMP (``2023-11-16 18:17:03.9799600``, optionally with a UTC offset) -> seconds
    since the file's first row."""

    def __init__(self) -> None:
        self.t0: datetime | None = None

    def __call__(self, text: str, where: str, col: str) -> float:
        try:
            ts = datetime.fromisoformat(text)
        except ValueError:
            raise _Bad(f"{where}: column {col}: {text!r} is not a time like 2023-11-16 18:17:03.98") from None
        if self.t0 is None:
            self.t0 = ts
        try:
            return (ts - self.t0).total_seconds()
        except TypeError:
            raise _Bad(f"{where}: column {col}: {text!r} mixes time zones with the first row") from None


@dataclass(frozen=True)
class _CsvFormat:
    """Where a CSV trace keeps time, prompt and output, and how its time reads."""

    columns: tuple[str, ...]  # required header columns
    time: str
    prompt: str
    output: str
    clock: Callable[[], Callable[[str, str, str], float]]


_AZURE = _CsvFormat(("TIMESTAMP", "ContextTokens", "GeneratedTokens"), "TIMESTAMP", "ContextTokens",
                    "GeneratedTokens", _AzureClock)
# BurstGPT: Total tokens is derived and not checked; failed requests (0 response tokens) are
# well-formed rows that min_output drops.
_BURSTGPT = _CsvFormat(("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"),
                       "Timestamp", "Request tokens", "Response tokens", lambda: _seconds)


def _read_csv_trace(fmt: _CsvFormat, path: Path, cfg: TraceConfig, extra: tuple[str, ...], bad: BadRows) -> Rows:
    rows = Rows(extra)
    window = _Window(cfg)
    clock = fmt.clock()
    for line, index, f in _csv_rows(path, fmt.columns + extra):
        where = f"{path}:{line}"
        try:
            if not f:
                raise _Bad(f"{where}: expected {len(index)} fields like the header")
            t = clock(f[index[fmt.time]].strip(), where, fmt.time)
            prompt = _int(f[index[fmt.prompt]].strip(), where, fmt.prompt)
            output = _int(f[index[fmt.output]].strip(), where, fmt.output)
        except _Bad as exc:
            bad(str(exc))
            continue
        rows.read += 1
        if window.admits(t):
            rows.add(line, t, prompt, output, [f[index[c]].strip() for c in extra])
        else:
            rows.outside += 1
    return rows


def _read_mooncake(path: Path, cfg: TraceConfig, extra: tuple[str, ...], bad: BadRows) -> Rows:
    """Mooncake JSONL: ``timestamp`` ms; ``hash_ids`` one id per ``hash_block_tokens`` tokens of
    the prompt (the last block may be partial), so at most ceil(input_length / block) ids."""
    rows = Rows(extra)
    window = _Window(cfg)
    block = cfg.hash_block_tokens
    for line, obj in _jsonl_rows(path):
        where = f"{path}:{line}"
        try:
            if isinstance(obj, _Bad):
                raise obj
            if not isinstance(obj, dict):
                raise _Bad(f"{where}: not a JSON object (got {type(obj).__name__})")
            for key in ("timestamp", "input_length", "output_length", "hash_ids", *extra):
                if key not in obj:
                    raise _Bad(f"{where}: missing field {key!r}")
            t = _seconds(obj["timestamp"], where, "timestamp") / 1000.0
            prompt = _int(obj["input_length"], where, "input_length")
            output = _int(obj["output_length"], where, "output_length")
            ids = obj["hash_ids"]
            if not isinstance(ids, list) or not all(type(h) is int for h in ids):
                raise _Bad(f"{where}: column hash_ids: {str(ids)[:60]!r} is not a list of integers")
            if len(ids) > -(-prompt // block):
                raise _Bad(
                    f"{where}: column hash_ids: {len(ids)} blocks of {block} tokens exceed "
                    f"input_length {prompt} (at most {-(-prompt // block)})"
                )
            if any(not -(1 << 63) <= h < (1 << 63) for h in ids):
                raise _Bad(f"{where}: column hash_ids: an id does not fit in 64 bits")
        except _Bad as exc:
            bad(str(exc))
            continue
        rows.read += 1
        if window.admits(t):
            rows.add(line, t, prompt, output, [str(obj[c]) for c in extra], ids)
        else:
            rows.outside += 1
    return rows


READERS: dict[str, Callable[[Path, TraceConfig, tuple[str, ...], "BadRows"], Rows]] = {
    "azure": lambda *a: _read_csv_trace(_AZURE, *a),
    "burstgpt": lambda *a: _read_csv_trace(_BURSTGPT, *a),
    "mooncake": _read_mooncake,
}


def read_pairs(path: Path, cfg: LengthsConfig, bad: BadRows) -> tuple[np.ndarray, np.ndarray, int]:
    """(prompt, output, rows read) from a CSV with a header or a JSONL file (by suffix)."""
    prompt, output = array("q"), array("q")
    pc, oc = cfg.prompt_column, cfg.output_column
    read = 0
    if path.suffix in (".jsonl", ".json") or path.name.endswith(".jsonl.gz"):
        for line, obj in _jsonl_rows(path):
            where = f"{path}:{line}"
            try:
                if isinstance(obj, _Bad):
                    raise obj
                if not isinstance(obj, dict) or pc not in obj or oc not in obj:
                    raise _Bad(f"{where}: expected a JSON object with {pc!r} and {oc!r}")
                p, o = _int(obj[pc], where, pc), _int(obj[oc], where, oc)
            except _Bad as exc:
                bad(str(exc))
                continue
            prompt.append(p)
            output.append(o)
            read += 1
    else:
        for line, index, f in _csv_rows(path, (pc, oc)):
            where = f"{path}:{line}"
            try:
                if not f:
                    raise _Bad(f"{where}: expected {len(index)} fields like the header")
                p, o = _int(f[index[pc]].strip(), where, pc), _int(f[index[oc]].strip(), where, oc)
            except _Bad as exc:
                bad(str(exc))
                continue
            prompt.append(p)
            output.append(o)
            read += 1
    as_np = lambda a: np.frombuffer(a, dtype=np.int64) if len(a) else np.empty(0, np.int64)  # noqa: E731
    return as_np(prompt), as_np(output), read


