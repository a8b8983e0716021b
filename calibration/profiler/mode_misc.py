"""Modes ``survey`` (op curves beyond the packs: surveys.py) and ``backends`` (every SDPA backend
on each attention kind's survey lattice: the evidence for the choice ``ops`` makes)."""

from __future__ import annotations

import csv
import datetime
import json
from pathlib import Path

import torch

from .attn_backends import KINDS, Sdpa
from .common import _csv_list, log, this_command
from .environment import device_string, gpu_key, method_text, setup
from .opbench import OpBench
from .shapes import RankShape, pack_stem
from .timing import Timer
from .writers import _check_time, write_yaml


def cmd_survey(args) -> int:
    """Op surveys beyond the packs (surveys.py): GEMMs in every weight format, MoE
    layers, decode attention over bf16/fp8 KV to 128K, MLA decode. One CSV + YAML per survey."""
    from .surveys import SURVEY_COLUMNS, SURVEYS, Survey

    device, budget, info = setup(args)
    gpu = gpu_key(info, args.gpu_key)
    which = _csv_list(args.which) if args.which else list(SURVEYS)
    bad = [w for w in which if w not in SURVEYS]
    if bad:
        raise SystemExit(f"unknown survey(s) {bad}; known: {SURVEYS}")
    timer = Timer(device, budget, quick=args.quick, max_rep=args.max_rep or 10)
    kv_cap = (int(min(32 * 2 ** 30, 0.3 * torch.cuda.mem_get_info(device)[0])) if device.type == "cuda"
              else 64 * 2 ** 20)
    sv = Survey(timer, device, quick=args.quick, kv_cap_bytes=kv_cap, log=log)
    with torch.inference_mode():
        sv.run(which)
    out = Path(args.out) / "surveys" / gpu
    out.mkdir(parents=True, exist_ok=True)
    for name in which:
        rows = [r for r in sv.rows if r[0] == name]
        if not rows:
            continue
        path = out / f"{name}.csv"
        with path.open("w", newline="") as fh:
            w = csv.writer(fh, lineterminator="\n")
            w.writerow(SURVEY_COLUMNS)
            for r in rows:
                _check_time(float(r[10]), str(r))
                w.writerow(r)
        meta = dict(gpu=gpu, survey=name, date=datetime.date.today().isoformat(), device=device_string(info),
                    method=method_text(timer), command=args.parent_command or this_command(),
                    kind="op survey (not a pack: no servesim run reads it)", rows=len(rows),
                    seconds=sv.meta.get("seconds", {}).get(name), skipped=[x for x in sv.skipped if x.startswith(name)],
                    dropped=[x for x in timer.dropped if x.startswith(name)], environment=info,
                    **{k: v for k, v in sv.meta.items() if k == name})
        write_yaml(path.with_suffix(".yaml"), meta)
        log(f"wrote {path} ({len(rows)} rows)")
    if sv.skipped:
        log(f"survey: {len(sv.skipped)} skipped: {sv.skipped[:20]}")
    return 0


def cmd_backends(args) -> int:
    """Check every SDPA backend against float64 and time the passing ones on each attention kind's
    survey lattice (``attn_backends.SURVEY``): the evidence for the choice ``ops`` makes, without
    the dense grid (writes backends_<model>.json, no pack rows)."""
    device, budget, info = setup(args)
    rs = RankShape.of(args.model, args.tp)
    timer = Timer(device, budget, quick=args.quick)
    sdpa = Sdpa(device)
    sdpa.check(rs.H, rs.KVH, rs.D, args.sdpa)
    sdpa.record_kernels(rs.H, rs.KVH, rs.D)
    kv_cap = int(min(16 * 2 ** 30, 0.25 * torch.cuda.mem_get_info(device)[0])) \
        if device.type == "cuda" else 64 * 2 ** 20
    bench = OpBench(rs, device, timer, sdpa, args.quick, kv_cap_bytes=kv_cap,
                    rot_bytes=4 * (int(info.get("l2_bytes") or 0) or 50 * 2 ** 20))
    with torch.inference_mode():
        for kind in KINDS:
            bench.ensure_survey(kind)
    path = Path(args.out) / f"backends_{pack_stem(args.model, args.tp)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(device=device_string(info), model=args.model, tp=args.tp,
                                    checks=sdpa.checks, passing=sdpa.passing, kernels=sdpa.kernels,
                                    survey={k: v.to_meta() for k, v in bench.surveys.items()},
                                    backend_skips=bench.backend_skips), indent=1))
    log(f"wrote {path}")
    return 0

