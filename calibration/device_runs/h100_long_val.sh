# Device run (seventh session of 2026-12-05, kind nvidia-h100-x1): whole-iteration validation
# forwards at long contexts on the H100 (`iterations --compositions long`, grids.py LONG_*: every
# batch beyond the dense grid and off the long grid's points), for the three packs that carry the
# H100 long rows of call 25 (llama-3.1-8b, qwen3-14b, qwen3-8b). Never read by any fit: they check
# the long rows and the interpolation between them (benchmarks/long_validation.py). Attention
# backends as call 25's ops run chose them (its tarball, tracked in git, is the --backends-from).
# CUDA graph for every composition, eager for the first only; deadlines per model inside 9 minutes.
# Results: $OUT/h100_long_val.tar.gz (m/ with the w folder, logs). (The model/deadline loop was
# rewritten after call 27 in a form the device-run command test parses; the same commands.)
#   bash calibration/device_runs/h100_long_val.sh          (CPU dry run: DRY=1 bash ...)
export PYTHONUNBUFFERED=1; set -o pipefail
P=calibration/profile_gpu.py; R=/tmp/hv/m; rm -rf /tmp/hv; mkdir -p $R /tmp/hv/src; T0=$(date +%s)
OUT=${OUT:-/tmp/hv/out}; mkdir -p $OUT
tar xzf calibration/device_runs/results_2026-12-05/h100_long.tar.gz -C /tmp/hv/src
B=/tmp/hv/src/m/d/packs/h100-80g; X=; MS="llama-3.1-8b qwen3-14b qwen3-8b"; DL="230 380 500"  # deadlines, s
if [ "${DRY:-0}" = 1 ]; then B=; X="--device cpu --quick"; MS="tiny"; DL="60"; fi
left() { echo $(( $1 - ($(date +%s) - T0) )); }
st() { echo "$1 rc=$2 t=$(( $(date +%s)-T0 ))s" | tee -a $R/progress; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader > $R/smi_start.txt 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')" > $R/env.txt 2>&1; cat $R/env.txt
set -- $DL
for m in $MS; do D=$1; shift
  [ $(left $D) -gt 30 ] || { st "$m skipped" 0; continue; }
  timeout $(left $((D+20))) python3 $P iterations --model $m --compositions long ${B:+--backends-from $B} --fwd-max-rep 5 --fwd-budget-ms 1500 --eager-every 1000 --deadline-epoch $((T0+D)) --soft-deadline-epoch $((T0+D-20)) $X --out $R/w > $R/w_$m.log 2>&1; st $m $?
done
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader > $R/smi_end.txt 2>&1
{ echo "== progress"; cat $R/progress; echo "== problems"; grep -hE "SKIP|DROP|Error|FAIL|Traceback|budget ran out|failed" $R/*.log | head -20
  echo "== written"; grep -h "wrote" $R/*.log; } > $R/summary.txt 2>&1
cat $R/summary.txt
cd /tmp/hv && tar czf $OUT/h100_long_val.tar.gz m; ls -la $OUT; echo "total $(( $(date +%s)-T0 ))s"
