"""Replaying real workloads: trace files and length-pair files -> :class:`~servesim.request.Workload`.

Pure functions of (config, base_dir): no global state, no randomness except where a
``numpy.random.Generator`` is passed. Files are read row by row (``csv`` / one JSON object per
line, ``.gz`` transparently) into compact typed buffers, so a large trace is never held twice;
rows outside the replay window are dropped as they are read.

Every malformed row is reported as one line, ``FILE:LINE: column COL: VALUE is not ...``; with
``on_bad_row: skip`` such rows are counted instead and the run header says how many were skipped
and shows the first. Every loader returns header ``notes`` saying how many rows were kept and
why the others were dropped.

Formats (units in docs/traces.md; provenance in ../shared/traces/*/PROVENANCE.md):

=========  =========================================================  ===========================
format     columns                                                    time
=========  =========================================================  ===========================
azure      TIMESTAMP, ContextTokens, GeneratedTokens (CSV)            wall clock; 0 = first row
mooncake   timestamp, input_length, output_length, hash_ids (JSONL)   ms, as given
burstgpt   Timestamp, Model, Request tokens, Response tokens,         s, as given
           Total tokens, Log Type [, Session ID, Elapsed time] (CSV)
lengths    any two integer columns of a CSV with a header, or JSONL   (no arrivals)
=========  =========================================================  ===========================
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
from array import array
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import numpy as np

from servesim.errors import TraceError
from servesim.request import Workload
from servesim.workload.sessions import chain_hashes, expand_prefix_blocks, session_chains
from servesim.workload.trace_config import ClassAssignmentConfig, LengthFilter, LengthsConfig, TraceConfig

__all__ = [
    "assign_classes",
    "expand_prefix_blocks",
    "length_filter",
    "load_length_pairs",
    "load_trace",
    "replay_times",
    "resolve_path",
    "sample_length_pairs",
]


# ------------------------------------------------------------------------------------ file I/O
def resolve_path(file: str, base_dir: Path | str | None) -> Path:
    """A path from a scenario: absolute as written, relative to the scenario file's folder."""
    p = Path(file).expanduser()
    if not p.is_absolute() and base_dir is not None:
        p = Path(base_dir) / p
    return p


def _open_text(path: Path) -> io.TextIOBase:
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file" + (" (it is a folder)" if path.is_dir() else ""))
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


class _BadRows:
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
    """A non-negative integer; ``12``, ``"12"`` and ``"12.0"`` are accepted, nothing else."""
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
            try:
                f = float(value)
                x = int(f) if f.is_integer() else None
            except ValueError:
                x = None
    if x is None or x < 0:
        raise _Bad(f"{where}: column {col}: {value!r} is not a non-negative integer")
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
    header holds every ``required`` column. Field-count errors are raised as :class:`_Bad`."""
    with _open_text(path) as fh:
        reader = csv.reader(fh)
        try:
            header = next(reader, None)
            if header is None:
                raise TraceError(f"{path}: empty file (expected a header line with {', '.join(required)})")
            header = [h.strip().lstrip("\ufeff") for h in header]
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
        except UnicodeDecodeError:
            raise TraceError(f"{path}: not UTF-8 text (a binary or compressed file without .gz?)") from None


# -------------------------------------------------------------------------------- row buffers
@dataclass
class _Rows:
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
        out = {
            "line": np.frombuffer(self.line, dtype=np.int64) if len(self.line) else np.empty(0, np.int64),
            "t": np.frombuffer(self.t, dtype=np.float64) if len(self.t) else np.empty(0),
            "prompt": np.frombuffer(self.prompt, dtype=np.int64) if len(self.prompt) else np.empty(0, np.int64),
            "output": np.frombuffer(self.output, dtype=np.int64) if len(self.output) else np.empty(0, np.int64),
        }
        if self.with_hashes:
            lens = np.frombuffer(self.hash_len, dtype=np.int64) if len(self.hash_len) else np.zeros(0, np.int64)
            out["offsets"] = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
            out["hash_ids"] = np.frombuffer(self.hash_ids, dtype=np.int64) if len(self.hash_ids) else np.empty(0, np.int64)
        return out


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
def _read_azure(path: Path, cfg: TraceConfig, extra: tuple[str, ...], bad: _BadRows) -> _Rows:
    rows = _Rows(extra)
    window = _Window(cfg)
    cols = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
    t0: datetime | None = None
    for line, index, f in _csv_rows(path, cols + extra):
        where = f"{path}:{line}"
        try:
            if not f:
                raise _Bad(f"{where}: expected {len(index)} fields like the header")
            raw_ts = f[index["TIMESTAMP"]].strip()
            try:
                ts = datetime.fromisoformat(raw_ts)
            except ValueError:
                raise _Bad(f"{where}: column TIMESTAMP: {raw_ts!r} is not a time like 2023-11-16 18:17:03.98") from None
            if t0 is None:
                t0 = ts
            try:
                t = (ts - t0).total_seconds()
            except TypeError:
                raise _Bad(f"{where}: column TIMESTAMP: {raw_ts!r} mixes time zones with the first row") from None
            prompt = _int(f[index["ContextTokens"]], where, "ContextTokens")
            output = _int(f[index["GeneratedTokens"]], where, "GeneratedTokens")
        except _Bad as exc:
            bad(str(exc))
            continue
        rows.read += 1
        if window.admits(t):
            rows.add(line, t, prompt, output, [f[index[c]].strip() for c in extra])
        else:
            rows.outside += 1
    return rows


_BURST = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type")


def _read_burstgpt(path: Path, cfg: TraceConfig, extra: tuple[str, ...], bad: _BadRows) -> _Rows:
    """BurstGPT: ``Total tokens`` is not checked (it is derived); failed requests (Response
    tokens 0) fall to ``min_output``."""
    rows = _Rows(extra)
    window = _Window(cfg)
    for line, index, f in _csv_rows(path, _BURST + extra):
        where = f"{path}:{line}"
        try:
            if not f:
                raise _Bad(f"{where}: expected {len(index)} fields like the header")
            t = _seconds(f[index["Timestamp"]].strip(), where, "Timestamp")
            prompt = _int(f[index["Request tokens"]].strip(), where, "Request tokens")
            output = _int(f[index["Response tokens"]].strip(), where, "Response tokens")
        except _Bad as exc:
            bad(str(exc))
            continue
        rows.read += 1
        if window.admits(t):
            rows.add(line, t, prompt, output, [f[index[c]].strip() for c in extra])
        else:
            rows.outside += 1
    return rows


def _read_mooncake(path: Path, cfg: TraceConfig, extra: tuple[str, ...], bad: _BadRows) -> _Rows:
    """Mooncake JSONL: ``timestamp`` ms; ``hash_ids`` one id per ``hash_block_tokens`` tokens of
    the prompt (the last block may be partial), so at most ceil(input_length / block) ids."""
    rows = _Rows(extra)
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


_READERS = {"azure": _read_azure, "burstgpt": _read_burstgpt, "mooncake": _read_mooncake}


# ------------------------------------------------------------------------------- transforms
def length_filter(cfg: LengthFilter, prompt: np.ndarray, output: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Keep mask and the drop reasons (``"366 prompt > max_prompt 1024"``). A row failing several
    bounds is counted under the first, in the order the bounds are listed here."""
    total = prompt + output
    checks = [
        ("prompt < min_prompt", cfg.min_prompt, prompt < cfg.min_prompt),
        ("prompt > max_prompt", cfg.max_prompt, None if cfg.max_prompt is None else prompt > cfg.max_prompt),
        ("output < min_output", cfg.min_output, output < cfg.min_output),
        ("output > max_output", cfg.max_output, None if cfg.max_output is None else output > cfg.max_output),
        ("total > max_total", cfg.max_total, None if cfg.max_total is None else total > cfg.max_total),
    ]
    keep = np.ones(len(prompt), dtype=bool)
    reasons = []
    for text, bound, hit in checks:
        if hit is None:
            continue
        n = int(np.count_nonzero(hit & keep))
        keep &= ~hit
        if n:
            reasons.append(f"{n:,} {text} {bound:,}")
    return keep, reasons


def replay_times(t: np.ndarray, start_s: float, rate_scale: float, max_gap_s: float | None) -> np.ndarray:
    """Trace times (sorted) -> simulated arrival times: shift ``start_s`` to 0, shorten gaps
    longer than ``max_gap_s`` (including the lead-in from the window start), divide by
    ``rate_scale``."""
    a = np.asarray(t, dtype=np.float64) - start_s
    if max_gap_s is not None and len(a):
        a = np.cumsum(np.minimum(np.diff(a, prepend=0.0), max_gap_s))
    return a / rate_scale


def assign_classes(
    cfg: ClassAssignmentConfig | None,
    prompt: np.ndarray,
    output: np.ndarray,
    columns: Mapping[str, Sequence[str]] | None = None,
    where: str = "workload",
) -> np.ndarray:
    """Classes (int8, 0..4) by ``cfg``: first matching rule, else the mapped column, else the
    default. ``columns`` holds raw trace columns by name (needed by ``column`` and by rules that
    test a column); ``where`` prefixes error messages."""
    n = len(prompt)
    if cfg is None:
        return np.zeros(n, dtype=np.int8)
    columns = columns or {}
    for col in cfg.columns:
        if col not in columns:
            raise TraceError(f"{where}: classes use column {col!r}, which this workload does not have")
    klass = np.full(n, cfg.default, dtype=np.int8)
    if cfg.column is not None:
        uniq, inverse = np.unique(np.asarray(columns[cfg.column], dtype=str), return_inverse=True)
        mapped = np.empty(len(uniq), dtype=np.int8)
        for i, v in enumerate(uniq.tolist()):
            c = cfg.values.get(v, _klass_of(v))
            if c is None:
                allowed = ", ".join(sorted(cfg.values)) or "none"
                raise TraceError(
                    f"{where}: column {cfg.column}: value {v!r} maps to no class "
                    f"(classes.values has: {allowed}; a value may also be 0..4 or P0..P4)"
                )
            mapped[i] = c
        klass = mapped[inverse]
    total = prompt + output
    assigned = np.zeros(n, dtype=bool)
    for rule in cfg.rules:
        w = rule.when
        m = ~assigned
        for bound, arr, gt in (
            (w.prompt_gt, prompt, True), (w.prompt_lt, prompt, False), (w.output_gt, output, True),
            (w.output_lt, output, False), (w.total_gt, total, True), (w.total_lt, total, False),
        ):
            if bound is not None:
                m &= (arr > bound) if gt else (arr < bound)
        if w.column is not None:
            m &= np.asarray(columns[w.column], dtype=str) == w.equals
        klass[m] = rule.klass
        assigned |= m
    return klass


def _klass_of(v: str) -> int | None:
    s = v.strip().upper().removeprefix("P")
    return int(s) if s.isdigit() and int(s) < 5 else None


def _take_ragged(offsets: np.ndarray, values: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lens = np.diff(offsets)[idx]
    new = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    gather = np.repeat(offsets[:-1][idx] - new[:-1], lens) + np.arange(new[-1])
    return new, values[gather]


def _summary(label: str, read: int, outside: int, kept: int, reasons: list[str], window: str) -> str:
    in_window = read - outside
    text = f"{label}: kept {kept:,} of {in_window:,} rows"
    if outside:
        text = f"{label}: {window} holds {in_window:,} of {read:,} rows; kept {kept:,}"
    if reasons:
        text += f" (dropped {in_window - kept:,}: {', '.join(reasons)})"
    return text


# ------------------------------------------------------------------------------ public loaders
def load_trace(cfg: TraceConfig, base_dir: Path | str | None, classes: ClassAssignmentConfig | None = None) -> Workload:
    """Replay a trace file as a workload: arrivals, lengths, classes, and prefix chains (Mooncake
    ``hash_ids`` re-chained, 512-token blocks; trace sessions in ``sessions.block_tokens``)."""
    path = resolve_path(cfg.file, base_dir)
    label = f"{cfg.format} {path.name}"
    extra = tuple(dict.fromkeys((classes.columns if classes else ()) + ((cfg.sessions.column,) if cfg.sessions else ())))
    bad = _BadRows(cfg.on_bad_row)
    rows = _READERS[cfg.format](path, cfg, extra, bad)
    cols = rows.arrays()
    extras = {name: buf for name, buf in zip(extra, rows.extras)}
    notes: list[str] = list(bad.note(label))
    t = cols["t"]
    order = None
    if len(t) > 1 and np.any(np.diff(t) < 0):
        order = np.argsort(t, kind="stable")
        notes.append(f"{label}: rows were not in time order; sorted by timestamp (stable)")
    idx = order if order is not None else np.arange(len(t))
    prompt, output = cols["prompt"][idx], cols["output"][idx]
    t = t[idx]
    offsets = hashes = None
    block = 0
    if "offsets" in cols:
        offsets, hashes = _take_ragged(cols["offsets"], cols["hash_ids"], idx)
        block = cfg.hash_block_tokens
    session = None
    if cfg.sessions is not None:
        session = _session_codes([extras[cfg.sessions.column][i] for i in idx])
        prompt, offsets, hashes, restarted = session_chains(
            session, prompt, output, cfg.sessions.prompt, cfg.sessions.block_tokens
        )
        block = cfg.sessions.block_tokens
        n_sess = len(np.unique(session[session >= 0]))
        notes.append(
            f"{label}: {n_sess:,} sessions (prompt = {'trace value' if cfg.sessions.prompt == 'full' else 'history + new input'}"
            + (f"; {restarted:,} turns cut their history" if restarted else "") + ")"
        )
        in_window = t >= cfg.start_s
        rows.outside += int(np.count_nonzero(~in_window))
    else:
        in_window = np.ones(len(t), dtype=bool)
    keep, reasons = length_filter(cfg, prompt, output)
    sel = np.flatnonzero(keep & in_window)
    end = "end" if cfg.duration_s is None else f"{cfg.start_s + cfg.duration_s:,.0f} s"
    notes.append(_summary(label, rows.read, rows.outside, len(sel), reasons, f"window {cfg.start_s:,.0f} s–{end}"))
    if len(sel) == 0:
        raise TraceError(f"{path}: no rows left after the time window and length filters ({notes[-1]})")
    src_rows = idx[sel]
    klass = assign_classes(
        classes, prompt[sel], output[sel],
        {name: [buf[i] for i in src_rows] for name, buf in extras.items()}, where=str(path),
    )
    if offsets is not None:
        offsets, hashes = _take_ragged(offsets, hashes, sel)
        if cfg.format == "mooncake":
            hashes = chain_hashes(offsets, hashes)
    arrival = replay_times(t[sel], cfg.start_s, cfg.rate_scale, cfg.max_gap_s)
    span = float(arrival[-1]) if len(arrival) else 0.0
    notes.append(
        f"{label}: replay rate_scale {cfg.rate_scale:g}"
        + (f", gaps capped at {cfg.max_gap_s:g} s" if cfg.max_gap_s is not None else "")
        + f": {len(sel):,} requests over {span:,.1f} s"
        + (f" ({len(sel) / span:,.2f} req/s)" if span > 0 else "")
    )
    return Workload(
        arrival_s=arrival,
        prompt_tokens=prompt[sel].astype(np.int64),
        output_tokens=output[sel].astype(np.int64),
        klass=klass,
        session=None if session is None else session[sel],
        prefix_offsets=offsets,
        prefix_hashes=hashes,
        prefix_block_tokens=block if offsets is not None else 0,
        notes=tuple(notes),
    )


def _session_codes(values: Sequence[str]) -> np.ndarray:
    """Session strings -> int codes in first-seen order; empty, '-1', 'nan', 'None' = no session."""
    codes: dict[str, int] = {}
    out = np.empty(len(values), dtype=np.int64)
    for i, v in enumerate(values):
        if v in ("", "-1", "nan", "NaN", "None", "null"):
            out[i] = -1
        else:
            out[i] = codes.setdefault(v, len(codes))
    return out


def _read_pairs(path: Path, cfg: LengthsConfig, bad: _BadRows) -> tuple[np.ndarray, np.ndarray, int]:
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


@lru_cache(maxsize=16)
def _cached_pairs(path_s: str, mtime_ns: int, size: int, cfg: LengthsConfig) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Filtered pairs of one file version; read-only arrays, so sharing them is safe (a sweep
    samples the same file thousands of times)."""
    path = Path(path_s)
    label = f"lengths {path.name}"
    bad = _BadRows(cfg.on_bad_row)
    prompt, output, read = _read_pairs(path, cfg, bad)
    keep, reasons = length_filter(cfg, prompt, output)
    p, o = prompt[keep].copy(), output[keep].copy()
    notes = bad.note(label) + (_summary(label, read, 0, len(p), reasons, ""),)
    if len(p) == 0:
        raise TraceError(f"{path}: no length pairs left after the filters ({notes[-1]})")
    p.setflags(write=False)
    o.setflags(write=False)
    return p, o, notes


def load_length_pairs(cfg: LengthsConfig, base_dir: Path | str | None) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """All (prompt, output) pairs of a length file that pass the filters (read-only arrays) and
    the header notes."""
    path = resolve_path(cfg.file, base_dir)
    if not path.is_file():
        raise TraceError(f"{path}: no such length file" + (" (it is a folder)" if path.is_dir() else ""))
    st = path.stat()
    return _cached_pairs(str(path.resolve()), st.st_mtime_ns, st.st_size, cfg)


def sample_length_pairs(
    cfg: LengthsConfig, base_dir: Path | str | None, n: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """``n`` pairs drawn jointly (whole rows, uniformly, with replacement) from the filtered file,
    so the prompt/output correlation of the data is kept."""
    prompt, output, notes = load_length_pairs(cfg, base_dir)
    idx = rng.integers(0, len(prompt), n)
    return prompt[idx], output[idx], notes + (f"lengths: {n:,} requests sample rows jointly, with replacement",)
