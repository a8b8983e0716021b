"""The command line: ``python calibration/profile_gpu.py MODE ...`` (calibration/profile_gpu.py
calls :func:`main`). Parsing is torch-free; a mode's module (and torch) loads when it is named."""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys
import traceback

from . import __doc__ as _package_doc
from .common import log
from .grids import CALIB_BATCHES, OPS_STAGES
from .shapes import ALL_SHAPES, PACK_WEIGHTS, SHAPES

#: mode -> (module of this package, function)
MODES = {"ops": ("mode_ops", "cmd_ops"), "iterations": ("mode_iterations", "cmd_iterations"),
         "survey": ("mode_misc", "cmd_survey"), "allreduce": ("mode_collectives", "cmd_allreduce"),
         "all": ("mode_all", "cmd_all"), "merge": ("combine", "cmd_merge"),
         "backends": ("mode_misc", "cmd_backends"), "combine": ("combine", "cmd_combine")}
THEN = "--then"


def main(argv=None) -> int:
    """One mode, or several chained with ``--then`` and run one after another in this process
    (torch and CUDA start once; e.g. ``ops ... --then iterations ...``). The exit status is the
    first non-zero one."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if THEN in argv:
        parts, cur = [], []
        for a in argv:
            if a == THEN:
                parts.append(cur)
                cur = []
            else:
                cur.append(a)
        parts.append(cur)
        rc = 0
        for part in parts:
            log("chained: " + " ".join(shlex.quote(a) for a in part))
            r = _main_one(part)
            rc = rc or r
        return rc
    return _main_one(argv)


def _main_one(argv: list) -> int:
    args = build_parser().parse_args(argv)
    try:
        module, name = MODES[args.mode]
        return getattr(importlib.import_module(f"{__package__}.{module}"), name)(args)
    except SystemExit:
        raise
    except Exception:
        traceback.print_exc()
        return 1


def build_parser() -> argparse.ArgumentParser:
    """Every mode's arguments (torch-free: tests parse the device scripts' command lines with it)."""
    p = argparse.ArgumentParser(description=(_package_doc or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)

    def common(sp):
        sp.add_argument("--out", required=True, help="output folder (packs/, validation/, collectives/)")
        sp.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: wall-clock logic test (use with a tiny model)")
        sp.add_argument("--quick", action="store_true", help="tiny grids, for smoke tests")
        sp.add_argument("--sdpa", choices=["auto", "flash", "cudnn", "efficient", "math"], default="auto",
                        help="SDPA backend; auto tries flash, cudnn, efficient, math in that order")
        sp.add_argument("--gpu-key", default=None, help="folder name for the GPU (default: from its name)")
        sp.add_argument("--time-budget-s", type=float, default=None,
                        help="stop measuring after this many seconds (minimum repeats after 75-80%%)")
        sp.add_argument("--deadline-epoch", type=float, default=None, help=argparse.SUPPRESS)
        sp.add_argument("--soft-deadline-epoch", type=float, default=None, help=argparse.SUPPRESS)
        sp.add_argument("--parent-command", default=None, help=argparse.SUPPRESS)
        sp.add_argument("--moe-backend", choices=["auto", "triton-fused", "grouped_mm", "loop"], default="auto",
                        help="MoE experts' kernels (calibration/profiler/variants.py MoE): auto = triton-fused "
                             "on a CUDA GPU with Triton, else grouped_mm, else loop (the survey times all it can)")

    def add_grid_args(sp):
        sp.add_argument("--grid", choices=["dense", "sparse", "long"], default="dense",
                        help="op grid: dense (default; see DENSE_* in calibration/profiler/grids.py) or sparse (the "
                             "powers-of-two grid of the first H200 packs)")
        sp.add_argument("--max-rep", type=int, default=None,
                        help="most timed replays per point (default 10 dense, 20 sparse)")

    models = sorted(ALL_SHAPES)
    sp = sub.add_parser("ops", help="op tables (one pack per model and TP degree)")
    sp.add_argument("--model", required=True,
                    help=f"model, or a comma list (one process, shared measurements): {models}")
    sp.add_argument("--tp", default="1", help="TP degree, or a comma list")
    sp.add_argument("--collectives", default=None, help="collectives CSV to merge into the pack")
    sp.add_argument("--skip-overhead", action="store_true")
    sp.add_argument("--stages", default=None,
                    help=f"comma list of stages to run (default all): {OPS_STAGES}")
    sp.add_argument("--tables-from", default=None,
                    help="folder of packs whose op rows give the table sums (for --stages overhead)")
    sp.add_argument("--prefill-max-rep", type=int, default=None,
                    help="most timed replays per prefill attention point (default: --max-rep)")
    sp.add_argument("--calib-batches", default=None,
                    help=f"comma list: overhead calibration batches to measure (default {CALIB_BATCHES})")
    sp.add_argument("--weights", choices=PACK_WEIGHTS, default="bf16",
                    help="weight format of the projection GEMMs (fp8: e4m3 per-tensor, calibration/profiler/variants.py)")
    sp.add_argument("--attention-from", default=None,
                    help="packs/<gpu> folder of bf16 packs whose attention rows (and SDPA choice) to "
                         "reuse instead of measuring attention (for --weights fp8)")
    add_grid_args(sp)
    common(sp)
    sp = sub.add_parser("iterations", help="whole-forward validation data for one model (TP 1, or --tp N)")
    sp.add_argument("--model", required=True, choices=models)
    sp.add_argument("--weights", choices=PACK_WEIGHTS, default="bf16",
                    help="weight format of the projection GEMMs (as the pack's ops run)")
    sp.add_argument("--max-compositions", type=int, default=None)
    sp.add_argument("--every", type=int, default=1,
                    help="measure every k-th composition only (a stratified subset, e.g. for "
                         "run-to-run noise checks)")
    sp.add_argument("--share-layer-weights", action="store_true",
                    help="one set of layer weights for all layers (small GPUs)")
    sp.add_argument("--tp", type=int, default=1,
                    help="TP degree: > 1 runs one process per GPU with NCCL all-reduces "
                         "(validation/<gpu>/<model>-tp<N>.csv)")
    sp.add_argument("--backends-from", default=None,
                    help="folder of packs whose YAML (sdpa.choice) gives each attention call's "
                         "backend, so the forwards run what the op tables timed")
    sp.add_argument("--eager-every", type=int, default=1,
                    help="measure eager forwards for every k-th composition only (graph: all)")
    sp.add_argument("--fwd-max-rep", type=int, default=None, help="most timed forwards per mode (15)")
    sp.add_argument("--fwd-budget-ms", type=float, default=None,
                    help="GPU time spent on one composition's timed forwards per mode (400)")
    sp.add_argument("--compositions", choices=("standard", "long"), default="standard",
                    help="long: the long-context set beyond the dense grid (grids.py LONG_*), written to "
                         "validation_long/<gpu>/ (TP 1)")
    common(sp)
    sp = sub.add_parser("survey", help="op surveys: GEMM formats, MoE, fp8-KV and MLA decode attention")
    common(sp)
    sp.add_argument("--which", default=None, help="comma list of surveys (default all): gemm, moe, decode_kv, mla")
    sp.add_argument("--max-rep", type=int, default=None, help="most timed replays per point (10)")

    sp = sub.add_parser("allreduce", help="NCCL all_reduce over N GPUs and send_recv between 2")
    sp.add_argument("--gpus", type=int, default=2)
    sp.add_argument("--eager-collectives", action="store_true",
                    help="time eager calls only (no CUDA-graph capture of the collectives)")
    common(sp)
    sp = sub.add_parser("all", help="collectives, then ops and iterations for several models")
    add_grid_args(sp)
    sp.add_argument("--models", default=",".join(SHAPES))
    sp.add_argument("--tps", default="1,2")
    sp.add_argument("--iter-models", default=None, help="models for iterations (default: --models; '' none)")
    sp.add_argument("--workers", type=int, default=0, help="parallel tasks (default: one per GPU)")
    sp.add_argument("--skip-allreduce", action="store_true")
    common(sp)
    sp = sub.add_parser("backends", help="time a few attention shapes on each SDPA backend")
    sp.add_argument("--model", required=True, choices=models)
    sp.add_argument("--tp", type=int, default=1)
    common(sp)
    sp = sub.add_parser("merge", help="merge collectives/<gpu>/*.csv into the packs under --out")
    sp.add_argument("--out", required=True)
    sp = sub.add_parser("combine", help="keep some ops' rows from older packs; median overheads "
                                        "over several processes (no GPU needed)")
    sp.add_argument("--out", required=True, help="folder whose packs/<gpu>/*.csv are rewritten")
    sp.add_argument("--keep-from", default=None, help="folder of older packs (same file names)")
    sp.add_argument("--keep-ops", default=None, help="comma list of ops whose rows to keep from them")
    sp.add_argument("--replace-from", default=None,
                    help="folder of newer packs (same file names) whose --replace-ops rows replace these")
    sp.add_argument("--replace-ops", default=None, help="comma list of ops to take from --replace-from")
    sp.add_argument("--overheads-from", default=None,
                    help="comma list of --out folders of `ops --stages overhead --tables-from` runs")
    sp.add_argument("--note", default=None, help="provenance text stored in each YAML (combined.note)")
    sp.add_argument("--add-from", default=None, help="folder of packs whose rows at new points to append")
    sp.add_argument("--add-ops", default=None, help="comma list: only these ops' rows (default all but overheads)")
    sp.add_argument("--add-alias", default=None,
                    help="comma list target:source, e.g. qwen3-4b:qwen3-8b (source pack for a target)")
    return p
