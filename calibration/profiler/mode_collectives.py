"""Mode ``allreduce``: NCCL ``all_reduce`` over N GPUs and ``send_recv`` between two, one process
a GPU, CUDA-graph replays (eager times kept too); gloo on CPU for logic tests."""

from __future__ import annotations

import datetime
import json
import math
import os
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import torch

from .common import log, this_command
from .environment import device_string, gpu_key, setup
from .grids import COLL_SIZES, QUICK_COLL_SIZES
from .writers import write_rows, write_yaml


def _coll_worker(rank: int, world: int, port: int, cfg: dict) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    import torch.distributed as dist
    cuda = cfg["device"] == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
    else:
        dev = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    dtype = torch.bfloat16 if cuda else torch.float32
    esize = 2 if cuda else 4
    n_rep = 3 if cfg["quick"] else 10
    results: list = []
    eager: dict = {}
    methods: dict = {}
    graph_fail: dict = {}

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    def timed(fn, iters) -> float:
        """ms per call of fn over `iters` back-to-back calls, the maximum over ranks."""
        flag = torch.zeros(1, device=dev, dtype=torch.float32)
        dist.all_reduce(flag)  # line the ranks up
        sync()
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(iters):
                fn()
            e1.record()
            sync()
            t = e0.elapsed_time(e1) / iters
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            t = (time.perf_counter() - t0) * 1e3 / iters
        tt = torch.tensor([t], device=dev, dtype=torch.float32)
        dist.all_reduce(tt, op=dist.ReduceOp.MAX)
        return float(tt.item())

    def stats(times):
        good = [t for t in times if math.isfinite(t) and t > 0]
        if not good:
            raise RuntimeError("no positive finite time")
        arr = np.asarray(good)
        return float(np.median(arr)), (float(arr.std(ddof=1)) if len(arr) > 1 else 0.0)

    def graph_times(fn, iters) -> list:
        """Capture `iters` back-to-back calls in a CUDA graph (every rank the same), replay: the
        collective's GPU time without the eager per-call CPU cost, as the op tables are measured.
        Per repeat: ranks lined up, events around one replay, time = max over ranks / iters."""
        s = torch.cuda.Stream(dev)
        s.wait_stream(torch.cuda.current_stream(dev))
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(s):
            g.capture_begin()
            try:
                for _ in range(iters):
                    fn()
            finally:
                g.capture_end()
        torch.cuda.current_stream(dev).wait_stream(s)
        g.replay()
        g.replay()
        sync()
        out = []
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        flag = torch.zeros(1, device=dev, dtype=torch.float32)
        for _ in range(n_rep):
            dist.all_reduce(flag)
            sync()
            e0.record()
            g.replay()
            e1.record()
            sync()
            tt = torch.tensor([e0.elapsed_time(e1) / iters], device=dev, dtype=torch.float32)
            dist.all_reduce(tt, op=dist.ReduceOp.MAX)
            out.append(float(tt.item()))
        del g
        return out

    use_graph = cuda and not cfg.get("no_graph")
    for op in ("all_reduce", "send_recv"):
        if op == "send_recv" and world < 2:
            continue
        group = world if op == "all_reduce" else 2
        for nbytes in cfg["sizes"]:
            x = torch.randn(max(1, nbytes // esize), device=dev, dtype=dtype)
            nb = x.numel() * esize
            if op == "all_reduce":
                def fn():
                    dist.all_reduce(x)
            else:
                def fn():
                    if rank == 0:
                        dist.send(x, 1)
                    elif rank == 1:
                        dist.recv(x, 0)
            try:
                for _ in range(3):
                    fn()
                sync()
                one = timed(fn, 1)
                iters = max(1, min(20, int(2.0 / max(one, 1e-3))))
                med_e, std_e = stats([timed(fn, iters) for _ in range(n_rep)])
                eager[f"{op} {nb}"] = round(med_e, 6)
                med, std, how = med_e, std_e, f"eager x{iters}"
                if use_graph:
                    try:
                        giters = max(1, min(50, int(2.0 / max(med_e, 1e-3))))
                        med, std = stats(graph_times(fn, giters))
                        how = f"graph x{giters}"
                    except Exception as exc:  # keep the eager number and say so
                        graph_fail[f"{op} {nb}"] = f"{type(exc).__name__}: {str(exc)[:160]}"
                        med, std, how = med_e, std_e, f"eager x{iters} (graph failed)"
                        sync()
                results.append((op, 0, group, 0, nb, med, std))
                methods[f"{op} {nb}"] = how
                if rank == 0:
                    bw = nb / (med * 1e-3) / 1e9
                    print(f"{time.strftime('%H:%M:%S')}   {op} n={group} bytes={nb}: {med:.4f} ms "
                          f"± {std:.4f} ({how}; eager {med_e:.4f} ms; algbw {bw:.1f} GB/s)", flush=True)
            except Exception as exc:
                if rank == 0:
                    print(f"  SKIP {op} bytes={nbytes}: {type(exc).__name__}: {exc}", flush=True)
            del x
            if rank == 0:  # after every size, so a hang later still leaves these results
                with open(cfg["tmp"], "w") as fh:
                    json.dump(dict(rows=results, eager_ms=eager, methods=methods,
                                   graph_failures=graph_fail), fh)
    dist.destroy_process_group()


def cmd_allreduce(args) -> int:
    device, budget, info = setup(args)
    gpu = gpu_key(info, args.gpu_key)
    n = args.gpus
    if device.type == "cuda" and torch.cuda.device_count() < n:
        raise SystemExit(f"--gpus {n} but only {torch.cuda.device_count()} visible")
    import tempfile
    import torch.multiprocessing as mp
    fd, tmp = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = dict(device=device.type, quick=args.quick, tmp=tmp, no_graph=args.eager_collectives,
               sizes=QUICK_COLL_SIZES if args.quick else COLL_SIZES)
    log(f"allreduce: {n} processes, {len(cfg['sizes'])} sizes, NCCL_NVLS_ENABLE="
        f"{os.environ['NCCL_NVLS_ENABLE']} TORCH_SYMM_MEM_DISABLE_MULTICAST="
        f"{os.environ['TORCH_SYMM_MEM_DISABLE_MULTICAST']} NVSHMEM_DISABLE_NVLS="
        f"{os.environ['NVSHMEM_DISABLE_NVLS']}")
    t0 = time.time()
    ctx = mp.spawn(_coll_worker, args=(n, port, cfg), nprocs=n, join=False)
    limit = t0 + (args.time_budget_s or 300.0)
    if args.deadline_epoch:
        limit = min(limit, args.deadline_epoch)
    incomplete = None
    try:
        while not ctx.join(timeout=5):
            if time.time() > limit:
                incomplete = "time limit reached; workers terminated, partial results kept"
                break
    except Exception as exc:  # a worker failed: keep what rank 0 wrote so far
        incomplete = f"{type(exc).__name__}: {str(exc)[:300]}"
    if incomplete:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.terminate()
        log(f"allreduce incomplete: {incomplete}")
    if not os.path.getsize(tmp):
        raise SystemExit("allreduce: no results")
    with open(tmp) as fh:
        got = json.load(fh)
    rows = [tuple(r) for r in got["rows"]]
    os.unlink(tmp)
    path = Path(args.out) / "collectives" / gpu / f"collectives_{n}gpu.csv"
    write_rows(path, rows)
    topo, nccl_ver = "", None
    if device.type == "cuda":
        try:
            topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                                  timeout=20).stdout
        except Exception:
            pass
        try:
            v = torch.cuda.nccl.version()
            nccl_ver = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:
            pass
    write_yaml(path.with_suffix(".yaml"), dict(
        gpu=gpu, gpus=n, source="measured", date=datetime.date.today().isoformat(),
        device=device_string(info), nccl=nccl_ver,
        method=("torch.distributed, one process per GPU (NCCL; gloo on CPU); bf16 tensors; 3 warm-up "
                "calls; per repeat the ranks are lined up with a small all-reduce and time = max over "
                "ranks. time_ms (NCCL): `iters` back-to-back calls captured in one CUDA graph per "
                "rank (iters so that they take ~2 ms, 1..50), CUDA events around a replay, / iters, "
                "so the CPU launch cost is excluded as for the op tables; eager_ms (in the "
                "collectives YAML): events "
                "around `iters` eager back-to-back calls (1..20), which includes PyTorch's per-call "
                f"CPU cost for small messages. Median of {n_rep_text(args)} repeats. send_recv: rank 0 "
                "sends to rank 1."),
        row_methods=got.get("methods", {}), eager_ms=got.get("eager_ms", {}),
        graph_failures=got.get("graph_failures", {}), incomplete=incomplete,
        env={k: os.environ[k] for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                        "NVSHMEM_DISABLE_NVLS")},
        topology=topo, command=args.parent_command or this_command(), rows=len(rows),
        seconds=round(time.time() - t0, 1)))
    log(f"wrote {path} ({len(rows)} rows) in {time.time() - t0:.0f}s")
    return 0


def n_rep_text(args) -> int:
    return 3 if args.quick else 10

