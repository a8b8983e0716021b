# Here (no GPU): turn moe_fused.sh's output (moe_fused.tar.gz of 2026-12-05 11:38 UTC) into the
# shipped survey, pack and validation files, as done on 2026-12-05 (fourth session; issue 29).
# Needs the repo's venv (servesim's efficiency record and fixture; profile_gpu.py's merge needs no torch).
#   bash calibration/device_runs/moe_fused_integrate.sh calibration/device_runs/results_2026-12-05/moe_fused.tar.gz
# Then: git diff, the targeted tests (tests/test_derive_variants.py, test_validation_targets.py,
# test_pack_efficiency.py, test_perf_kernels.py), python -m benchmarks.derived_published.
set -euo pipefail
TAR=$1; W=$(mktemp -d); tar xzf "$TAR" -C $W; M=$W/m; PY=${PY:-python}
S=calibration/surveys/h200; H=calibration/packs/h200; V=calibration/validation/h200
cat $M/progress $M/env.txt
# 1. the survey (both backends; derive reads triton-fused), saying what it replaces
cp $M/a/surveys/h200/moe.csv $M/a/surveys/h200/moe.yaml $S/
cat >> $S/moe.yaml <<'EOF'
replaces: 'the MoE survey of 2026-12-05 (second session, calibration/device_runs/precision_moe.sh stage E,
  calibration/profile_gpu.py, mode survey, --deadline-epoch 1796445185; git history of this
  file): torch._grouped_mm only, 4 configurations (no deepseek-v2-lite), tokens 1-16384, 96 rows, no backend
  column. This survey times the same grouped_mm path again (backend grouped_mm) beside the fused Triton
  kernel (backend triton-fused), tokens 1-8192, 5 configurations; derive reads triton-fused
  (servesim/tools/derive_moe.py ENGINE_BACKENDS). Raw device output:
  calibration/device_runs/results_2026-12-05/moe_fused.tar.gz (bash calibration/device_runs/moe_fused.sh,
  2026-12-05 11:38 UTC)'
EOF
# 2. the measured pack, with the 2-GPU run's send_recv rows like every H200 pack, and its forwards
cp $M/c/packs/h200/qwen3-30b-a3b.csv $M/c/packs/h200/qwen3-30b-a3b.yaml $H/
$PY -c "import sys; sys.path.insert(0,'calibration'); import profile_gpu as pg; from pathlib import Path; pg.merge_collectives_into(Path('$H/qwen3-30b-a3b.csv'), [Path('$H/collectives/collectives_2gpu.csv')])"
cp $M/v/validation/h200/qwen3-30b-a3b.csv $M/v/validation/h200/qwen3-30b-a3b.yaml $V/
# 3. its efficiency record (what `servesim calibrate efficiency --write` writes, for this pack only:
#    --write re-serialises every pack's YAML)
PYTHONPATH=$PWD $PY - <<'EOF'
import yaml
from servesim.perf.efficiency import pack_efficiency
from servesim.perf.pack import load_pack
pack = load_pack("h200", "qwen3-30b-a3b", 1)
path = pack.csv_path.with_suffix(".yaml")
meta = yaml.safe_load(path.read_text())
meta["efficiency"] = pack_efficiency(pack)
path.write_text(yaml.safe_dump(meta, sort_keys=False, width=100, default_flow_style=None))
EOF
# 4. the step-time fixture (("h200", "qwen3-30b-a3b", 1) in ADDED_LATER) and the validation table
PYTHONPATH=$PWD $PY tests/fixtures/make_step_times.py
$PY -m servesim.cli calibrate validate --gpu h200 --write calibration/VALIDATION.md | tail -3
rm -rf $W
