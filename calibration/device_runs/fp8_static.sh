# Device run of 2026-12-05 (fourth session): FP8 packs with STATIC activation scales (`--weights
# fp8_static`, calibration/profiler/variants.py) for llama-3-8b and llama-3.1-8b on one H200, and
# validation forwards of llama-3-8b in that recipe.
# Why: TensorRT-LLM's published FP8 numbers (benchmarks/RESULTS.md, source trtllm-v10-fp8) run
# ModelOpt checkpoints whose activation scales are static, the quantization fused into the norm /
# activation kernel before each linear; the H200 fp8 pack times vLLM's dynamic recipe (an amax
# reduction and casts inside every linear), which prices small-batch FP8 linears at or above bf16.
# fp8_static times the scaled GEMM alone on a pre-quantized input (pack stem <model>-fp8_static).
#   A  ops: token ops + overhead forwards, llama-3-8b then llama-3.1-8b (same layer shapes: the
#      second model's token ops reuse the first's measurements; its overhead forwards are its own);
#      attention rows and SDPA choice copied from the measured bf16 packs (calibration/packs/h200)
#   B  validation forwards of llama-3-8b fp8_static (CUDA graph: all compositions; eager: every
#      3rd), SDPA choice from A's pack; the compositions of the bf16 and fp8 validation files
# Every stage has a deadline (the profiler writes what it has) and a kill timeout behind it; the
# call ends inside 8 minutes. Results: $OUT/fp8_static.tar.gz (m/ with a and v folders, logs).
#   bash calibration/device_runs/fp8_static.sh          (CPU dry run: DRY=1 bash ...)
export PYTHONUNBUFFERED=1; set -o pipefail
P=calibration/profile_gpu.py; R=/tmp/f8s/m; rm -rf /tmp/f8s; mkdir -p $R; T0=$(date +%s)
OUT=${OUT:-/tmp/f8s/out}; mkdir -p $OUT
# Overrides (seventh session; MV, the validation model, eighth): WEIGHTS=fp8 AF=calibration/packs/h100-80g measures
# vLLM's dynamic recipe on an H100 (the check of the H100's derived FP8 pack, calibration/COMMANDS.md
# call 28); the defaults are this script's first run.
W=${WEIGHTS:-fp8_static}; M=${MODELS:-llama-3-8b,llama-3.1-8b}; MV=${MV:-llama-3-8b}; AF=${AF:-calibration/packs/h200}; X=; SA=290; SB=445
if [ "${DRY:-0}" = 1 ]; then
  # the tiny model has no measured bf16 pack: measure one first (attention rows to copy)
  M=tiny; MV=tiny; AF=$R/bf/packs/cpu; X="--device cpu --quick"; SA=80; SB=130
  timeout 60 python3 $P ops --model tiny --stages "attn_decode,attn_prefill" $X --out $R/bf > $R/bf.log 2>&1
  echo "bf16 attention pack rc=$? t=$(( $(date +%s)-T0 ))s" | tee -a $R/progress
fi
left() { echo $(( $1 - ($(date +%s) - T0) )); }
st() { echo "$1 rc=$2 t=$(( $(date +%s)-T0 ))s" | tee -a $R/progress; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader > $R/smi_start.txt 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')" > $R/env.txt 2>&1; cat $R/env.txt
timeout $(left $((SA+25))) python3 $P ops --model $M --weights $W --attention-from $AF --stages "token ops,overhead" --deadline-epoch $((T0+SA)) --soft-deadline-epoch $((T0+SA-30)) $X --out $R/a > $R/a.log 2>&1; st A $?
Y=$(ls $R/a/packs/*/$MV-$W.yaml 2>/dev/null | head -1)
[ -n "$Y" ] && [ $(left $SB) -gt 40 ] && timeout $(left $((SB+15))) python3 $P iterations --model $MV --weights $W --backends-from $(dirname $Y) --fwd-max-rep 8 --fwd-budget-ms 250 --eager-every 3 --deadline-epoch $((T0+SB)) $X --out $R/v > $R/v.log 2>&1; st B $?
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader > $R/smi_end.txt 2>&1
{ echo "== progress"; cat $R/progress; echo "== problems"; grep -hE "SKIP|DROP|Error|FAIL|Traceback|budget ran out|failed" $R/*.log | head -20
  echo "== written"; grep -h "wrote" $R/*.log; } > $R/summary.txt 2>&1
cat $R/summary.txt
cd /tmp/f8s && tar czf $OUT/fp8_static.tar.gz m; ls -la $OUT; echo "total $(( $(date +%s)-T0 ))s"
