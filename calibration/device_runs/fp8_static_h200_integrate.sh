# Here (no GPU): turn fp8_static.sh's output from an H200 into the shipped packs
# h200/llama-3-8b-fp8_static and h200/llama-3.1-8b-fp8_static and the llama-3-8b fp8_static
# validation forwards. Unlike the H100 run (fp8_static_integrate.sh), the script's attention rows
# (copied from calibration/packs/h200, measured on an H200) belong to the GPU that ran it, so the
# overhead rows stand as measured. What changes, as for every fp8 pack:
#   1. overhead_eager rows taken from the H200 bf16 pack of the same model (the recipe's eager
#      forward launches the casts as extra kernels; engines fuse them: YAML overhead_eager_source)
#   2. send_recv rows (the H200 2-GPU run's collectives) and each pack's efficiency record
# Checked end to end (2026-12-05, sixth session; no H200 was lent) on the H100 run's tarball
# relabelled as an H200's (folders, env.txt, YAML gpu): both packs load, their overhead_eager rows
# are the bf16 pack's, send_recv rows and efficiency records are written; the real H100 tarball is
# refused (exit 3). Needs the repo's venv. Usage: bash calibration/device_runs/fp8_static_h200_integrate.sh fp8_static.tar.gz
set -euo pipefail
TAR=$1; W=$(mktemp -d); PY=${PY:-python}
tar xzf "$TAR" -C $W
G=h200; H=calibration/packs/$G; V=calibration/validation/$G; mkdir -p $H $V
cat $W/m/progress $W/m/env.txt
grep -q "H200" $W/m/env.txt || { echo "not an H200 run: $(cat $W/m/env.txt)"; exit 3; }
for PK in llama-3-8b-fp8_static llama-3.1-8b-fp8_static; do
  BF=${PK%-fp8_static}
  cp $W/m/a/packs/$G/$PK.csv $W/m/a/packs/$G/$PK.yaml $H/
  PYTHONPATH=$PWD $PY - "$H/$PK.csv" "$H/$BF.csv" <<'EOF'
import sys
from pathlib import Path

import yaml
sys.path.insert(0, "calibration")
from profiler.writers import read_rows, write_rows  # noqa: E402

new, bf = Path(sys.argv[1]), Path(sys.argv[2])
rows = read_rows(new)
measured = {int(r[2]): float(r[5]) for r in rows if r[0] == "overhead_eager"}
rows = [r for r in rows if r[0] != "overhead_eager"] + [r for r in read_rows(bf) if r[0] == "overhead_eager"]
rows = sorted(rows, key=lambda r: (r[0], int(r[2]), int(r[1]), int(r[3]), int(r[4])))
write_rows(new, rows)
meta = yaml.safe_load(new.with_suffix(".yaml").read_text())
meta["rows"] = len(rows)
meta["overhead_eager_source"] = (
    f"overhead_eager rows taken from the H200 bf16 pack of the same model ({bf.name}), not this recipe's. "
    "Why (as for the H200 fp8 and the H100 fp8_static packs): the engines fuse the activation's quantization "
    "into the norm / activation kernel, so their FP8 forward launches what the bf16 one does; this recipe's "
    "eager forward launches the casts as extra kernels and calls Python QLinear objects "
    "(overhead_eager_measured_by_recipe_ms). CUDA-graph iterations do not read these rows.")
meta["overhead_eager_measured_by_recipe_ms"] = {b: round(d, 4) for b, d in sorted(measured.items())}
text = yaml.safe_dump(meta, sort_keys=False, width=100, default_flow_style=None)
new.with_suffix(".yaml").write_text(text)
print(new.name, "overhead_eager replaced:", len(measured), "rows")
EOF
  $PY -c "import sys; sys.path.insert(0,'calibration'); import profile_gpu as pg; from pathlib import Path; pg.merge_collectives_into(Path('$H/$PK.csv'), [Path('calibration/packs/h200/collectives/collectives_2gpu.csv')])"
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
cp $W/m/v/validation/$G/llama-3-8b-fp8_static.csv $W/m/v/validation/$G/llama-3-8b-fp8_static.yaml $V/
rm -rf $W
