# Here (no GPU), after calibration/device_runs/h100_long.sh: append the H100 long-grid rows to the
# shipped H100 dense packs of the models measured (rows only at points a pack lacks, within the
# model's max_model_len; the YAML's added_rows says what came from where). As
# precision_moe_integrate.sh step 3 did for the H200. Needs numpy and PyYAML (no torch).
#   bash calibration/device_runs/h100_long_integrate.sh /path/to/h100_long.tar.gz
# The H200's qwen3-14b long rows (device call 29, seventh session) went in the same way:
#   G=h200 NAME=H200 NOTE="... H200 run ..." bash calibration/device_runs/h100_long_integrate.sh h200_long.tar.gz
set -euo pipefail
TAR=$1; W=$(mktemp -d); tar xzf "$TAR" -C $W; M=$W/m; G=${G:-h100-80g}; H=calibration/packs/$G
PY=${PY:-python3}; NAME=${NAME:-H100}
DEFNOTE="long-context rows appended (2026-12-05 H100 run, --grid long, calibration/device_runs/h100_long.sh)"
NOTE=${NOTE:-$DEFNOTE}
grep -q "$NAME" $M/env.txt || { echo "not an $NAME run: $(cat $M/env.txt)"; exit 1; }
S=$W/stage/packs/$G; mkdir -p $S
for n in llama-3.1-8b qwen3-14b qwen3-8b; do
  if [ -f $M/d/packs/$G/$n.csv ]; then cp $H/$n.csv $H/$n.yaml $S/; else echo "no long rows for $n"; fi
done
$PY calibration/profile_gpu.py combine --out $W/stage --add-from $M/d/packs/$G --note "$NOTE"
cp $S/* $H/
cat $M/progress; git status --short $H
