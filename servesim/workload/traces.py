"""Replaying real workloads: trace files and length-pair files -> :class:`~servesim.request.Workload`.

Pure functions of (config, base_dir): no global state, no randomness except where a
``numpy.random.Generator`` is passed. Rows are streamed and validated by
:mod:`servesim.workload.trace_readers` (one line per malformed row; ``on_bad_row: skip`` counts
them); this module turns them into a replay: time window, length filters, sessions, classes,
prefix chains, rate scaling. Every loader returns header ``notes`` saying how many rows were kept
and why the others were dropped.

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

from functools import lru_cache
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from servesim.diskmemo import code_stamp, disk_memo
from servesim.errors import TraceError
from servesim.request import Workload
from servesim.workload.chains import chain_hashes, expand_prefix_blocks, session_chains
from servesim.workload.trace_readers import READERS, BadRows, read_pairs, resolve_path
from servesim.config.traces import ClassAssignmentConfig, LengthFilter, LengthsConfig, TraceConfig

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


def clip_total(prompt: np.ndarray, output: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Shorten pairs whose total exceeds ``limit``: the excess is taken from prompt and output in
    proportion to their shares (rounded up, each part keeping at least one token)."""
    total = prompt + output
    over = total > limit
    if not over.any():
        return prompt, output, 0
    excess = np.where(over, total - limit, 0)
    cut_p = np.ceil(excess * prompt / total).astype(np.int64)
    p = np.maximum(prompt - cut_p, 1)
    o = np.maximum(np.minimum(output, limit - p), 1)
    p = np.minimum(p, limit - o)
    return p, o, int(over.sum())


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
    lines: np.ndarray | None = None,
) -> np.ndarray:
    """Classes (int8, 0..4) by ``cfg``: first matching rule, else the mapped column, else the
    default. ``columns`` holds raw trace columns by name (needed by ``column`` and by rules that
    test a column); ``where`` (a file) and ``lines`` (each row's line in it) locate errors."""
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
                at = f":{lines[np.argmax(inverse == i)]}" if lines is not None else ""
                raise TraceError(
                    f"{where}{at}: column {cfg.column}: value {v!r} maps to no class "
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
    bad = BadRows(cfg.on_bad_row)
    rows = READERS[cfg.format](path, cfg, extra, bad)
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
        lines=cols["line"][src_rows],
    )
    if offsets is not None:
        offsets, hashes = _take_ragged(offsets, hashes, sel)
        if cfg.format == "mooncake":
            hashes = chain_hashes(offsets, hashes)
        refs, distinct = len(hashes), _distinct(hashes)
        notes.append(
            f"{label}: prefix chains in {block}-token blocks: {refs:,} block refs, {distinct:,} distinct "
            f"({1 - distinct / max(refs, 1):.0%} repeats)"
        )
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


def _distinct(x: np.ndarray) -> int:
    """Number of distinct values, sort-based (np.unique is slow on millions of int64)."""
    s = np.sort(x)
    return int(len(s) > 0) + int(np.count_nonzero(s[1:] != s[:-1]))


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


@lru_cache(maxsize=16)
def _cached_pairs(path_s: str, mtime_ns: int, size: int, cfg: LengthsConfig) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Filtered pairs of one file version; read-only arrays, so sharing them is safe (a sweep
    samples the same file thousands of times). Kept on disk too: reading a trace of tens of
    thousands of rows is a tenth of a second of every small run's start-up."""
    key = (path_s, mtime_ns, size, cfg.model_dump_json(), code_stamp(_PAIRS_CODE))
    p, o, notes = disk_memo("length-pairs", key, lambda: _filtered_pairs(Path(path_s), cfg))
    p.setflags(write=False)
    o.setflags(write=False)
    return p, o, notes


# the sources filtered pairs derive from, besides the file itself (they key the disk memo)
_PAIRS_CODE = ("workload/traces.py", "workload/trace_readers.py", "config/traces.py", "fields.py")


def _filtered_pairs(path: Path, cfg: LengthsConfig) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    label = f"lengths {path.name}"
    bad = BadRows(cfg.on_bad_row)
    prompt, output, read = read_pairs(path, cfg, bad)
    keep, reasons = length_filter(cfg, prompt, output)
    p, o = prompt[keep].copy(), output[keep].copy()
    notes = bad.note(label) + (_summary(label, read, 0, len(p), reasons, ""),)
    if cfg.clip_total is not None:
        p, o, clipped = clip_total(p, o, cfg.clip_total)
        notes += (f"{label}: {clipped:,} pairs clipped to {cfg.clip_total:,} total tokens (proportionally)",)
    if len(p) == 0:
        raise TraceError(f"{path}: no length pairs left after the filters ({notes[-1]})")
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
