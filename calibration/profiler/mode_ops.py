"""Mode ``ops``: op tables for every (model, TP) asked for, in one process (equally shaped ops
timed once), and the overhead rows from decode-only calibration forwards."""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from .attn_backends import BackendChooser, Sdpa
from .combine import merge_collectives_into
from .common import BudgetExceeded, Meas, _csv_list, log, this_command
from .environment import base_meta, device_string, gpu_key, measure_peaks, method_text, setup
from .forward import Batch, Model, forward
from .grids import (CALIB_BATCHES, CALIB_CTX, OPS_STAGES, QUICK_CALIB_BATCHES, SAMPLED_MAX, Composition,
                    grid_text)
from .opbench import OpBench
from .shapes import ALL_SHAPES, RankShape, pack_stem
from .timing import Timer
from .writers import read_rows, read_yaml, write_rows, write_yaml


def cmd_ops(args) -> int:
    """Op tables for every (model, TP) of ``--model`` x ``--tp`` (comma lists), in one process, so
    that equally shaped ops are timed once (``OpBench.sig``) and torch starts once."""
    device, budget, info = setup(args)
    models, tps = _csv_list(args.model), _csv_list(args.tp, int)
    for m in models:
        if m not in ALL_SHAPES:
            raise SystemExit(f"unknown model {m}; known: {', '.join(ALL_SHAPES)}")
    stages = _csv_list(args.stages) if args.stages else list(OPS_STAGES)
    bad = [x for x in stages if x not in OPS_STAGES]
    if bad:
        raise SystemExit(f"unknown stage(s) {bad}; known: {OPS_STAGES}")
    if args.skip_overhead and "overhead" in stages:
        stages.remove("overhead")
    memo: dict = {}
    t_all = time.time()
    for m in models:
        for tp in tps:
            ops_one(args, device, budget, info, m, tp, stages, memo)
    log(f"ops: {len(models) * len(tps)} pack(s) in {time.time() - t_all:.0f}s, "
        f"{len(memo)} distinct measurements")
    return 0


def ops_one(args, device, budget, info, model: str, tp: int, stages: list, memo: dict) -> None:
    gpu = gpu_key(info, args.gpu_key)
    rs = RankShape.of(model, tp, args.weights)
    out = Path(args.out)
    grid = "quick" if args.quick else args.grid
    log(f"ops: model={model} tp={tp} grid={grid} stages={stages} rank shape={rs.as_dict()} on "
        f"{device_string(info)}")
    timer = Timer(device, budget, quick=args.quick,
                  max_rep=args.max_rep or (10 if grid == "dense" else 20))
    sdpa = Sdpa(device)
    sdpa.check(rs.H, rs.KVH, rs.D, args.sdpa)
    sdpa.record_kernels(rs.H, rs.KVH, rs.D)
    log(f"SDPA ({sdpa.mode}): passing {sdpa.passing}; checks {sdpa.checks}; kernels {sdpa.kernels}")
    if ("peaks",) not in memo:
        memo[("peaks",)] = measure_peaks(device, timer, args.quick)
    l2 = int(info.get("l2_bytes") or 0) or 50 * 2 ** 20
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        kv_cap = int(min((48 if args.grid == "long" else 16) * 2 ** 30, 0.25 * free))
    else:
        kv_cap = 64 * 2 ** 20
    bench = OpBench(rs, device, timer, sdpa, args.quick, kv_cap_bytes=kv_cap, rot_bytes=4 * l2,
                    grid=args.grid, memo=memo)
    bench.prefill_max_rep = getattr(args, "prefill_max_rep", None)
    stem = rs.stem
    attention_from = None
    if args.attention_from:  # attention does not depend on the weights' format: reuse a bf16 pack's
        attention_from = Path(args.attention_from) / f"{pack_stem(model, tp)}.csv"
        src_meta = read_yaml(attention_from.with_suffix(".yaml"))
        for r in read_rows(attention_from):
            if r[0] in ("attn_prefill", "attn_decode"):
                m = Meas(float(r[5]), float(r[6] or 0), 0, "from pack")
                bench.table[(r[0], int(r[1]), int(r[2]), int(r[3]))] = m
                bench.rows.append((r[0], int(r[1]), int(r[2]), int(r[3]), int(r[4]), m.median_ms, m.std_ms))
        bench.external_chooser = BackendChooser.from_meta(src_meta)
        stages = [x for x in stages if x not in ("attn_decode", "attn_prefill")]
    tables_from = None
    if args.tables_from:  # overhead-only runs: the op sums come from a pack measured earlier
        tables_from = Path(args.tables_from) / f"{stem}.csv"
        for r in read_rows(tables_from):
            bench.table[(r[0], int(r[1]), int(r[2]), int(r[3]))] = Meas(float(r[5]), float(r[6] or 0), 0,
                                                                         "from pack")
        ymeta = tables_from.with_suffix(".yaml")
        if ymeta.is_file():  # the calibration forwards run the attention backends the tables chose
            bench.external_chooser = BackendChooser.from_meta(read_yaml(ymeta))
    done, skipped_stages = [], [f"{x} (not asked for)" for x in OPS_STAGES if x not in stages]
    overhead_notes: dict = {}
    t0 = time.time()
    with torch.inference_mode():
        for name in [x for x in OPS_STAGES if x in stages]:
            fn = {"token ops": bench.run_token_ops, "attn_decode": bench.run_decode,
                  "attn_prefill": bench.run_prefill,
                  "overhead": lambda: overhead_rows(bench, timer, device, args, overhead_notes)}[name]
            log(f"[{model} tp{tp}] stage {name} (t={time.time() - t0:.0f}s)")
            try:
                fn()
                done.append(name)
            except BudgetExceeded:
                skipped_stages.append(f"{name} (time budget ran out partway)")
                log(f"  time budget ran out in stage {name}; writing what was measured")
                break
    for name in stages:
        if name not in done and not any(x.startswith(name) for x in skipped_stages):
            skipped_stages.append(f"{name} (not reached: time budget)")
    csv_path = out / "packs" / gpu / f"{stem}.csv"
    rows = sorted(bench.rows, key=lambda r: (r[0], r[2], r[1], r[3], r[4]))
    if rows:
        write_rows(csv_path, rows)
    meta = base_meta(gpu, model, tp, info, rs)
    chooser = bench.chooser()
    backend = f"{sdpa.mode}: {chooser.summary()}"
    meta.update(
        method=method_text(timer, f"; SDPA {backend}"),
        command=args.parent_command or this_command(),
        grid=grid_text(grid),
        notes=ops_notes(rs, backend, overhead_notes),
        sdpa_backend=backend,
        sdpa=dict(mode=sdpa.mode, checks_rel_err=sdpa.checks, passing=sdpa.passing,
                  kernels=sdpa.kernels,
                  survey={k: v.to_meta() for k, v in bench.surveys.items()},
                  choice=chooser.to_meta(),
                  contested={k: v for k, v in bench.contested.items()},
                  backend_skips=bench.backend_skips[:200],
                  how=("every backend that passes the float64 check is timed on a survey lattice "
                       "per op kind; a backend within 5% of the fastest at every survey point is "
                       "the kind's backend, else each grid point times the backends within 10% of "
                       "the fastest at its 4 nearest survey points and keeps the fastest "
                       "(calibration/profiler/attn_backends.py)")),
        device_peaks=memo.get(("peaks",)),
        timing_methods={k: sorted(v) for k, v in bench.methods.items()},
        rows=len(rows), seconds=round(time.time() - t0, 1),
        shared_measurements=(f"{bench.reused} of {len(rows)} rows reuse a measurement of an op "
                             f"with the same kernel and input shapes taken earlier in this process"),
        stages_done=done, stages_skipped=skipped_stages,
        points_skipped=bench.skipped, points_dropped=timer.dropped,
        graph_capture_failures=timer.capture_failures,
        overhead=overhead_notes,
        collectives=("not merged: all_reduce needs a multi-GPU run (`allreduce`, then `merge`)"
                     if tp > 1 else "send_recv not merged (no multi-GPU run)"),
    )
    if tables_from is not None:
        meta["tables_from"] = str(tables_from)
    if rs.weights != "bf16" or rs.moe:
        meta["gemm_backend"] = bench.gemm_backend or "see tables_from"
    if rs.moe:
        meta["moe_backend"] = bench.moe_backend or "see tables_from"
        if bench.moe_backend and bench.moe_backend.startswith("Triton fused"):
            from .triton_moe import FusedMoE
            meta["moe_tile_configs"] = FusedMoE.tuned_configs() or "defaults (no on-device tuning)"
    if attention_from is not None:
        meta["attention_from"] = (f"{attention_from}: attn_prefill / attn_decode rows and their SDPA "
                                  f"choice copied from the bf16 pack (measured {src_meta.get('date')} on "
                                  f"{src_meta.get('device')}); attention reads bf16 Q/K/V whatever the "
                                  f"weights' format")
        for k in ("sdpa_backend", "sdpa"):
            if k in src_meta:
                meta[k] = src_meta[k]
    if rows or overhead_notes.get("points"):  # an overhead run's points matter even if none is > 0
        write_yaml(csv_path.with_suffix(".yaml"), meta)
    log(f"wrote {csv_path} ({len(rows)} rows, {bench.reused} reused) in {time.time() - t0:.0f}s; "
        f"skipped {len(bench.skipped)} points, dropped {len(timer.dropped)}")
    if args.collectives and rows:
        merge_collectives_into(csv_path, [Path(args.collectives)])
    del bench
    if device.type == "cuda":
        torch.cuda.empty_cache()


def ops_notes(rs: RankShape, backend: str, ov: dict) -> str:
    parts = [
        f"Per-rank slice for tp={rs.tp}: heads {rs.H}, kv_heads {rs.KVH}, intermediate {rs.I}, "
        f"vocab {rs.V} (lm_head/embed). Eager PyTorch ops, unfused: rms_norm = F.rms_norm; rope = "
        f"neox rotary in 5 kernels (gather + 2 mul + 2 addcmul); kv_write = 2 index_copy_ into a "
        f"flat [slots, kv_heads, head_dim] cache at contiguous slots; act = silu * up (2 kernels); "
        f"attention = torch SDPA ({backend}) with enable_gqa on a sequence-major cache, output "
        f"copied into the attention buffer; attn_prefill with context uses bottom-right causal "
        f"alignment. embed under TP is a plain lookup in the rank's vocab slice (no masking).",
        "Op times exclude CPU launch cost (graph replay); it is in overhead_eager / "
        "overhead_cuda_graph.",
        f"lm_head and final_norm are keyed by sampled rows, measured up to {SAMPLED_MAX}.",
        "Qwen3's per-head q/k RMSNorm is not modelled (not in the pack op list).",
    ]
    if ov.get("note"):
        parts.append(ov["note"])
    return " ".join(parts)


def overhead_rows(bench: OpBench, timer: Timer, device, args, notes: dict) -> None:
    """overhead_eager / overhead_cuda_graph: a decode-only calibration forward's wall time minus
    the sum of its ops as the tables just measured predict. Non-positive differences are dropped
    and listed (never written)."""
    rs = bench.rs
    batches = QUICK_CALIB_BATCHES if args.quick else CALIB_BATCHES
    if getattr(args, "calib_batches", None):
        batches = _csv_list(args.calib_batches, int)
    model = Model(rs, device)
    notes.update(calibration_batches=batches, calibration_context=CALIB_CTX,
                 shared_layer_weights=model.shared_layers, points={}, dropped=[])
    notes["note"] = (f"Overheads from decode-only forwards (batch {batches}, context {CALIB_CTX}, one "
                     f"per-rank forward on one GPU) minus the table sum"
                     + ("; under TP that forward has no all-reduce, so NCCL launch cost is not in "
                        "the overhead" if rs.tp > 1 else "") + ".")
    modes = [("overhead_eager", False)] + ([("overhead_cuda_graph", True)] if timer.cuda else [])
    chooser = bench.chooser()
    notes["sdpa"] = chooser.summary()
    for B in batches:
        timer.budget.check()
        pred = bench.predict_decode_forward(B, CALIB_CTX)
        if pred is None:
            notes["dropped"].append(f"batch {B}: an op of the table is missing")
            continue
        batch = Batch(Composition(0, 0, 0, B, CALIB_CTX), rs, device, chooser=chooser)
        for op, graph in modes:
            try:
                m = timer.measure_forward(lambda: forward(model, batch), graph, f"{op} batch={B}")
            except BudgetExceeded:
                raise
            except Exception as exc:
                notes["dropped"].append(f"{op} batch {B}: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            if m is None:
                notes["dropped"].append(f"{op} batch {B}: no valid measurement")
                continue
            diff = m.median_ms - pred
            notes["points"][f"{op} batch={B}"] = dict(forward_ms=round(m.median_ms, 5),
                                                       forward_std_ms=round(m.std_ms, 5),
                                                       table_sum_ms=round(pred, 5),
                                                       diff_ms=round(diff, 5))
            log(f"  {op} batch={B}: forward {m.median_ms:.4f} ms, tables {pred:.4f} ms, "
                f"diff {diff:.4f} ms")
            if not (math.isfinite(diff) and diff > 0):
                notes["dropped"].append(f"{op} batch {B}: forward - tables = {diff:.5f} ms <= 0, "
                                        f"not written")
                continue
            bench.rows.append((op, B, B, 0, 0, diff, m.std_ms))
            bench.methods.setdefault(op, set()).add(m.method)
        del batch
    del model
    bench._free()

