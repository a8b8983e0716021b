"""Several request streams in one workload (``workload.streams``).

Each stream is drawn on its own, from random streams named after it (``chat/arrivals``,
``chat/prompt``, ...), so adding, removing or changing one stream never moves another stream's
numbers. Streams that ``share`` the workload's arrival process split its arrivals by a categorical
draw (random stream ``share``), one draw per arrival, with probabilities share / sum of shares.

The streams are then merged into one request table::

    rows:  | closed loop A (in send order) | closed loop B | open-loop rows of every stream, by time |
           └──────── closed_groups ───────┘

Open-loop rows are sorted by arrival (ties keep stream order) and cut to the stop condition. A
closed-loop stream is a group of clients of its own; its rows arrive during the run (the
engine's inbox, :mod:`servesim.engine.inbox`). Prefix chains of different streams are
mapped to the smallest block size among them (sound for any sizes, see
:func:`~servesim.workload.sessions.expand_prefix_blocks`) and keyed by the stream's name, so two
streams never share prefix-cache blocks by accident of numbering; session ids are made distinct.
"""

from __future__ import annotations

import dataclasses
import zlib
from pathlib import Path

import numpy as np

from servesim.request import ClosedGroup, Workload
from servesim.config.arrivals import ClosedArrival, scaled
from servesim.workload.arrivals import sample_arrivals
from servesim.workload.contaminate import contaminate
from servesim.workload.dists import sample_lengths
from servesim.workload.chains import expand_prefix_blocks, mix
from servesim.workload.closed import FASTEST_REQUEST_S, closed_rows, ramp_starts, think_times
from servesim.workload.cut import cut
from servesim.workload.servegen import servegen_arrivals, servegen_notes
from servesim.workload.sessions import synthesize_sessions, topped_up_sessions
from servesim.config.streams import StreamConfig, StreamSpec, WorkloadConfig
from servesim.workload.streams import stream
from servesim.config.traces import ServeGenArrivalConfig
from servesim.workload.traces import _take_ragged, load_trace, sample_length_pairs

_STREAM_NS = 0x57EA_0000


def generate_streams(wc: WorkloadConfig, *, seed: int, base_dir: Path, max_requests: int | None,
                     duration_s: float | None, fastest_s: float = FASTEST_REQUEST_S) -> Workload:
    """The merged workload of ``wc.streams`` (see the module docstring)."""
    streams = wc.streams or []
    specs = wc.stream_specs()
    names = tuple(s.name for s in specs)
    n_stop, t_stop = max_requests, duration_s
    notes: list[str] = []
    open_parts: list[tuple[int, Workload]] = []  # (stream index, its open-loop requests)
    closed_parts: list[tuple[Workload, ClosedArrival, np.ndarray]] = []
    shared_times: dict[int, np.ndarray] = {}
    sharing = [i for i, s in enumerate(streams) if s.share is not None]
    if sharing:
        arrival = scaled(wc.arrival, wc.rate_scale)
        p = np.array([streams[i].share for i in sharing], dtype=np.float64)
        p /= p.sum()
        if isinstance(arrival, ClosedArrival):
            n = closed_rows(arrival, n_stop, t_stop, fastest_s)
            who = np.asarray(sharing)[stream(seed, "share").choice(len(sharing), n, p=p)]
            part = _closed_lengths(streams, who, seed, base_dir, names)
            for i in sharing:
                part = _contaminate(wc, streams[i], i, part, who == i, seed, specs)
            closed_parts.append((part, arrival, think_times(arrival, n, stream(seed, "think"))))
        else:
            times, tnotes = _open_times(arrival, base_dir, stream(seed, "arrivals"), n_stop, t_stop)
            notes += tnotes
            who = stream(seed, "share").choice(len(sharing), len(times), p=p)
            for j, i in enumerate(sharing):
                shared_times[i] = times[who == j]
        mix_text = ":".join(f"{streams[i].share:g}" for i in sharing)
        notes.append(f"workload.arrival ({_describe(arrival)}) split {mix_text} between "
                     + ", ".join(streams[i].name for i in sharing))
    for i, s in enumerate(streams):
        if s.share is not None and i not in shared_times:
            continue  # a share of a closed loop: drawn with that loop above
        if s.trace is not None:
            trace = s.trace
            if wc.rate_scale != 1.0:
                trace = trace.model_copy(update={"rate_scale": trace.rate_scale * wc.rate_scale})
            part = cut(load_trace(trace, base_dir, None), n_stop, t_stop)
            part = _as_stream(part, i, s, names)
        elif isinstance(s.arrival, ClosedArrival):
            arrival = s.arrival
            n = closed_rows(arrival, n_stop, t_stop, fastest_s)
            part = _closed_lengths(streams, np.full(n, i), seed, base_dir, names)
            part = _contaminate(wc, s, i, part, np.ones(n, dtype=bool), seed, specs)
            closed_parts.append((part, arrival, think_times(arrival, n, stream(seed, f"{s.name}/think"))))
            continue
        else:
            if s.share is not None:
                times = shared_times[i]
            elif s.sessions is not None:  # its own session starts: drawn until they give enough turns
                own = scaled(s.arrival, wc.rate_scale)
                w, tnotes = topped_up_sessions(
                    s.sessions, lambda m: _open_times(own, base_dir, stream(seed, f"{s.name}/arrivals"), m, t_stop),
                    lambda: stream(seed, f"{s.name}/sessions"), base_dir, n_stop, t_stop,
                    f"workload.streams.{s.name}.sessions")
                notes += [f"stream {s.name}: {t}" for t in tnotes]
                part = _as_stream(dataclasses.replace(w, notes=tuple(f"stream {s.name}: {x}" for x in w.notes)),
                                  i, s, names)
                part = _contaminate(wc, s, i, part, np.ones(len(part), dtype=bool), seed, specs)
                open_parts.append((i, part))
                continue
            else:
                times, tnotes = _open_times(scaled(s.arrival, wc.rate_scale), base_dir,
                                            stream(seed, f"{s.name}/arrivals"), n_stop, t_stop)
                notes += [f"stream {s.name}: {t}" for t in tnotes]
            part = _open_part(s, i, times, seed, base_dir, n_stop, t_stop, names)
        part = _contaminate(wc, s, i, part, np.ones(len(part), dtype=bool), seed, specs)
        open_parts.append((i, part))
    merged = cut(_merge_open(open_parts, names), n_stop, t_stop) if open_parts else None
    if wc.rate_scale != 1.0:
        notes.append(f"workload.rate_scale {wc.rate_scale:g}: open-loop arrival rates multiplied"
                     + ("; closed loops keep their clients" if closed_parts else ""))
    return _assemble(closed_parts, merged, names, streams, specs, tuple(notes))


# ----------------------------------------------------------------------------- one stream
def _open_times(arrival, base_dir: Path, rng: np.random.Generator, n: int | None,
                t: float | None) -> tuple[np.ndarray, tuple[str, ...]]:
    if isinstance(arrival, ServeGenArrivalConfig):
        times = servegen_arrivals(arrival, base_dir, rng, n_max=n, duration_s=t)
        return times, servegen_notes(arrival, base_dir, times)
    return sample_arrivals(arrival, rng, n, t), ()


def _lengths(s: StreamConfig, n: int, seed: int, base_dir: Path) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    if s.lengths is not None:
        p, o, notes = sample_length_pairs(s.lengths, base_dir, n, stream(seed, f"{s.name}/lengths"))
        return p, o, tuple(f"stream {s.name}: {x}" for x in notes)
    p = sample_lengths(s.prompt, n, stream(seed, f"{s.name}/prompt"))
    o = sample_lengths(s.output, n, stream(seed, f"{s.name}/output"))
    return p, o, ()


def _open_part(s: StreamConfig, i: int, times: np.ndarray, seed: int, base_dir: Path, n_stop: int | None,
               t_stop: float | None, names: tuple[str, ...]) -> Workload:
    if s.sessions is not None:
        return _as_stream(_sessions(s, times, seed, base_dir, n_stop, t_stop), i, s, names)
    p, o, notes = _lengths(s, len(times), seed, base_dir)
    w = Workload(arrival_s=times, prompt_tokens=p.astype(np.int32), output_tokens=o.astype(np.int32),
                 klass=np.zeros(len(times), dtype=np.int8), notes=notes)
    return _as_stream(w, i, s, names)


def _sessions(s: StreamConfig, times, seed, base_dir, n_stop, t_stop) -> Workload:
    w = synthesize_sessions(s.sessions, times, stream(seed, f"{s.name}/sessions"), base_dir,
                            max_requests=n_stop, until_s=t_stop)
    return dataclasses.replace(w, notes=tuple(f"stream {s.name}: {x}" for x in w.notes))


def _as_stream(w: Workload, i: int, s: StreamConfig, names: tuple[str, ...]) -> Workload:
    """``w`` labelled as stream ``i`` with the stream's SLA class."""
    n = len(w)
    return dataclasses.replace(w, klass=np.full(n, s.sla_class, dtype=np.int8), stream=np.full(n, i, dtype=np.int16),
                               stream_names=names)


def _closed_lengths(streams: list[StreamConfig], who: np.ndarray, seed: int, base_dir: Path,
                    names: tuple[str, ...]) -> Workload:
    """Rows of one closed loop (NaN arrivals), row ``r`` of stream ``who[r]``, lengths drawn per
    stream for its rows."""
    n = len(who)
    prompt = np.empty(n, dtype=np.int32)
    output = np.empty(n, dtype=np.int32)
    klass = np.empty(n, dtype=np.int8)
    notes: tuple[str, ...] = ()
    for i in np.unique(who).tolist():
        rows = who == i
        s = streams[i]
        p, o, ln = _lengths(s, int(rows.sum()), seed, base_dir)
        prompt[rows], output[rows], klass[rows] = p, o, s.sla_class
        notes += ln
    return Workload(arrival_s=np.full(n, np.nan), prompt_tokens=prompt, output_tokens=output, klass=klass,
                    stream=who.astype(np.int16), stream_names=names, notes=notes)


def _contaminate(wc: WorkloadConfig, s: StreamConfig, i: int, w: Workload, rows: np.ndarray, seed: int,
                 specs: tuple[StreamSpec, ...]) -> Workload:
    cfg = s.contaminate if s.contaminate is not None else wc.contaminate
    if cfg is None:
        return w
    return contaminate(w, rows, cfg, specs, stream(seed, f"{s.name}/contaminate"), source=s.name)


# --------------------------------------------------------------------------------- merging
def _merge_open(indexed: list[tuple[int, Workload]], names: tuple[str, ...]) -> Workload:
    """One workload of every stream's open-loop part, sorted by arrival (stable: ties keep stream
    order)."""
    parts = [w for _, w in indexed]
    chained = [w.prefix_block_tokens for w in parts if w.has_prefixes]
    block = min(chained) if chained else 0
    lens, hashes, sessions = [], [], []
    next_session = 0
    for i, w in indexed:
        if w.has_prefixes:
            w = expand_prefix_blocks(w, block) if w.prefix_block_tokens != block else w
            key = np.full(1, _STREAM_NS ^ zlib.crc32(names[i].encode()), dtype=np.int64)
            lens.append(np.diff(w.prefix_offsets))
            hashes.append(mix(key, w.prefix_hashes))
        else:
            lens.append(np.zeros(len(w), dtype=np.int64))
        if w.session is not None:
            sess = np.where(w.session >= 0, w.session + next_session, -1)
            next_session = int(sess.max()) + 1 if len(sess) and sess.max() >= 0 else next_session
        else:
            sess = np.full(len(w), -1, dtype=np.int64)
        sessions.append(sess)
    order = np.argsort(np.concatenate([w.arrival_s for w in parts]), kind="stable")

    def col(name):
        return np.concatenate([getattr(w, name) for w in parts])[order]

    offsets = prefix = None
    if chained:
        all_lens = np.concatenate(lens)
        offsets, prefix = _take_ragged(np.concatenate([[0], np.cumsum(all_lens)]).astype(np.int64),
                                       np.concatenate(hashes) if hashes else np.empty(0, np.int64), order)
    any_session = any(w.session is not None for w in parts)
    return Workload(
        arrival_s=col("arrival_s"), prompt_tokens=col("prompt_tokens"), output_tokens=col("output_tokens"),
        klass=col("klass"), stream=col("stream"), stream_names=names,
        session=np.concatenate(sessions)[order] if any_session else None,
        prefix_offsets=offsets, prefix_hashes=prefix, prefix_block_tokens=block,
        notes=tuple(x for w in parts for x in w.notes),
    )


def _assemble(closed: list[tuple[Workload, ClosedArrival, np.ndarray]], open_w: Workload | None,
              names: tuple[str, ...], streams: list[StreamConfig], specs: tuple[StreamSpec, ...],
              notes: tuple[str, ...]) -> Workload:
    """Closed-loop groups first (each contiguous, in send order), then the open-loop rows."""
    parts = [w for w, _, _ in closed] + ([open_w] if open_w is not None else [])
    groups, lo = [], 0
    for w, a, think in closed:
        groups.append(ClosedGroup(lo, lo + len(w), a.clients, ramp_starts(a), think))
        lo += len(w)
    if open_w is not None and not closed:
        w = open_w
    else:
        w = _concat(parts, names)
    counts = np.bincount(w.stream, minlength=len(names))
    in_closed = {int(i) for g, _, _ in closed for i in np.unique(g.stream)}
    lines = [f"stream {spec.name}" + (f" ({spec.label})" if spec.label else "") + f": {int(counts[spec.index]):,} "
             + ("requests drawn for its closed loop" if spec.index in in_closed else "requests")
             for spec in specs]
    return dataclasses.replace(w, closed_groups=tuple(groups), notes=notes + tuple(lines) + w.notes)


def _concat(parts: list[Workload], names: tuple[str, ...]) -> Workload:
    """Rows of ``parts`` one after another (no sorting); prefix chains padded with empty rows."""
    chained = [w for w in parts if w.has_prefixes]
    offsets = prefix = None
    block = 0
    if chained:
        block = chained[0].prefix_block_tokens
        lens = np.concatenate([np.diff(w.prefix_offsets) if w.has_prefixes else np.zeros(len(w), np.int64)
                               for w in parts])
        offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        prefix = np.concatenate([w.prefix_hashes for w in chained])
    any_session = any(w.session is not None for w in parts)
    return Workload(
        arrival_s=np.concatenate([w.arrival_s for w in parts]),
        prompt_tokens=np.concatenate([w.prompt_tokens for w in parts]).astype(np.int32),
        output_tokens=np.concatenate([w.output_tokens for w in parts]).astype(np.int32),
        klass=np.concatenate([w.klass for w in parts]),
        stream=np.concatenate([w.stream for w in parts]),
        stream_names=names,
        session=np.concatenate([w.session if w.session is not None else np.full(len(w), -1, np.int64)
                                for w in parts]) if any_session else None,
        prefix_offsets=offsets, prefix_hashes=prefix, prefix_block_tokens=block,
        notes=tuple(x for w in parts for x in w.notes),
    )


def _describe(arrival) -> str:
    d = arrival.model_dump()
    return ", ".join(f"{k} {v}" for k, v in d.items() if v is not None and k != "process") + f" ({d['process']})"
