"""Modes ``merge`` (measured collectives into the packs) and ``combine`` (packs measured in pieces
finished: rows kept, replaced or added from other packs, overheads as the median over
processes). Torch-free: they run on any machine, and the main test suite runs them."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

from .common import _csv_list, log, this_command
from .shapes import ALL_SHAPES, stem_tp
from .writers import read_rows, read_yaml, write_rows, write_yaml


def merge_collectives_into(pack_csv: Path, coll_csvs: list) -> None:
    """Put measured collectives into one pack: all_reduce rows whose group size equals the pack's
    TP (only for TP > 1) and send_recv rows (pipeline stages, any TP). Collective rows the pack
    already had are replaced, and the YAML records where the new ones came from."""
    tp = stem_tp(pack_csv.stem)
    add, sources, have_send = [], [], False
    for coll_csv in map(Path, coll_csvs):
        rows = read_rows(coll_csv)
        ar = [r for r in rows if r[0] == "all_reduce" and r[2] == tp and tp > 1]
        sr = [] if have_send else [r for r in rows if r[0] == "send_recv"]
        have_send = have_send or bool(sr)
        if ar or sr:
            ymeta = coll_csv.with_suffix(".yaml")
            cmeta = read_yaml(ymeta) if ymeta.is_file() else {}
            sources.append(dict(file=coll_csv.name, gpus=cmeta.get("gpus"), nccl=cmeta.get("nccl"),
                                method=cmeta.get("method"), command=cmeta.get("command"),
                                all_reduce_rows=len(ar), send_recv_rows=len(sr)))
        add += ar + sr
    rows = [r for r in read_rows(pack_csv) if r[0] not in ("all_reduce", "send_recv")] + add
    write_rows(pack_csv, rows)
    ymeta = pack_csv.with_suffix(".yaml")
    if ymeta.is_file():
        meta = read_yaml(ymeta)
        meta["collectives"] = sources or "none measured for this TP degree"
        meta["rows"] = len(rows)
        write_yaml(ymeta, meta)
    log(f"merged {len(add)} collective rows into {pack_csv}")


def cmd_merge(args) -> int:
    out = Path(args.out)
    for gpu_dir in sorted(p for p in (out / "packs").glob("*") if p.is_dir()):
        colls = sorted((out / "collectives" / gpu_dir.name).glob("collectives_*gpu.csv"))
        if not colls:
            log(f"no collectives for {gpu_dir.name}")
            continue
        for pack in sorted(gpu_dir.glob("*.csv")):
            merge_collectives_into(pack, colls)
    return 0


OVERHEAD_OPS = ("overhead_eager", "overhead_cuda_graph")


def cmd_combine(args) -> int:
    """Finish packs measured in pieces (all on this machine, no GPU needed):

    * ``--keep-from DIR --keep-ops a,b``: rows of those ops are taken from the packs of the same
      name in DIR (an earlier measurement: e.g. attn_prefill and the collectives when only the
      token ops and decode attention were re-measured); the YAML says where they came from.
    * ``--replace-from DIR --replace-ops a,b``: the opposite: rows of those ops come from the packs
      of the same name in DIR (a newer measurement of only those ops, e.g. a denser attn_prefill
      grid). A pack that DIR lacks, or that has no rows of an op, takes them from a pack in DIR
      whose rank shape gives that op the same kernel and input shapes (``OpBench.sig``: e.g.
      attention of llama-3-8b = qwen3-8b), keeping the points within its max_model_len: the
      measurement ``ops`` would have shared within one process.
    * ``--add-from DIR [--add-ops a,b] [--add-alias target:source,...]``: rows of DIR's pack of
      the same name (or of the aliased source pack, e.g. qwen3-4b:qwen3-8b for attention, whose
      kernels and input shapes are the same) are appended where the pack has no row at that point
      (op, tokens, batch, context, bytes) -- the ``--grid long`` extension of a dense pack. Only
      points within this model's max_model_len are taken; the YAML lists what came from where.
    * ``--overheads-from D1,D2``: overhead rows measured again in other processes (``ops --stages
      overhead --tables-from``, same tables) are combined with the pack's own by the median, per op
      and batch, of forward - tables over all processes; every process's value is kept in the YAML.
      Batches that only some processes measured take the median of those (a pack combined before
      contributes every process it already lists). Why: the eager launch time of one forward
      varies between processes on a VM host (5-22 ms seen on the lent H200), so one process is a
      poor sample of it.
    """
    out = Path(args.out)
    keep_ops = _csv_list(args.keep_ops or "")
    replace_ops = _csv_list(getattr(args, "replace_ops", None) or "")
    others = [Path(x) for x in _csv_list(args.overheads_from or "")]
    alias = dict(x.split(":", 1) for x in _csv_list(getattr(args, "add_alias", None) or ""))
    for gpu_dir in sorted(p for p in (out / "packs").glob("*") if p.is_dir()):
        for pack in sorted(gpu_dir.glob("*.csv")):
            rows = read_rows(pack)
            meta = read_yaml(pack.with_suffix(".yaml"))
            if getattr(args, "add_from", None):
                rows = _add_rows(rows, meta, pack, Path(args.add_from), _csv_list(args.add_ops or ""), alias)
            if replace_ops:
                rows, meta["replaced_rows"] = _replace_rows(rows, pack, Path(args.replace_from),
                                                            replace_ops)
                for op, note in meta["replaced_rows"]["per_op"].items():
                    meta.setdefault("timing_methods", {})[op] = note.pop("timing_methods", None)
                    sd = note.pop("sdpa", None)
                    if op.startswith("attn_") and sd:  # the attention rows' backend choice with them
                        meta["sdpa"], meta["sdpa_backend"] = sd, note.pop("sdpa_backend", None)
                    g = note.get("grid") or {}
                    if op == "attn_prefill" and g.get("prefill_chunk"):
                        meta.setdefault("grid", {}).update(prefill_chunk=g["prefill_chunk"],
                                                           prefill_context=g.get("prefill_context"))
            if keep_ops:
                old = Path(args.keep_from) / pack.name
                kept = [r for r in read_rows(old) if r[0] in keep_ops]
                rows = [r for r in rows if r[0] not in keep_ops] + kept
                oldmeta = read_yaml(old.with_suffix(".yaml"))
                meta["kept_rows"] = dict(
                    ops=keep_ops, rows=len(kept), from_pack=str(old),
                    measured=oldmeta.get("date"), command=oldmeta.get("command"),
                    method=oldmeta.get("method"), collectives=oldmeta.get("collectives"))
                if {"all_reduce", "send_recv"} & set(keep_ops) and oldmeta.get("collectives"):
                    meta["collectives"] = oldmeta["collectives"]
                for op in keep_ops:
                    if op in (oldmeta.get("timing_methods") or {}):
                        meta.setdefault("timing_methods", {})[op] = oldmeta["timing_methods"][op]
            if others:
                ov = meta.get("overhead") or {}
                pts = ov.get("points") or {}
                before = (ov.get("combined") or {}).get("points") or {}
                old_sources = (ov.get("combined") or {}).get("sources") or ["this pack"]
                per: dict = {}
                for key, v in pts.items():
                    if key in before:  # combined earlier: every process it already lists
                        per.setdefault(key, []).extend(float(x) for x in before[key]["diff_ms_per_process"])
                    else:
                        per.setdefault(key, []).append(float(v["diff_ms"]))
                std = {(r[0], int(r[2])): r[6] for r in rows if r[0] in OVERHEAD_OPS}
                for d in others:
                    src = d / "packs" / gpu_dir.name / pack.with_suffix(".yaml").name
                    if not src.exists():
                        log(f"  {src} missing: no overhead points from {d}")
                        continue
                    om = read_yaml(src)
                    for key, v in ((om.get("overhead") or {}).get("points") or {}).items():
                        per.setdefault(key, []).append(float(v["diff_ms"]))
                        op, b = key.split(" batch=")
                        if not math.isfinite(std.get((op, int(b)), float("nan"))):
                            std[(op, int(b))] = float(v.get("forward_std_ms", float("nan")))
                rows = [r for r in rows if r[0] not in OVERHEAD_OPS]
                combined = {}
                for key, diffs in sorted(per.items()):
                    op, b = key.split(" batch=")
                    med = float(np.median(diffs))
                    combined[key] = dict(diff_ms_per_process=[round(x, 5) for x in diffs],
                                         median_ms=round(med, 5))
                    if math.isfinite(med) and med > 0:
                        sd = std.get((op, int(b)), float("nan"))
                        rows.append((op, int(b), int(b), 0, 0, med, sd))
                ov["combined"] = dict(
                    processes=max(len(v) for v in per.values()) if per else 1 + len(others),
                    sources=list(old_sources) + [str(d) for d in others],
                    rule="median over processes of forward - table sum, per op and batch", points=combined)
                meta["overhead"] = ov
            rows = sorted(rows, key=lambda r: (r[0], int(r[2]), int(r[1]), int(r[3]), int(r[4])))
            write_rows(pack, rows)
            meta["rows"] = len(rows)
            if meta.get("combined"):  # a pack combined before keeps that record (e.g. its overheads')
                meta["combined_before"] = [*(meta.get("combined_before") or []), meta["combined"]]
            meta["combined"] = dict(command=this_command(), date=time.strftime("%Y-%m-%d"),
                                    note=args.note or "")
            write_yaml(pack.with_suffix(".yaml"), meta)
            log(f"combined {pack}: {len(rows)} rows")
    return 0


def _add_rows(rows: list, meta: dict, pack: Path, src_dir: Path, ops: list, alias: dict) -> list:
    """``combine --add-from``: append the source pack's rows at points this pack lacks."""
    name = alias.get(pack.stem, pack.stem)
    src = src_dir / f"{name}.csv"
    if not src.is_file():
        log(f"  {src} missing: nothing added to {pack.name}")
        return rows
    max_len = int((ALL_SHAPES.get(meta.get("model")) or {}).get("max_model_len", 1 << 62))
    have = {(r[0], int(r[1]), int(r[2]), int(r[3]), int(r[4])) for r in rows}
    added: dict = {}
    for r in read_rows(src):
        key = (r[0], int(r[1]), int(r[2]), int(r[3]), int(r[4]))
        if (ops and r[0] not in ops) or key in have or r[0] in OVERHEAD_OPS:
            continue
        if r[0] == "attn_prefill" and key[1] + key[3] > max_len:
            continue
        if r[0] == "attn_decode" and key[3] + 1 > max_len:
            continue
        rows.append(r)
        added[r[0]] = added.get(r[0], 0) + 1
    sm = read_yaml(src.with_suffix(".yaml"))
    meta.setdefault("added_rows", []).append(dict(
        from_pack=str(src), rows_per_op=added, measured=sm.get("date"), device=sm.get("device"),
        command=sm.get("command"), grid=sm.get("grid"), sdpa_backend=sm.get("sdpa_backend"),
        rule="appended at points this pack lacked (same op, kernel and input shapes)"))
    log(f"  {pack.name}: added {added} from {src}")
    return rows


def _attn_sig(meta: dict, op: str) -> tuple:
    rs = meta.get("rank_shape") or {}
    return (op, rs.get("num_heads"), rs.get("num_kv_heads"), rs.get("head_dim"))


def _replace_rows(rows: list, pack: Path, src_dir: Path, ops: list) -> tuple[list, dict]:
    """Rows of ``ops`` from ``src_dir``'s pack of the same name, else from a pack there whose
    rank shape gives the op the same kernel and input shapes (attention ops only), keeping the
    points within this model's max_model_len. Returns the rows and a provenance note."""
    meta = read_yaml(pack.with_suffix(".yaml"))
    max_len = ALL_SHAPES.get(meta.get("model"), {}).get("max_model_len")
    note: dict = dict(ops=ops, per_op={})
    rows = [r for r in rows if r[0] not in ops]
    for op in ops:
        src = src_dir / pack.name
        got = [r for r in read_rows(src) if r[0] == op] if src.exists() else []
        shared = False
        if not got and op.startswith("attn_"):
            for other in sorted(src_dir.glob("*.csv")):
                if other.name != pack.name and _attn_sig(read_yaml(other.with_suffix(".yaml")), op) \
                        == _attn_sig(meta, op):
                    cand = [r for r in read_rows(other) if r[0] == op]
                    if cand:
                        src, got, shared = other, cand, True
                        break
        if max_len:
            got = [r for r in got if r[1] + r[3] <= max_len] if op == "attn_prefill" else got
        if not got:
            raise SystemExit(f"combine: no {op} rows for {pack.name} in {src_dir}")
        sm = read_yaml(src.with_suffix(".yaml"))
        note["per_op"][op] = dict(rows=len(got), from_pack=str(src), measured=sm.get("date"),
                                  command=sm.get("command"), method=sm.get("method"),
                                  grid=sm.get("grid"), stages_skipped=sm.get("stages_skipped"),
                                  shared_from_equal_shape=shared,
                                  timing_methods=(sm.get("timing_methods") or {}).get(op),
                                  sdpa=sm.get("sdpa"), sdpa_backend=sm.get("sdpa_backend"))
        rows += got
    return rows, note

