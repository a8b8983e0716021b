# Here (no GPU): turn the two H100 runs of h100_llama.sh (2026-12-05 13:46-13:54 UTC, one NVIDIA
# H100 80GB HBM3) into the shipped h100-80g packs and validation forwards, as done on 2026-12-05
# (fourth session). Needs the repo's venv (efficiency record, fixture; the merge needs no torch).
#   bash calibration/device_runs/h100_integrate.sh calibration/device_runs/results_2026-12-05/h100_llama.tar.gz \
#        calibration/device_runs/results_2026-12-05/h100_moe.tar.gz
# Then: git diff, the targeted tests (tests/test_pack*.py, test_transfer*.py, test_perf_kernels.py),
# servesim calibrate validate --gpu h100-80g, python benchmarks/transfer_check.py.
set -euo pipefail
PY=${PY:-python}; H=calibration/packs/h100-80g; V=calibration/validation/h100-80g
mkdir -p $H $V
for TAR in "$@"; do
  W=$(mktemp -d); tar xzf "$TAR" -C $W; M=$W/m
  cat $M/progress $M/env.txt
  for CSV in $M/a/packs/h100-80g/*.csv; do
    MODEL=$(basename $CSV .csv)
    # 1. the pack, with send_recv rows like every H200 pack. No two H100s were measured: the rows are
    #    the H200 2-GPU run's (calibration/packs/h200/collectives/), which the transfer rule
    #    (servesim/perf/transfer.py, bytes / link + 8 us) carries to the H100 unchanged: both NVLink4,
    #    450 GB/s a direction (servesim/hardware.py). The YAML says so.
    cp $CSV ${CSV%.csv}.yaml $H/
    $PY -c "import sys; sys.path.insert(0,'calibration'); import profile_gpu as pg; from pathlib import Path; pg.merge_collectives_into(Path('$H/$MODEL.csv'), [Path('calibration/packs/h200/collectives/collectives_2gpu.csv')])"
    # 2. the validation forwards, as measured
    cp $M/v/validation/h100-80g/$MODEL.csv $M/v/validation/h100-80g/$MODEL.yaml $V/
    # 3. provenance of the collectives and the overheads, and the efficiency record (what
    #    `servesim calibrate efficiency --write` writes, for this pack only: --write re-serialises
    #    every pack's YAML)
    PYTHONPATH=$PWD MODEL=$MODEL $PY - <<'EOF'
import os
import yaml
from servesim.perf.efficiency import pack_efficiency
from servesim.perf.pack import load_pack
pack = load_pack("h100-80g", os.environ["MODEL"], 1)
path = pack.csv_path.with_suffix(".yaml")
meta = yaml.safe_load(path.read_text())
for c in meta["collectives"]:
    c["measured_on"] = ("2 x NVIDIA H200 (calibration/packs/h200/collectives/), not on H100s: the "
                        "transfer rule's link term (bytes / link + 8 us) is the same for the H100 SXM "
                        "and the H200 (NVLink4, 450 GB/s a direction), so the rows are used as measured")
meta["overhead"]["processes"] = ("one: each overhead forward ran in this one profiler process (the H200 "
                                 "packs of 2026-12-01 took the median of 3 processes)")
meta["efficiency"] = pack_efficiency(pack)
path.write_text(yaml.safe_dump(meta, sort_keys=False, width=100, default_flow_style=None))
EOF
  done
  rm -rf $W
done
# 4. the step-time fixture (the h100-80g packs in ADDED_LATER)
PYTHONPATH=$PWD $PY tests/fixtures/make_step_times.py
$PY -m servesim.cli calibrate validate --gpu h100-80g | tail -25
