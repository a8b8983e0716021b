# Here (no GPU): turn fp8_static.sh's output (fp8_static.tar.gz) into the shipped packs and
# validation files: h200/llama-3-8b-fp8_static and h200/llama-3.1-8b-fp8_static (+ the 2-GPU run's
# send_recv rows, like every H200 pack), validation/h200/llama-3-8b-fp8_static, each pack's
# efficiency record, and the step-time fixture (the packs in ADDED_LATER).
# Needs the repo's venv (servesim; profile_gpu.py's merge needs no torch).
#   bash calibration/device_runs/fp8_static_integrate.sh calibration/device_runs/results_2026-12-05/fp8_static.tar.gz
# Then: git diff, tests/test_validation_targets.py, test_pack_efficiency.py, test_perf_kernels.py,
# python -m benchmarks.published.
set -euo pipefail
TAR=$1; W=$(mktemp -d); tar xzf "$TAR" -C $W; M=$W/m; PY=${PY:-python}
H=calibration/packs/h200; V=calibration/validation/h200
cat $M/progress $M/env.txt
for PK in llama-3-8b-fp8_static llama-3.1-8b-fp8_static; do
  [ -f $M/a/packs/h200/$PK.csv ] || { echo "no $PK pack in $TAR"; continue; }
  cp $M/a/packs/h200/$PK.csv $M/a/packs/h200/$PK.yaml $H/
  $PY -c "import sys; sys.path.insert(0,'calibration'); import profile_gpu as pg; from pathlib import Path; pg.merge_collectives_into(Path('$H/$PK.csv'), [Path('$H/collectives/collectives_2gpu.csv')])"
  PYTHONPATH=$PWD $PY - "$PK" <<'EOF'
import sys

import yaml
from servesim.perf.efficiency import pack_efficiency
from servesim.perf.pack import load_pack

pack = load_pack("h200", sys.argv[1], 1)
path = pack.csv_path.with_suffix(".yaml")
meta = yaml.safe_load(path.read_text())
meta["efficiency"] = pack_efficiency(pack)
path.write_text(yaml.safe_dump(meta, sort_keys=False, width=100, default_flow_style=None))
EOF
done
[ -f $M/v/validation/h200/llama-3-8b-fp8_static.csv ] && cp $M/v/validation/h200/llama-3-8b-fp8_static.csv $M/v/validation/h200/llama-3-8b-fp8_static.yaml $V/
rm -rf $W
