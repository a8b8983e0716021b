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
  PYTHONPATH=$PWD $PY calibration/device_runs/fp8_pack_fixups.py bf16-eager "$H/$PK.csv" "$H/$BF.csv" "$G"
  $PY -c "import sys; sys.path.insert(0,'calibration'); import profile_gpu as pg; from pathlib import Path; pg.merge_collectives_into(Path('$H/$PK.csv'), [Path('calibration/packs/h200/collectives/collectives_2gpu.csv')])"
  PYTHONPATH=$PWD $PY calibration/device_runs/fp8_pack_fixups.py efficiency "$G" "$PK"
  if [ -f $V/$PK.csv ]; then
    PYTHONPATH=$PWD $PY -m servesim.cli calibrate validate --gpu $G --model $PK > $W/after_$PK.txt 2>&1 || true
    echo "== $G/$PK measured"; tail -12 $W/after_$PK.txt
  fi
done
PYTHONPATH=$PWD $PY tests/fixtures/make_step_times.py
echo "work folder (before/after tables): $W"
