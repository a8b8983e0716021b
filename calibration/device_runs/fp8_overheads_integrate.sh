# Here (no GPU): fold fp8_overheads.sh's two extra processes into the shipped dynamic-FP8 packs of
# the GPU that ran it (read from env.txt), as call 16 did for the H100 packs:
#   1. validate the packs as shipped -> $W/before_<pack>.txt
#   2. each pack copied to a scratch folder, `profile_gpu.py combine --overheads-from o2,o3` (the
#      median over 3 processes of forward - table sum, per op and batch; every process kept in the
#      YAML), copied back
#   3. the overhead_eager rows set again to the bf16 pack's of the same model (combine recomputes
#      them from the recipe's eager forwards, which the engines' fused casts do not launch: the
#      packs' overhead_eager_source), the efficiency record
#   4. validate again -> after; the step-time fixture rebuilt
# Needs the repo's venv. Usage: bash calibration/device_runs/fp8_overheads_integrate.sh fp8_overheads.tar.gz
set -euo pipefail
TAR=$1; W=$(mktemp -d); PY=${PY:-python}
tar xzf "$TAR" -C $W
cat $W/m/progress $W/m/env.txt
if grep -q H200 $W/m/env.txt; then G=h200; elif grep -q H100 $W/m/env.txt; then G=h100-80g; else echo "unknown GPU: $(cat $W/m/env.txt)"; exit 3; fi
H=calibration/packs/$G; C=$W/c/packs/$G; mkdir -p $C
PKS=$(cd $W/m/o2/packs/$G && ls *-fp8.yaml | sed 's/\.yaml$//')
for PK in $PKS; do
  PYTHONPATH=$PWD $PY -m servesim.cli calibrate validate --gpu $G --model $PK > $W/before_$PK.txt 2>&1 || true
  cp $H/$PK.csv $H/$PK.yaml $C/
done
$PY calibration/profile_gpu.py combine --out $W/c --overheads-from $W/m/o2,$W/m/o3 --note "overhead forwards of two more processes (calibration/device_runs/fp8_overheads.sh, 2026-12-06): median of 3 processes, as the other packs; overhead_eager rows then set again to the bf16 pack's (overhead_eager_source)"
for PK in $PKS; do
  cp $C/$PK.csv $C/$PK.yaml $H/
  PYTHONPATH=$PWD $PY calibration/device_runs/fp8_pack_fixups.py bf16-eager "$H/$PK.csv" "$H/${PK%-fp8}.csv" "$G" --no-record
  PYTHONPATH=$PWD $PY calibration/device_runs/fp8_pack_fixups.py efficiency "$G" "$PK"
  PYTHONPATH=$PWD $PY -m servesim.cli calibrate validate --gpu $G --model $PK > $W/after_$PK.txt 2>&1 || true
  echo "== $G/$PK before / after"; grep -E "graph +all|eager +all" $W/before_$PK.txt $W/after_$PK.txt || echo "  (no validation forwards of $PK on $G)"
done
PYTHONPATH=$PWD $PY tests/fixtures/make_step_times.py
echo "work folder: $W"
