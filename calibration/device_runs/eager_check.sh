# Issue 28: eager vs CUDA-graph decode forwards of llama-3-8b on the H200 at short contexts
# (128, 450) and large batches (256, 512, 800), plus CPU-bound references; data the eager floor's
# fit never read. Two processes (the eager launch time varies between processes: VALIDATION.md,
# "Noise floor"). Run from the repository root; results under $OUT (6 files). ~2 min on an H200.
export PYTHONUNBUFFERED=1; set -o pipefail; T0=$(date +%s)
S=calibration/device_runs/eager_check.py; W=/tmp/eager_check
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.limit --format=csv,noheader
  python3 -c "import torch;print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())"
  lscpu | grep -E "Model name|^CPU\(s\)"; uptime; } > $OUT/env.txt 2>&1
cat $OUT/env.txt
for r in 1 2; do
  echo "== process $r"
  timeout 100 python3 $S iterations --model llama-3-8b --backends-from calibration/packs/h200 \
      --time-budget-s 75 --out $W/r$r 2>&1 | tee -a $OUT/log.txt | grep -E "iterations:|/[0-9]+\]|SKIP|rror|wrote"
  cp $W/r$r/validation/*/llama-3-8b.csv $OUT/run$r.csv; cp $W/r$r/validation/*/llama-3-8b.yaml $OUT/run$r.yaml
  echo "t=$(( $(date +%s)-T0 ))s"
done
ls -la $OUT; echo total $(( $(date +%s)-T0 ))s
