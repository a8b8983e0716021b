"""The two fix-ups every integrated FP8 pack gets, shared by fp8_dynamic_integrate.sh and
fp8_overheads_integrate.sh (one copy of each rule):

* ``bf16-eager NEW_CSV BF16_CSV GPU [--no-record]``: the pack's overhead_eager rows become the bf16
  pack's of the same model. Why: vLLM's fp8 linear is one fused quantization op plus one scaled
  GEMM, so an engine's eager FP8 forward launches about what the bf16 one does; the profiler's
  recipe launches the casts as extra kernels. The YAML says so (``overhead_eager_source``) and keeps
  what the recipe measured (``overhead_eager_measured_by_recipe_ms``) unless ``--no-record`` (a
  re-integration whose YAML already holds the first measurement).
* ``efficiency GPU PACK``: the efficiency record (what ``servesim calibrate efficiency --write``
  writes, for this pack only), and on a GPU other than the H200 the provenance of its send_recv
  rows, which are the H200 2-GPU run's.

Run from the repository root with PYTHONPATH=$PWD.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, "calibration")
from profiler.writers import read_rows, write_rows  # noqa: E402


def _dump(path: Path, meta: dict) -> None:
    path.write_text(yaml.safe_dump(meta, sort_keys=False, width=100, default_flow_style=None))


def bf16_eager(new: Path, bf: Path, gpu: str, record: bool = True) -> None:
    rows = read_rows(new)
    measured = {int(r[2]): float(r[5]) for r in rows if r[0] == "overhead_eager"}
    rows = [r for r in rows if r[0] != "overhead_eager"] + [r for r in read_rows(bf) if r[0] == "overhead_eager"]
    rows = sorted(rows, key=lambda r: (r[0], int(r[2]), int(r[1]), int(r[3]), int(r[4])))
    write_rows(new, rows)
    meta = yaml.safe_load(new.with_suffix(".yaml").read_text())
    meta["rows"] = len(rows)
    if record:
        meta["overhead_eager_source"] = (
            f"overhead_eager rows taken from the {gpu} bf16 pack of the same model ({bf.name}), not this recipe's. "
            "Why (as for every fp8 pack): vLLM's fp8 linear is one fused quantization op plus one scaled GEMM, so "
            "its eager FP8 forward launches about what the bf16 one does; this recipe's eager forward launches the "
            "casts as extra kernels and calls Python QLinear objects (overhead_eager_measured_by_recipe_ms). "
            "CUDA-graph iterations do not read these rows.")
        meta["overhead_eager_measured_by_recipe_ms"] = {b: round(d, 4) for b, d in sorted(measured.items())}
    _dump(new.with_suffix(".yaml"), meta)
    print(new.name, "overhead_eager from", bf.name, f"({len(measured)} recipe rows replaced)")


def efficiency(gpu: str, name: str) -> None:
    from servesim.perf.efficiency import pack_efficiency
    from servesim.perf.pack import load_pack

    pack = load_pack(gpu, name, 1)
    path = pack.csv_path.with_suffix(".yaml")
    meta = yaml.safe_load(path.read_text())
    if gpu != "h200":
        for c in meta.get("collectives", []):
            c["measured_on"] = ("2 x NVIDIA H200 (calibration/packs/h200/collectives/), not on this GPU: the "
                                "transfer rule's link term (bytes / link + 8 us) is the same for the H100 SXM "
                                "and the H200 (NVLink4, 450 GB/s a direction), so the rows are used as measured")
    meta["efficiency"] = pack_efficiency(pack)
    _dump(path, meta)


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "bf16-eager":
        bf16_eager(Path(args[0]), Path(args[1]), args[2], record="--no-record" not in args)
    elif cmd == "efficiency":
        efficiency(args[0], args[1])
    else:
        sys.exit(f"fp8_pack_fixups.py: unknown command {cmd!r}; allowed: bf16-eager, efficiency")
