# Here (no GPU): turn device calls 17 and 18 of 2026-12-05 (one NVIDIA H100 80GB HBM3, 15:57-16:02
# UTC) into the shipped h100-80g/llama-3.1-8b pack, as calls 13-16 were for h100-80g/llama-3-8b:
#   call 17: MODEL=llama-3.1-8b bash calibration/device_runs/h100_llama.sh   -> h100_llama31.tar.gz
#   call 18: the overhead forwards in two more processes (same warm machine, the call-17 pack in
#            calibration/packs/h100-80g/):  for k in 2 3; do python3 calibration/profile_gpu.py ops
#            --model llama-3.1-8b --tp 1 --stages overhead --tables-from calibration/packs/h100-80g
#            --out /tmp/ho/m/o$k; done                                       -> h100_overheads31.tar.gz
# Also the script of later H100 packs of one model (MODEL=... with CALLS, CALLS2, NOTE18 naming their calls).
# Steps: h100_integrate.sh (pack, send_recv rows, validation forwards, provenance, efficiency record),
# then `profile_gpu.py combine --overheads-from` (overhead rows = median of the 3 processes, as call
# 16 did for the first H100 packs; run from a scratch folder so that the YAML names the tarball's
# m/o2, m/o3 and the command as typed), then the step-time fixture (the pack is in ADDED_LATER). Needs the repo's venv.
#   bash calibration/device_runs/h100_llama31_integrate.sh calibration/device_runs/results_2026-12-05/h100_llama31.tar.gz \
#        calibration/device_runs/results_2026-12-05/h100_overheads31.tar.gz
set -euo pipefail
A=$(realpath "$1"); O=$(realpath "$2"); PY=${PY:-python}; G=h100-80g; MODEL=${MODEL:-llama-3.1-8b}
# the overhead processes' call, as the YAML will say (another model: MODEL=... CALLS=... NOTE18=...)
NOTE18_31="device call 18 (2026-12-05 16:01 UTC, one NVIDIA H100 80GB HBM3, the machine of call 17): the overhead forwards measured in two more processes against these tables; overhead rows = median of 3 processes (this pack's process of call 17 + o2 + o3), as the other H100 and the H200 packs"
NOTE18=${NOTE18:-$NOTE18_31}
CALLS=${CALLS:-"call 17"}; CALLS2=${CALLS2:-"call 18"}
ROOT=$PWD; W=$(mktemp -d); mkdir -p $W/c/packs/$G
bash calibration/device_runs/h100_integrate.sh "$A"
cp calibration/packs/$G/$MODEL.csv calibration/packs/$G/$MODEL.yaml $W/c/packs/$G/
tar xzf "$O" -C $W
ln -s $ROOT/calibration $W/calibration
(cd $W && $PY calibration/profile_gpu.py combine --out c --overheads-from m/o2,m/o3 --note "$NOTE18")
cp $W/c/packs/$G/$MODEL.csv $W/c/packs/$G/$MODEL.yaml calibration/packs/$G/
CALLS="$CALLS" CALLS2="$CALLS2" $PY - calibration/packs/$G/$MODEL.yaml <<'EOF'
import os
import sys
from pathlib import Path

import yaml
path = Path(sys.argv[1])
meta = yaml.safe_load(path.read_text())
meta["overhead"]["processes"] = (f"3: the overhead forwards ran in this pack's profiler process ({os.environ['CALLS']}) "
                                 f"and in two more processes on the same machine ({os.environ['CALLS2']}); overhead "
                                 "rows = their median per op and batch (overhead.combined), as the H200 packs")
path.write_text(yaml.safe_dump(meta, sort_keys=False, width=100, default_flow_style=None))
EOF
rm -rf $W
PYTHONPATH=$PWD $PY tests/fixtures/make_step_times.py
$PY -m servesim.cli calibrate validate --gpu $G | tail -25
