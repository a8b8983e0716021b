"""Mode ``iterations``: whole random-weight forwards of the validation compositions, eager and as
a CUDA graph, each attention call on the backend the tables chose; under TP one process per GPU
with NCCL all-reduces (gloo on CPU). Validation data: never read by the fit."""

from __future__ import annotations

import csv
import json
import math
import os
import socket
import time
from pathlib import Path

import numpy as np
import torch

from .attn_backends import BackendChooser, Sdpa
from .common import BudgetExceeded, log, this_command
from .environment import base_meta, device_info, device_string, gpu_key, setup
from .forward import Batch, Model, forward
from .grids import CALIB_BATCHES, CALIB_CTX, validation_compositions
from .shapes import RankShape, pack_stem
from .timing import Timer
from .writers import VAL_COLUMNS, _check_time, _plain, read_yaml, write_yaml


def load_chooser(args, gpu: str, sdpa: Sdpa, tp: int) -> tuple[BackendChooser, str]:
    """The attention backend choice of the (model, tp) pack under ``--backends-from`` (a pack
    folder or a packs/ root), checked against the backends that pass here; without it, the first
    passing backend per kind."""
    if not args.backends_from:
        return (BackendChooser.constant(sdpa.passing),
                "first backend passing the float64 check per kind (no --backends-from)")
    stem = pack_stem(args.model, tp, getattr(args, "weights", "bf16"))
    ymeta = Path(args.backends_from) / f"{stem}.yaml"
    if not ymeta.is_file():  # a packs/ root: the GPU's folder below it
        ymeta = Path(args.backends_from) / gpu / f"{stem}.yaml"
    if not ymeta.is_file():
        raise SystemExit(f"--backends-from: {ymeta} not found")
    chooser = BackendChooser.from_meta(read_yaml(ymeta))
    if chooser is None:
        raise SystemExit(f"--backends-from: {ymeta} records no SDPA choice")
    bad = {k: c.get("backend") for k, c in chooser.per_kind.items()
           if any(b not in sdpa.passing.get(k, []) for b in _chooser_backends(c))}
    if bad:
        raise SystemExit(f"--backends-from {ymeta}: backends {bad} do not pass the float64 "
                         f"check here ({sdpa.passing})")
    return chooser, str(ymeta)


def moe_backend_meta(model) -> dict:
    """The MoE layers' experts backend (and the fused kernel's tile choices) for the YAML."""
    moe = model.layers[0].get("moe")
    if moe is None:
        return {}
    out = dict(moe_backend=moe.backend)
    if moe.kind == "triton-fused":
        from .triton_moe import FusedMoE
        out["moe_tile_configs"] = FusedMoE.tuned_configs() or "defaults (no on-device tuning)"
    return out


def _chooser_backends(c: dict) -> list:
    if c.get("rule") == "per point":
        return sorted({p[2] for p in c.get("points", [])})
    return [c.get("backend")]


def cmd_iterations(args) -> int:
    if args.tp > 1 and getattr(args, "compositions", "standard") == "long":
        log("iterations --compositions long: TP 1 only (the TP ranks run the standard set); allowed: --tp 1")
        return 2
    if args.tp > 1:
        return cmd_iterations_tp(args)
    device, budget, info = setup(args)
    gpu = gpu_key(info, args.gpu_key)
    rs = RankShape.of(args.model, 1, args.weights)
    timer = Timer(device, budget, quick=args.quick)
    if args.fwd_max_rep:
        timer.fwd_max_rep = max(timer.min_rep, args.fwd_max_rep)
    if args.fwd_budget_ms:
        timer.fwd_budget_ms = args.fwd_budget_ms
    sdpa = Sdpa(device)
    sdpa.check(rs.H, rs.KVH, rs.D, args.sdpa)
    chooser, chooser_from = load_chooser(args, gpu, sdpa, 1)
    backend = chooser.summary()
    log(f"iterations: model={args.model} on {device_string(info)}; SDPA {backend} ({chooser_from})")
    which = getattr(args, "compositions", "standard") or "standard"
    comps = validation_compositions(args.model, args.quick, which)
    if args.every and args.every > 1:
        comps = comps[:: args.every]
    if args.max_compositions:
        comps = comps[: args.max_compositions]
    t0 = time.time()
    rows, skipped = [], []
    used: dict = {}
    with torch.inference_mode():
        model = Model(rs, device, share_layers=True if args.share_layer_weights else None)
        kv_cap = 0.5 * torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 2 ** 28
        for i, c in enumerate(comps):
            if 2 * c.kv_slots * rs.KVH * rs.D * 2 > kv_cap:
                skipped.append(f"{c.key()}: KV cache over memory cap")
                continue
            try:
                budget.check()
                batch = Batch(c, rs, device, chooser=chooser)
                used[c.key()] = dict(prefill=batch.prefill_backend, decode=batch.decode_backend)
                res = {}
                modes = [True] if timer.cuda else []
                if i % max(1, args.eager_every) == 0 or not timer.cuda:
                    modes.insert(0, False)
                for graph in modes:
                    try:
                        m = timer.measure_forward(lambda: forward(model, batch), graph,
                                                  f"iteration {c.key()}")
                    except (BudgetExceeded, torch.cuda.OutOfMemoryError):
                        raise
                    except Exception as exc:  # e.g. a capture failure: the other mode still counts
                        skipped.append(f"{c.key()} {'graph' if graph else 'eager'}: {type(exc).__name__}: "
                                       f"{str(exc).splitlines()[0][:160] if str(exc) else ''}")
                        log(f"  SKIP {c.key()} {'graph' if graph else 'eager'}: {type(exc).__name__}: {exc}")
                        timer.sync()
                        continue
                    if m is not None:
                        res[graph] = m
                        rows.append((args.model, 1, graph, c.n_prefill, c.prefill_len, c.prefill_ctx,
                                     c.n_decode, c.decode_ctx, m.median_ms, m.std_ms))
                del batch
                log(f"  [{i + 1}/{len(comps)}] {c.key()} tokens={c.tokens}: "
                    + ", ".join(f"{'graph' if g else 'eager'} {m.median_ms:.3f} ms ± {m.std_ms:.3f}"
                                for g, m in res.items()))
            except BudgetExceeded:
                skipped.extend(f"{x.key()}: time budget" for x in comps[i:])
                log(f"  time budget ran out; {len(comps) - i} compositions not measured")
                break
            except torch.cuda.OutOfMemoryError:
                skipped.append(f"{c.key()}: out of memory")
            except Exception as exc:
                skipped.append(f"{c.key()}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
                log(f"  SKIP {c.key()}: {type(exc).__name__}: {exc}")
            if device.type == "cuda":
                torch.cuda.empty_cache()
        shared = model.shared_layers
        moe_meta = moe_backend_meta(model)
        del model
    path = Path(args.out) / ("validation_long" if which == "long" else "validation") / gpu / f"{rs.stem}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    quant = [] if rs.weights == "bf16" else [rs.weights, "auto"]  # PACK_FORMAT.md's optional columns
    with path.open("w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(VAL_COLUMNS + (("quantization", "kv_cache_dtype") if quant else ()))
        for r in rows:
            _check_time(float(r[8]), str(r))
            w.writerow([r[0], r[1], "true" if r[2] else "false", *r[3:8], f"{r[8]:.6g}",
                        f"{max(r[9], 0.0):.6g}"] + quant)
    meta = base_meta(gpu, args.model, 1, info, rs)
    meta.pop("source")
    meta.update(
        kind="whole-iteration validation data (never read by the fit)",
        method=("full random-weight forward (embedding, every layer, final norm, lm_head on one row "
                "per sequence); CUDA events around each forward (eager) or graph replay (graph, one "
                "capture per composition), device synchronized before each repeat; "
                f"{1 if args.quick else 2} warm-up forwards, median of {timer.min_rep}-"
                f"{timer.fwd_max_rep}; one layer's KV buffers reused by every layer"
                if timer.cuda else "wall clock on CPU (logic test only)"),
        command=args.parent_command or this_command(),
        sdpa_backend=backend, sdpa_choice_from=chooser_from, sdpa_choice=chooser.to_meta(),
        sdpa_per_composition=used,
        eager=("every composition" if args.eager_every <= 1 else
               f"every {args.eager_every}-th composition (CUDA graph: all)"),
        shared_layer_weights=shared, compositions=len(comps),
        subset=(f"every {args.every}-th of validation_compositions()" if args.every > 1 else "all"),
        composition_set=which,
        rows=len(rows), seconds=round(time.time() - t0, 1), skipped=skipped,
        dropped=timer.dropped, **moe_meta,
        notes=("Prefills: one SDPA call per prefilling sequence (bottom-right causal over its cached "
               "context); decodes: one batched SDPA call (all sequences equal context). Every "
               "sequence samples one row (lm_head rows = sequences). Same op functions as the op "
               "tables (calibration/profiler/ops.py). Compositions are disjoint from the overhead "
               "calibration batches (decode-only, batch in "
               f"{CALIB_BATCHES}, context {CALIB_CTX})."),
    )
    write_yaml(path.with_suffix(".yaml"), meta)
    log(f"wrote {path} ({len(rows)} rows, {len(skipped)} compositions skipped) in {time.time() - t0:.0f}s")
    return 0


def _iter_tp_worker(rank: int, world: int, port: int, args, out_json: str) -> None:
    """One TP rank: the per-rank forward with NCCL all-reduces (gloo on CPU), every composition
    timed in lockstep with the other ranks. Each repeat lines the ranks up (a small all-reduce),
    times one forward (or graph replay) with CUDA events, and keeps the maximum over ranks; the
    repeat count is fixed, so every rank issues the same collectives."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    import torch.distributed as dist
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(1)  # one process per rank on a CPU: one thread each (setup() says why)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    info = device_info(device)
    gpu = gpu_key(info, args.gpu_key)
    rs = RankShape.of(args.model, args.tp)
    sdpa = Sdpa(device)
    sdpa.check(rs.H, rs.KVH, rs.D, args.sdpa)
    chooser, chooser_from = load_chooser(args, gpu, sdpa, args.tp)
    deadline = args.deadline_epoch or (time.time() + args.time_budget_s if args.time_budget_s else None)

    def all_reduce(x):
        if cuda:
            dist.all_reduce(x)
        else:  # gloo has no bf16 sum: reduce a float32 copy (logic tests only)
            y = x.float()
            dist.all_reduce(y)
            x.copy_(y)

    flag = torch.zeros(1, device=device)

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def timed(run) -> float:
        dist.all_reduce(flag)  # line the ranks up
        sync()
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            run()
            e1.record()
            sync()
            t = e0.elapsed_time(e1)
        else:
            t0 = time.perf_counter()
            run()
            t = (time.perf_counter() - t0) * 1e3
        tt = torch.tensor([t], device=device)
        dist.all_reduce(tt, op=dist.ReduceOp.MAX)
        return float(tt.item())

    n_rep = max(3, args.fwd_max_rep or (3 if args.quick else 5))
    comps = validation_compositions(args.model, args.quick)
    if args.every and args.every > 1:
        comps = comps[:: args.every]
    if args.max_compositions:
        comps = comps[: args.max_compositions]
    rows, skipped, used = [], [], {}
    t0 = time.time()
    with torch.inference_mode():
        model = Model(rs, device, share_layers=True if args.share_layer_weights else None, seed=rank)
        for i, c in enumerate(comps):
            # the same decision on every rank (rank 0's clock), or the collectives would diverge
            late = torch.tensor([1.0 if deadline and time.time() > deadline else 0.0], device=device)
            dist.broadcast(late, 0)
            if late.item():
                skipped.extend(f"{x.key()}: time budget" for x in comps[i:])
                break
            batch = Batch(c, rs, device, chooser=chooser)
            used[c.key()] = dict(prefill=batch.prefill_backend, decode=batch.decode_backend)
            modes = [False] + ([True] if cuda else [])
            if i % max(1, args.eager_every) and cuda:
                modes = [True]
            res = {}
            for graph in modes:
                fwd = (lambda: forward(model, batch, all_reduce))
                for _ in range(2):
                    fwd()
                sync()
                run, g = fwd, None
                if graph:
                    g = torch.cuda.CUDAGraph()
                    st = torch.cuda.Stream(device)
                    st.wait_stream(torch.cuda.current_stream(device))
                    with torch.cuda.stream(st):
                        g.capture_begin()
                        try:
                            fwd()
                        finally:
                            g.capture_end()
                    torch.cuda.current_stream(device).wait_stream(st)
                    run = g.replay
                    for _ in range(2):
                        run()
                    sync()
                times = [timed(run) for _ in range(n_rep)]
                del g
                arr = np.asarray(times)
                med, std = float(np.median(arr)), float(arr.std(ddof=1))
                if math.isfinite(med) and med > 0:
                    res[graph] = med
                    rows.append((args.model, args.tp, graph, c.n_prefill, c.prefill_len, c.prefill_ctx,
                                 c.n_decode, c.decode_ctx, med, std))
            del batch
            if cuda:
                torch.cuda.empty_cache()
            if rank == 0:
                log(f"  [{i + 1}/{len(comps)}] {c.key()} tokens={c.tokens}: "
                    + ", ".join(f"{'graph' if gr else 'eager'} {v:.3f} ms" for gr, v in res.items()))
    if rank == 0:
        with open(out_json, "w") as fh:
            json.dump(dict(rows=rows, skipped=skipped, used=used, gpu=gpu, info=_plain(info),
                           chooser=chooser.to_meta(), chooser_from=chooser_from,
                           backend=chooser.summary(), n_rep=n_rep, seconds=round(time.time() - t0, 1),
                           shared=model.shared_layers, compositions=len(comps),
                           nccl=(".".join(map(str, torch.cuda.nccl.version())) if cuda else None)), fh)
    dist.destroy_process_group()


def cmd_iterations_tp(args) -> int:
    """Whole-iteration validation forwards at TP > 1: one process per GPU (per-rank slices, NCCL
    all-reduces after o_proj and down_proj), eager and as a CUDA graph that holds the collectives
    too. Rows go to validation/<gpu>/<model>-tp<N>.csv (column tp = N)."""
    import tempfile
    import torch.multiprocessing as mp
    n = args.tp
    if args.device == "cuda" and torch.cuda.device_count() < n:
        raise SystemExit(f"iterations --tp {n} needs {n} GPUs, {torch.cuda.device_count()} visible")
    fd, tmp = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    log(f"iterations: model={args.model} tp={n}, {n} processes, NCCL_NVLS_ENABLE="
        f"{os.environ['NCCL_NVLS_ENABLE']}")
    mp.spawn(_iter_tp_worker, args=(n, port, args, tmp), nprocs=n, join=True)
    with open(tmp) as fh:
        got = json.load(fh)
    os.unlink(tmp)
    path = Path(args.out) / "validation" / got["gpu"] / f"{pack_stem(args.model, n)}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(VAL_COLUMNS)
        for r in got["rows"]:
            _check_time(float(r[8]), str(r))
            w.writerow([r[0], r[1], "true" if r[2] else "false", *r[3:8], f"{r[8]:.6g}",
                        f"{max(r[9], 0.0):.6g}"])
    rs = RankShape.of(args.model, n)
    meta = base_meta(got["gpu"], args.model, n, got["info"], rs)
    meta.pop("source")
    meta.update(
        kind="whole-iteration validation data (never read by the fit)",
        method=(f"one process per GPU (torch.distributed, NCCL), per-rank forward with all_reduce after "
                f"o_proj and down_proj; per repeat the ranks are lined up with a small all-reduce, "
                f"CUDA events around one forward (eager) or graph replay (graph: the collectives "
                f"captured too), time = max over ranks; 2 warm-up forwards, median of "
                f"{got['n_rep']} repeats"),
        command=args.parent_command or this_command(), nccl=got["nccl"],
        sdpa_backend=got["backend"], sdpa_choice_from=got["chooser_from"], sdpa_choice=got["chooser"],
        sdpa_per_composition=got["used"], shared_layer_weights=got["shared"],
        compositions=got["compositions"], rows=len(got["rows"]), seconds=got["seconds"],
        skipped=got["skipped"],
        env={k: os.environ[k] for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                        "NVSHMEM_DISABLE_NVLS")})
    write_yaml(path.with_suffix(".yaml"), meta)
    log(f"wrote {path} ({len(got['rows'])} rows, {len(got['skipped'])} skipped)")
    return 0

