# Here (no GPU), after precision_moe_wait.sh: turn the 2026-12-05 run's output (final.tar.gz) into
# shipped packs, validation files and surveys. Needs a Python with numpy and PyYAML (profile_gpu.py's merge and combine need no torch).
#   bash calibration/device_runs/precision_moe_integrate.sh /path/to/final.tar.gz
set -euo pipefail
TAR=$1; W=$(mktemp -d); tar xzf "$TAR" -C $W; M=$W/m; H=calibration/packs/h200; V=calibration/validation/h200
PY=${PY:-python3}
# 1. the FP8 and MoE packs, with the send_recv rows of the 2-GPU collectives run (same H200 host type)
for s in llama-3-8b-fp8:b qwen3-30b-a3b:c; do n=${s%%:*}; d=${s##*:}
  [ -f $M/$d/packs/h200/$n.csv ] || { echo "no $n pack"; continue; }
  cp $M/$d/packs/h200/$n.csv $M/$d/packs/h200/$n.yaml $H/
  $PY -c "import sys; sys.path.insert(0,'calibration'); import profile_gpu as pg; from pathlib import Path; pg.merge_collectives_into(Path('$H/$n.csv'), [Path('$H/collectives/collectives_2gpu.csv')])"
done
# 2. validation forwards
for n in llama-3-8b-fp8 qwen3-30b-a3b; do [ -f $M/v/validation/h200/$n.csv ] && cp $M/v/validation/h200/$n.* $V/; done
# 3. the long grid: appended to qwen3-8b (all ops), qwen3-4b (attention: same kernels and shapes as
#    qwen3-8b's), and llama-3.1-8b = llama-3-8b's dense pack (same layer shapes) + its long rows
if [ -d $M/d/packs/h200 ]; then
  S=$W/stage/packs/h200; mkdir -p $S
  cp $H/qwen3-8b.csv $H/qwen3-8b.yaml $S/
  cp $H/llama-3-8b.csv $S/llama-3.1-8b.csv
  sed -e 's/^model: llama-3-8b$/model: llama-3.1-8b/' $H/llama-3-8b.yaml > $S/llama-3.1-8b.yaml
  echo "composed_from: 'calibration/packs/h200/llama-3-8b (dense grid; same layer shapes, the rope table aside) + qwen3-8b''s dense attention rows to 32K (same attention kernels and shapes) + the --grid long run of llama-3.1-8b (contexts to 128K), see added_rows'" >> $S/llama-3.1-8b.yaml
  mkdir -p $W/stage31/packs/h200; mv $S/llama-3.1-8b.* $W/stage31/packs/h200/
  $PY calibration/profile_gpu.py combine --out $W/stage31 --add-from $H --add-alias llama-3.1-8b:qwen3-8b --add-ops attn_prefill,attn_decode --note "qwen3-8b's attention rows beyond llama-3-8b's 8K context"
  mv $W/stage31/packs/h200/llama-3.1-8b.* $S/
  $PY calibration/profile_gpu.py combine --out $W/stage --add-from $M/d/packs/h200 --note "long-context rows appended (2026-12-05 H200 run, --grid long)"
  # qwen3-4b takes only attention from qwen3-8b (its GEMMs have other shapes)
  mkdir -p $W/stage4/packs/h200; cp $H/qwen3-4b.csv $H/qwen3-4b.yaml $W/stage4/packs/h200/
  $PY calibration/profile_gpu.py combine --out $W/stage4 --add-from $M/d/packs/h200 --add-alias qwen3-4b:qwen3-8b --add-ops attn_prefill,attn_decode --note "long-context attention rows of qwen3-8b appended (same attention kernels and shapes)"
  cp $S/* $W/stage4/packs/h200/* $H/
fi
# 4. surveys
if [ -d $M/e/surveys/h200 ]; then mkdir -p calibration/surveys/h200; cp $M/e/surveys/h200/* calibration/surveys/h200/; fi
cat $M/progress; ls -la $H $V calibration/surveys/h200 2>/dev/null | tail -30
