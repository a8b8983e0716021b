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
  PYTHONPATH=$PWD $PY - "$H/$PK.csv" "$H/${PK%-fp8}.csv" "$G" <<'PYEOF'
import sys
from pathlib import Path

import yaml
sys.path.insert(0, "calibration")
from profiler.writers import read_rows, write_rows  # noqa: E402

from servesim.perf.efficiency import pack_efficiency  # noqa: E402
from servesim.perf.pack import load_pack  # noqa: E402

new, bf, gpu = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
rows = [r for r in read_rows(new) if r[0] != "overhead_eager"] + [r for r in read_rows(bf) if r[0] == "overhead_eager"]
rows = sorted(rows, key=lambda r: (r[0], int(r[2]), int(r[1]), int(r[3]), int(r[4])))
write_rows(new, rows)
meta = yaml.safe_load(new.with_suffix(".yaml").read_text())
meta["rows"] = len(rows)
new.with_suffix(".yaml").write_text(yaml.safe_dump(meta, sort_keys=False, width=100, default_flow_style=None))
pack = load_pack(gpu, new.stem, 1)
meta["efficiency"] = pack_efficiency(pack)
new.with_suffix(".yaml").write_text(yaml.safe_dump(meta, sort_keys=False, width=100, default_flow_style=None))
print(new.name, "overhead rows: median of", meta["overhead"]["combined"]["processes"], "processes; overhead_eager from", bf.name)
PYEOF
  PYTHONPATH=$PWD $PY -m servesim.cli calibrate validate --gpu $G --model $PK > $W/after_$PK.txt 2>&1 || true
  echo "== $G/$PK before / after"; grep -E "graph +all|eager +all" $W/before_$PK.txt $W/after_$PK.txt || echo "  (no validation forwards of $PK on $G)"
done
PYTHONPATH=$PWD $PY tests/fixtures/make_step_times.py
echo "work folder: $W"
