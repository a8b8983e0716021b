"""Mode ``all``: collectives over every GPU, then ``ops`` and ``iterations`` tasks spread over the
GPUs (one process a task, longest first), then the collectives merged into the packs."""

from __future__ import annotations

import argparse
import json
import os
import queue
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from .combine import cmd_merge
from .common import log, this_command
from .shapes import ALL_SHAPES, pack_stem

#: the command line every task runs (each task is a process of its own)
SCRIPT = Path(__file__).resolve().parents[1] / "profile_gpu.py"


@dataclass
class Task:
    name: str
    argv: list
    cost: float
    rc: Optional[int] = None
    seconds: float = 0.0


def cmd_all(args) -> int:
    """Run allreduce (all GPUs), then ops and iterations tasks spread over the GPUs (one process a
    task, one GPU each, longest first), then merge the collectives into the packs."""
    t_start = time.time()
    out = Path(args.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    models = [m for m in args.models.split(",") if m]
    tps = [int(x) for x in args.tps.split(",") if x]
    iter_models = models if args.iter_models is None else [m for m in args.iter_models.split(",") if m]
    for m in models + iter_models:
        if m not in ALL_SHAPES:
            raise SystemExit(f"unknown model {m}; known: {', '.join(ALL_SHAPES)}")
    cuda = args.device == "cuda"
    ngpu = torch.cuda.device_count() if cuda else 2
    workers = min(ngpu, args.workers) if args.workers else ngpu
    hard = t_start + args.time_budget_s - 25 if args.time_budget_s else None
    soft = t_start + 0.75 * args.time_budget_s if args.time_budget_s else None
    common = ["--out", str(out), "--device", args.device, "--sdpa", args.sdpa]
    grid_args = ["--grid", args.grid] + (["--max-rep", str(args.max_rep)] if args.max_rep else [])
    if args.quick:
        common.append("--quick")
    if args.gpu_key:
        common += ["--gpu-key", args.gpu_key]
    if hard:
        common += ["--deadline-epoch", f"{hard:.0f}", "--soft-deadline-epoch", f"{soft:.0f}"]
    parent = this_command()
    common += ["--parent-command", parent]
    me = [sys.executable, "-u", str(SCRIPT)]
    log(f"all: models {models}, tp {tps}, iterations for {iter_models}, {workers} worker(s), "
        f"{ngpu} {'GPU(s)' if cuda else 'CPU slots'}")
    lock = threading.Lock()

    # 1. collectives first (they need every GPU at once)
    coll_rc = None
    want_coll = not args.skip_allreduce and ngpu >= 2
    if want_coll:
        coll_rc = _run_logged(me + ["allreduce", "--gpus", str(ngpu)] + common, None,
                              out / "logs" / "allreduce.log", "allreduce", lock)
    elif not args.skip_allreduce:
        log("only one GPU: all_reduce / send_recv not measured")

    # 2. ops and iterations, longest first, onto free GPUs
    def size(m):
        s = ALL_SHAPES[m]
        return s["num_layers"] * (3 * s["hidden_size"] * s["intermediate_size"] + 2 * s["hidden_size"] ** 2)
    tasks = [Task(f"ops-{pack_stem(m, tp)}", me + ["ops", "--model", m, "--tp", str(tp)] + grid_args + common,
                  cost=(1.0 if tp == 1 else 0.6) * size(m) * 1.2) for m in models for tp in tps]
    tasks.sort(key=lambda t: -t.cost)
    # iterations after every ops task: their forwards take the attention backends the op tables chose
    it_tasks = [Task(f"iterations-{m}", me + ["iterations", "--model", m, "--backends-from",
                                              str(out / "packs")] + common, cost=size(m))
                for m in iter_models]
    it_tasks.sort(key=lambda t: -t.cost)
    q: "queue.Queue[Task]" = queue.Queue()
    for t in tasks:
        q.put(t)

    def worker(slot: int):
        while True:
            try:
                t = q.get_nowait()
            except queue.Empty:
                return
            if hard and time.time() > hard:
                t.rc = -1
                log(f"not started (time budget): {t.name}")
                continue
            env = {"CUDA_VISIBLE_DEVICES": str(slot)} if cuda else {}
            t0 = time.time()
            t.rc = _run_logged(t.argv, env, out / "logs" / f"{t.name}.log", f"w{slot} {t.name}", lock)
            t.seconds = time.time() - t0
    for phase in (tasks, it_tasks):
        if phase is it_tasks:
            for t in it_tasks:
                q.put(t)
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(workers)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    tasks = tasks + it_tasks

    # 3. merge
    if want_coll and coll_rc == 0:
        cmd_merge(argparse.Namespace(out=str(out)))
    summary = dict(command=parent, seconds=round(time.time() - t_start, 1), allreduce_rc=coll_rc,
                   tasks=[dict(name=t.name, rc=t.rc, seconds=round(t.seconds, 1)) for t in tasks])
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    log("summary: " + json.dumps(summary))
    return 0 if all(t.rc == 0 for t in tasks) and coll_rc in (None, 0) else 1


def _run_logged(argv, env_add, logpath: Path, prefix: str, lock) -> int:
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env_add or {}))
    with open(logpath, "w") as lf:
        lf.write("$ " + " ".join(shlex.quote(a) for a in argv) + "\n")
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        assert p.stdout is not None
        for line in p.stdout:
            lf.write(line)
            lf.flush()
            with lock:
                print(f"[{prefix}] {line}", end="", flush=True)
        rc = p.wait()
    log(f"[{prefix}] exit {rc}")
    return rc

