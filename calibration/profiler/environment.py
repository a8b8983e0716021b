"""The machine a measurement ran on (device facts, the packs/ folder name), the metadata every
pack and validation file starts with, the run's setup, and the device's measured peaks."""

from __future__ import annotations

import datetime
import platform
import socket
import subprocess
import time
from typing import Optional

import torch

from .common import Budget, log
from .shapes import ALL_SHAPES, MOE_KEYS, SHAPE_KEYS, RankShape
from .timing import Timer
from .variants import FORMAT_DTYPE, MOE_DEFAULT


def device_info(device) -> dict:
    info = dict(torch=torch.__version__, python=platform.python_version(), host=socket.gethostname())
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(gpu_name=p.name, gpu_mem_mib=int(p.total_memory // 2 ** 20),
                    sms=p.multi_processor_count, l2_bytes=int(getattr(p, "L2_cache_size", 0)),
                    cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
                    gpus_visible=torch.cuda.device_count())
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.mem,"
                                "power.limit,temperature.gpu", "--format=csv,noheader", "-i", "0"],
                               capture_output=True, text=True, timeout=20)
            f = [x.strip() for x in q.stdout.strip().splitlines()[0].split(",")]
            info.update(driver=f[0], sm_clock_at_start=f[1], mem_clock=f[2], power_limit=f[3],
                        temperature_c=f[4])
        except Exception as exc:
            info["driver"] = f"unknown ({type(exc).__name__})"
    else:
        info.update(gpu_name=f"CPU {platform.processor() or platform.machine()}", cuda=None)
    return info


def gpu_key(info: dict, override: Optional[str]) -> str:
    """Folder name under packs/ and validation/: a servesim.hardware.GPUS key where one fits."""
    if override:
        return override
    n = str(info.get("gpu_name", "")).lower()
    if info.get("cuda") is None:
        return "cpu"
    if "h200" in n:
        return "h200"
    if "h100" in n and ("80" in n or n.strip() == "nvidia h100"):
        return "h100-80g"
    if "a100" in n and "80" in n:
        return "a100-80g"
    return "".join(ch if ch.isalnum() else "-" for ch in n).strip("-") or "gpu"


def device_string(info: dict) -> str:
    if info.get("cuda") is None:
        return f"{info['gpu_name']}, torch {info['torch']}"
    return (f"{info['gpu_name']} {info['gpu_mem_mib']} MiB, driver {info.get('driver')}, "
            f"CUDA {info['cuda']}, cuDNN {info.get('cudnn')}, torch {info['torch']}")


def base_meta(gpu: str, model: str, tp: int, info: dict, rs: RankShape) -> dict:
    s = ALL_SHAPES[model]
    extra = {}
    if rs.weights != "bf16":
        extra.update(quantization=rs.weights, kv_cache_dtype="auto")
    if rs.moe:
        extra.update(routing="uniform at random per token (router logits + a per-token random offset, "
                             "std 4, in the op tables and the forwards: every expert about equally loaded; "
                             "real routers are skewed)")
    return dict(gpu=gpu, model=model, tp=tp, dtype=FORMAT_DTYPE[rs.weights], **extra,
                shape={k: s[k] for k in SHAPE_KEYS + (MOE_KEYS if rs.moe else ())},
                source="measured",
                origin=f"calibration/profile_gpu.py on {info.get('gpu_name')}",
                date=datetime.date.today().isoformat(),
                device=device_string(info),
                rank_shape=rs.as_dict(),
                environment=info)


def setup(args) -> tuple[torch.device, Budget, dict]:
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device visible; use --device cpu for a logic test")
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    MOE_DEFAULT["backend"] = getattr(args, "moe_backend", None) or "auto"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:  # logic tests: one intra-op thread, as tiny ops want, and no spinning OpenMP threads
        torch.set_num_threads(1)  # oversubscribing a shared CPU (parallel tasks of `all`: 3x slower)
    now = time.time()
    hard = args.deadline_epoch or (now + args.time_budget_s if args.time_budget_s else None)
    soft = args.soft_deadline_epoch or (now + 0.8 * args.time_budget_s if args.time_budget_s else None)
    return device, Budget(soft=soft, hard=hard), device_info(device)


def method_text(timer: Timer, extra: str = "") -> str:
    if timer.cuda:
        m = (f"CUDA events; {timer.warmup} warm-up calls; op captured R times back to back in a CUDA "
             f"graph (R so that one replay >= {timer.target_graph_ms} ms, at most {timer.max_r}), "
             f"time = replay / R; median of {timer.min_rep}-{timer.max_rep} replays (fewer for long "
             f"ops), std over them; weights and KV caches rotated among copies totalling >= 4x L2; "
             f"bf16 random weights")
    else:
        m = (f"wall clock on CPU (logic test only); {timer.warmup} warm-up calls; median of "
             f"{timer.min_rep}-{timer.max_rep} repeats; bf16 random weights")
    return m + extra


def measure_peaks(device, timer: Timer, quick: bool = False) -> dict:
    """The two ceilings packs are compared with (achieved HBM bandwidth, achieved TFLOP/s): a
    device-to-device copy (bytes read + written / time) and a square bf16 GEMM on random data,
    timed like every op (graph replay, median). Datasheet peaks are leads; these are measured."""
    out: dict = {}
    if device.type != "cuda":
        return {"note": "not measured on CPU"}
    try:
        n = (64 << 20) if quick else (1 << 30)  # bytes per buffer: far beyond L2
        x = torch.randn(n // 2, device=device, dtype=torch.bfloat16)
        y = torch.empty_like(x)
        m = timer.measure([lambda: y.copy_(x)], "peak copy")
        if m is not None:
            out["copy_bytes_per_s"] = round(2 * n / (m.median_ms * 1e-3), -6)
            out["copy_ms"] = round(m.median_ms, 5)
        del x, y
        k = 2048 if quick else 8192
        a = torch.randn(k, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(k, k, device=device, dtype=torch.bfloat16)
        m = timer.measure([lambda: torch.mm(a, b)], "peak gemm")
        if m is not None:
            out["bf16_gemm_flops_per_s"] = round(2 * k ** 3 / (m.median_ms * 1e-3), -9)
            out["gemm_ms"] = round(m.median_ms, 5)
        del a, b
        torch.cuda.empty_cache()
        out["method"] = (f"copy_ of {n >> 20} MiB bf16 (2x bytes counted); {k}^3 bf16 torch.mm on "
                         f"random data; CUDA-graph replay, median")
    except Exception as exc:  # informative only
        out["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
    log(f"device peaks: {out}")
    return out

