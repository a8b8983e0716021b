# Device run of 2026-12-05 (fourth session): a measured H100 pack for llama-3-8b (bf16, TP1) and
# whole-iteration validation forwards the fit never reads, on one H100 SXM (kind nvidia-h100-x1).
# Why: every H100 run so far used the H200 pack transferred by op-wise efficiency; that rule's error
# was measured only across generations (A100 <-> H200). This run gives the within-class error (the
# transfer users get) and a calibrated H100 default for the most common deployment.
#   A  ops: token ops, decode + prefill attention (SDPA backends that pass the float64 check, the
#      fastest kept), overhead forwards, device peaks (dense grid, as the H200 main run)
#   B  validation forwards (CUDA graph: all compositions; eager: every 2nd), SDPA choice from A
# Every stage has a deadline (the profiler writes what it has) and a kill timeout behind it; the
# call ends inside 9 minutes. Results: $OUT/h100_llama.tar.gz (m/ with a and v folders, logs).
# A second use (same session): MODEL=qwen3-30b-a3b XF="--moe-backend triton-fused" bash ... measures
# the fused-MoE pack on the H100 (the published Qwen3-30B-A3B row ran on an H100; its H200 pack
# reaches it only by transfer), to separate the transfer's error from the profiler's unfused ops.
#   bash calibration/device_runs/h100_llama.sh          (CPU dry run: DRY=1 bash ...)
export PYTHONUNBUFFERED=1; set -o pipefail
P=calibration/profile_gpu.py; R=/tmp/h1/m; rm -rf /tmp/h1; mkdir -p $R; T0=$(date +%s)
OUT=${OUT:-/tmp/h1/out}; mkdir -p $OUT
M=${MODEL:-llama-3-8b}; X=${XF:-}; SA=${SA:-330}; SB=520
if [ "${DRY:-0}" = 1 ]; then M=${MODEL:-tiny}; X="${XF:-} --device cpu --quick"; SA=60; SB=110; fi
left() { echo $(( $1 - ($(date +%s) - T0) )); }
st() { echo "$1 rc=$2 t=$(( $(date +%s)-T0 ))s" | tee -a $R/progress; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader > $R/smi_start.txt 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')" > $R/env.txt 2>&1; cat $R/env.txt
timeout $(left $((SA+25))) python3 $P ops --model $M --tp 1 --grid dense --prefill-max-rep 5 --deadline-epoch $((T0+SA)) --soft-deadline-epoch $((T0+SA-30)) $X --out $R/a > $R/a.log 2>&1; st A $?
Y=$(ls $R/a/packs/*/$M.yaml 2>/dev/null | head -1)
[ -n "$Y" ] && [ $(left $SB) -gt 40 ] && timeout $(left $((SB+20))) python3 $P iterations --model $M --backends-from $(dirname $Y) --fwd-max-rep 8 --fwd-budget-ms 250 --eager-every 2 --deadline-epoch $((T0+SB)) $X --out $R/v > $R/v.log 2>&1; st B $?
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader > $R/smi_end.txt 2>&1
{ echo "== progress"; cat $R/progress; echo "== problems"; grep -hE "SKIP|DROP|Error|FAIL|Traceback|budget ran out|failed" $R/*.log | head -20
  echo "== written"; grep -h "wrote" $R/*.log; } > $R/summary.txt 2>&1
cat $R/summary.txt
cd /tmp/h1 && tar czf $OUT/h100_llama.tar.gz m; ls -la $OUT; echo "total $(( $(date +%s)-T0 ))s"
