# Device run of 2026-12-05 (issue #29): the fused MoE Triton kernel (calibration/profiler/triton_moe.py)
# against torch._grouped_mm, on one H200 (or H100), in one call that ends inside 9 minutes:
#   A  survey --which moe: both backends on the 5 surveyed layer shapes (qwen3-30b-a3b and
#      deepseek-v2-lite first), tokens 1..8192; the fused kernel's tiles tuned on the device
#   B  qwen3-30b-a3b pack: token ops + overhead on the fused backend, attention rows from the
#      first MoE run (device_runs/moe_first, as moe_rerun.sh); on any GPU but an H200 those rows
#      are another GPU's, so there B measures attention too (the first run's whole grid took 141 s)
#   C  its validation forwards (CUDA graph: all compositions; eager: every 3rd)
# Every stage has a deadline (the profiler stops measuring and writes what it has) and a kill
# timeout behind it. Results: $OUT/moe_fused.tar.gz (m/ with a, c, v folders, logs, summary.txt).
#   bash calibration/device_runs/moe_fused.sh
export PYTHONUNBUFFERED=1; set -o pipefail
P=calibration/profile_gpu.py; R=/tmp/mf/m; mkdir -p $R; T0=$(date +%s)
OUT=${OUT:-/tmp/mf/out}; mkdir -p $OUT
left() { echo $(( $1 - ($(date +%s) - T0) )); }
st() { echo "$1 rc=$2 t=$(( $(date +%s)-T0 ))s" | tee -a $R/progress; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader > $R/smi_start.txt 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(0))" > $R/env.txt 2>&1; cat $R/env.txt
# attention rows from the first MoE run only on its GPU model (H200); elsewhere B measures them
H200=0; grep -q "H200" $R/env.txt && H200=1; SA=$(( H200 ? 200 : 165 ))
# A: the survey (deadline 200 s on an H200, 165 s elsewhere; killed 25 s later)
timeout $(left $((SA+25))) python3 $P survey --which moe --deadline-epoch $((T0+SA)) --soft-deadline-epoch $((T0+SA-15)) --out $R/a > $R/a.log 2>&1; st A $?
# B: the pack on the fused backend (deadline 340 s)
if [ $H200 = 1 ]; then
  timeout $(left 355) python3 $P ops --model qwen3-30b-a3b --moe-backend triton-fused --attention-from calibration/device_runs/moe_first --stages "token ops,overhead" --deadline-epoch $((T0+340)) --soft-deadline-epoch $((T0+325)) --out $R/c > $R/c.log 2>&1; st B $?
else
  timeout $(left 355) python3 $P ops --model qwen3-30b-a3b --moe-backend triton-fused --prefill-max-rep 5 --deadline-epoch $((T0+340)) --soft-deadline-epoch $((T0+325)) --out $R/c > $R/c.log 2>&1; st B $?
fi
# C: validation forwards, SDPA choice from B's pack (deadline 480 s)
Y=$(ls $R/c/packs/*/qwen3-30b-a3b.yaml 2>/dev/null | head -1)  # packs/h200 (or the H100's folder)
[ -n "$Y" ] && [ $(left 480) -gt 60 ] && timeout $(left 495) python3 $P iterations --model qwen3-30b-a3b --moe-backend triton-fused --backends-from $(dirname $Y) --fwd-max-rep 8 --fwd-budget-ms 250 --eager-every 3 --deadline-epoch $((T0+480)) --out $R/v > $R/v.log 2>&1; st C $?
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader > $R/smi_end.txt 2>&1
{ echo "== progress"; cat $R/progress
  echo "== experts' achieved bandwidth on the hit experts' weights, 1-64 tokens (fused vs grouped)"
  grep -E "moe [a-z0-9.-]+ T=(1|2|4|8|16|32|64) \(" $R/a.log | sed -e 's/^[0-9:]* *//'
  echo "== problems"; grep -hE "SKIP|DROP|Error|FAIL|Traceback|budget ran out|failed" $R/*.log | head -20
  echo "== written"; grep -h "wrote" $R/*.log; } > $R/summary.txt 2>&1
cat $R/summary.txt
cd /tmp/mf && tar czf $OUT/moe_fused.tar.gz m; ls -la $OUT; echo "total $(( $(date +%s)-T0 ))s"
