# Device run of 2026-12-05 (issue #34): FP8 and MoE packs with their validation forwards, the
# long-context extension rows, and the op surveys, on one H200, one stage after another:
#   B  llama-3-8b --weights fp8: token ops + overhead (attention rows reused from the bf16 pack)
#   C  qwen3-30b-a3b (MoE, bf16): every op of the dense grid + overhead
#   F1 validation forwards of llama-3-8b fp8 (SDPA choice from B's pack)
#   F2 validation forwards of qwen3-30b-a3b (SDPA choice from C's pack)
#   D  --grid long for qwen3-8b and llama-3.1-8b (token ops to 64K, prefill to 32K chunks / 128K
#      context, decode to 128K context), no overhead
#   E  surveys: GEMM formats, MoE configs, fp8-KV decode attention, MLA decode
# Started detached (setsid) by precision_moe_start.sh; precision_moe_wait.sh collects.
export PYTHONUNBUFFERED=1; set -o pipefail
P=calibration/profile_gpu.py; R=/tmp/m; H=calibration/packs/h200
T0=$(date +%s); echo "T0 $T0" > $R/progress
st() { echo "$1 rc=$2 t=$(( $(date +%s)-T0 ))s" >> $R/progress; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader > $R/smi_start.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(0), hasattr(torch, '_grouped_mm'))" > $R/env.txt 2>&1
python3 $P ops --model llama-3-8b --weights fp8 --attention-from $H --stages "token ops,overhead" --deadline-epoch $((T0+190)) --soft-deadline-epoch $((T0+160)) --out $R/b > $R/b.log 2>&1; st B $?
python3 $P ops --model qwen3-30b-a3b --deadline-epoch $((T0+560)) --soft-deadline-epoch $((T0+480)) --prefill-max-rep 5 --out $R/c > $R/c.log 2>&1; st C $?
IT="--fwd-max-rep 8 --fwd-budget-ms 250 --eager-every 3"
python3 $P iterations --model llama-3-8b --weights fp8 --backends-from $R/b/packs/h200 $IT --deadline-epoch $((T0+690)) --out $R/v > $R/f1.log 2>&1; st F1 $?
python3 $P iterations --model qwen3-30b-a3b --backends-from $R/c/packs/h200 $IT --deadline-epoch $((T0+830)) --out $R/v > $R/f2.log 2>&1; st F2 $?
python3 $P ops --model qwen3-8b,llama-3.1-8b --grid long --stages "token ops,attn_decode,attn_prefill" --prefill-max-rep 5 --deadline-epoch $((T0+960)) --soft-deadline-epoch $((T0+930)) --out $R/d > $R/d.log 2>&1; st D $?
python3 $P survey --deadline-epoch $((T0+1080)) --soft-deadline-epoch $((T0+1050)) --out $R/e > $R/e.log 2>&1; st E $?
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader > $R/smi_end.txt
touch $R/DONE
