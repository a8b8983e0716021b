# Here (no GPU): turn fp8_static.sh's output of vLLM's DYNAMIC FP8 recipe (WEIGHTS=fp8, eighth
# session, 2026-12-06) into shipped packs <model>-fp8 of the GPU that ran it (read from env.txt),
# replacing a derived pack of the same name, and score the derived pack first: the validation
# forwards of this run are data its derivation never read (calibration/COMMANDS.md, VALIDATION.md).
#   1. the validation forwards copied; `servesim calibrate validate` on the pack as shipped (derived,
#      or measured before) -> $W/before.txt
#   2. the measured pack copied over it; overhead_eager rows taken from the bf16 pack of the same
#      model (the engines fuse the activation quantization; YAML overhead_eager_source), send_recv
#      rows (the H200 2-GPU run's), the efficiency record
#   3. validate again -> after; the step-time fixture rebuilt
# Needs the repo's venv. Usage: bash calibration/device_runs/fp8_dynamic_integrate.sh fp8_dyn.tar.gz
set -euo pipefail
TAR=$1; W=$(mktemp -d); PY=${PY:-python}
tar xzf "$TAR" -C $W
cat $W/m/progress $W/m/env.txt
if grep -q H200 $W/m/env.txt; then G=h200; elif grep -q H100 $W/m/env.txt; then G=h100-80g; else echo "unknown GPU: $(cat $W/m/env.txt)"; exit 3; fi
H=calibration/packs/$G; V=calibration/validation/$G; mkdir -p $H $V
for CSV in $W/m/v/validation/$G/*-fp8.csv; do cp $CSV ${CSV%.csv}.yaml $V/; done
for CSV in $W/m/a/packs/$G/*-fp8.csv; do
  PK=$(basename $CSV .csv); BF=${PK%-fp8}
  if [ -f $V/$PK.csv ]; then
    PYTHONPATH=$PWD $PY -m servesim.cli calibrate validate --gpu $G --model $PK > $W/before_$PK.txt 2>&1 || true
    echo "== $G/$PK as shipped before ($(grep -m1 '^source:' $H/$PK.yaml 2>/dev/null || echo none))"; tail -12 $W/before_$PK.txt
  fi
  cp $CSV ${CSV%.csv}.yaml $H/
  PYTHONPATH=$PWD $PY - "$H/$PK.csv" "$H/$BF.csv" "$G" <<'PYEOF'
import sys
from pathlib import Path

import yaml
sys.path.insert(0, "calibration")
from profiler.writers import read_rows, write_rows  # noqa: E402

new, bf, gpu = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
rows = read_rows(new)
measured = {int(r[2]): float(r[5]) for r in rows if r[0] == "overhead_eager"}
rows = [r for r in rows if r[0] != "overhead_eager"] + [r for r in read_rows(bf) if r[0] == "overhead_eager"]
rows = sorted(rows, key=lambda r: (r[0], int(r[2]), int(r[1]), int(r[3]), int(r[4])))
write_rows(new, rows)
meta = yaml.safe_load(new.with_suffix(".yaml").read_text())
meta["rows"] = len(rows)
meta["overhead_eager_source"] = (
    f"overhead_eager rows taken from the {gpu} bf16 pack of the same model ({bf.name}), not this recipe's. "
    "Why (as for every fp8 pack): vLLM's fp8 linear is one fused quantization op plus one scaled GEMM, so "
    "its eager FP8 forward launches about what the bf16 one does; this recipe's eager forward launches the "
    "casts as extra kernels and calls Python QLinear objects (overhead_eager_measured_by_recipe_ms). "
    "CUDA-graph iterations do not read these rows.")
meta["overhead_eager_measured_by_recipe_ms"] = {b: round(d, 4) for b, d in sorted(measured.items())}
new.with_suffix(".yaml").write_text(yaml.safe_dump(meta, sort_keys=False, width=100, default_flow_style=None))
print(new.name, "overhead_eager replaced:", len(measured), "rows")
PYEOF
  $PY -c "import sys; sys.path.insert(0,'calibration'); import profile_gpu as pg; from pathlib import Path; pg.merge_collectives_into(Path('$H/$PK.csv'), [Path('calibration/packs/h200/collectives/collectives_2gpu.csv')])"
  PYTHONPATH=$PWD G=$G PK=$PK $PY - <<'PYEOF'
import os

import yaml
from servesim.perf.efficiency import pack_efficiency
from servesim.perf.pack import load_pack

gpu, pk = os.environ["G"], os.environ["PK"]
pack = load_pack(gpu, pk, 1)
path = pack.csv_path.with_suffix(".yaml")
meta = yaml.safe_load(path.read_text())
if gpu != "h200":
    for c in meta.get("collectives", []):
        c["measured_on"] = ("2 x NVIDIA H200 (calibration/packs/h200/collectives/), not on this GPU: the "
                            "transfer rule's link term (bytes / link + 8 us) is the same for the H100 SXM "
                            "and the H200 (NVLink4, 450 GB/s a direction), so the rows are used as measured")
meta["efficiency"] = pack_efficiency(pack)
path.write_text(yaml.safe_dump(meta, sort_keys=False, width=100, default_flow_style=None))
PYEOF
  if [ -f $V/$PK.csv ]; then
    PYTHONPATH=$PWD $PY -m servesim.cli calibrate validate --gpu $G --model $PK > $W/after_$PK.txt 2>&1 || true
    echo "== $G/$PK measured"; tail -12 $W/after_$PK.txt
  fi
done
PYTHONPATH=$PWD $PY tests/fixtures/make_step_times.py
echo "work folder (before/after tables): $W"
