# Device run of 2026-12-05 (fourth session): the H100 packs' overhead forwards in two more processes,
# so that their eager CPU floor is the median of 3 processes as in the H200 packs (the first run,
# h100_llama.sh, measured them in one process, which ran slower than the validation process: the
# H100 eager validation medians were 5.7 % (llama-3-8b) and 32.0 % (qwen3-30b-a3b)).
# Each process: overhead forwards of llama-3-8b, qwen3-30b-a3b (fused MoE) and llama-3-8b-fp8_static
# against the shipped tables (calibration/packs/h100-80g), chained with --then (torch starts once).
# Results: $OUT/h100_overheads.tar.gz (m/o2, m/o3, logs). Ends inside 5 minutes.
#   bash calibration/device_runs/h100_overheads.sh          (CPU dry run: DRY=1 bash ...)
export PYTHONUNBUFFERED=1; set -o pipefail
P=calibration/profile_gpu.py; R=/tmp/ho/m; rm -rf /tmp/ho; mkdir -p $R; T0=$(date +%s)
OUT=${OUT:-/tmp/ho/out}; mkdir -p $OUT
H=calibration/packs/h100-80g; X=
A="--model llama-3-8b"; B="--model qwen3-30b-a3b --moe-backend triton-fused"; C="--model llama-3-8b --weights fp8_static"
if [ "${DRY:-0}" = 1 ]; then
  X="--device cpu --quick"; H=$R/t/packs/cpu
  timeout 90 python3 $P ops --model tiny,tiny-moe $X --out $R/t > $R/t.log 2>&1
  A="--model tiny"; B="--model tiny-moe --moe-backend grouped_mm"; C="--model tiny"
fi
st() { echo "$1 rc=$2 t=$(( $(date +%s)-T0 ))s" | tee -a $R/progress; }
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader > $R/smi_start.txt 2>&1
for k in 2 3; do
  O="--tp 1 --stages overhead --tables-from $H $X"
  timeout 130 python3 $P ops $A $O --out $R/o$k --then ops $B $O --out $R/o$k --then ops $C $O --out $R/o$k > $R/o$k.log 2>&1; st "process $k" $?
done
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader > $R/smi_end.txt 2>&1
grep -h "wrote" $R/o*.log; cat $R/progress
cd /tmp/ho && tar czf $OUT/h100_overheads.tar.gz m; ls -la $OUT; echo "total $(( $(date +%s)-T0 ))s"
