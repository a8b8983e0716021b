# Device run (seventh session of 2026-12-05, kind nvidia-h100-x1): the long-context grid on the H100
# for the three H100 packs that real long-prompt runs use (llama-3.1-8b, qwen3-14b, qwen3-8b).
# Why: the H100 packs were measured on the dense grid only (token ops to 16K tokens, prefill chunks
# to 8K, prefill contexts to 24K), so 16-32K prompts on an H100 extrapolate past the grid (the
# report's "beyond grid" share), while the H200 packs of llama-3.1-8b / qwen3-8b carry the long grid
# (calibration/COMMANDS.md call 9). This is the same stage, `--grid long` (token ops to 64K, chunks
# to 32K, contexts to 128K, decode contexts to 128K with batches cut by memory), appended to the
# dense packs with `combine --add-from` (calibration/device_runs/h100_long_integrate.sh).
# One process, shared measurements: llama-3.1-8b and qwen3-8b have the same attention shapes.
# Deadline inside the call's 9 minutes (the profiler writes what it has). Results:
# $OUT/h100_long.tar.gz (m/ with the d folder, logs).
#   bash calibration/device_runs/h100_long.sh          (CPU dry run: DRY=1 bash ...)
export PYTHONUNBUFFERED=1; set -o pipefail
P=calibration/profile_gpu.py; R=/tmp/hl/m; rm -rf /tmp/hl; mkdir -p $R; T0=$(date +%s)
OUT=${OUT:-/tmp/hl/out}; mkdir -p $OUT
M=${MODELS:-llama-3.1-8b,qwen3-14b,qwen3-8b}; X=; SD=${SD:-480}
if [ "${DRY:-0}" = 1 ]; then M=tiny; X="--device cpu --quick"; SD=90; fi
left() { echo $(( $1 - ($(date +%s) - T0) )); }
st() { echo "$1 rc=$2 t=$(( $(date +%s)-T0 ))s" | tee -a $R/progress; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader > $R/smi_start.txt 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')" > $R/env.txt 2>&1; cat $R/env.txt
timeout $(left $((SD+25))) python3 $P ops --model $M --grid long --stages "token ops,attn_decode,attn_prefill" --prefill-max-rep 5 --deadline-epoch $((T0+SD)) --soft-deadline-epoch $((T0+SD-40)) $X --out $R/d > $R/d.log 2>&1; st D $?
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader > $R/smi_end.txt 2>&1
{ echo "== progress"; cat $R/progress; echo "== problems"; grep -hE "SKIP|DROP|Error|FAIL|Traceback|budget ran out|failed" $R/*.log | head -20
  echo "== written"; grep -h "wrote" $R/*.log; } > $R/summary.txt 2>&1
cat $R/summary.txt
cd /tmp/hl && tar czf $OUT/h100_long.tar.gz m; ls -la $OUT; echo "total $(( $(date +%s)-T0 ))s"
