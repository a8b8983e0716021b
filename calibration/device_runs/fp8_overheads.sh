# Device run of 2026-12-06 (eighth session): the dynamic-FP8 packs' overhead forwards in two more
# processes, so that their CUDA-graph and eager overheads are the median of 3 processes, as in the
# H200's bf16 packs and the H100's packs of call 16. Why: fp8_static.sh (WEIGHTS=fp8, calls 30-34)
# measured the overhead forwards once, in its ops process, and that process's 1 x 1,024 decode
# forward ran 7-19 % slower than the same kind of forward in the validation process a minute later
# (calibration/VALIDATION.md, "FP8 on the H100 and the H200"); the pack reproduces the first.
# The GPU that comes decides the packs: H200 llama-3.1-8b-fp8, qwen3-8b-fp8, qwen3-14b-fp8; H100
# those and llama-3-8b-fp8. Each process chains them with --then (torch starts once), against the
# shipped tables (--tables-from calibration/packs/<gpu>). Results: $OUT/fp8_overheads.tar.gz
# (m/o2, m/o3, env.txt, logs). Ends inside 5 minutes.
#   bash calibration/device_runs/fp8_overheads.sh          (CPU dry run: DRY=1 bash ...)
export PYTHONUNBUFFERED=1; set -o pipefail
P=calibration/profile_gpu.py; R=/tmp/fo/m; rm -rf /tmp/fo; mkdir -p $R; T0=$(date +%s)
OUT=${OUT:-/tmp/fo/out}; mkdir -p $OUT
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')" > $R/env.txt 2>&1; cat $R/env.txt
if grep -q H200 $R/env.txt; then G=h200; M="llama-3.1-8b qwen3-8b qwen3-14b"; else G=h100-80g; M="llama-3-8b llama-3.1-8b qwen3-8b qwen3-14b"; fi
H=calibration/packs/$G; X=; W="--weights fp8"; TO=140
if [ "${DRY:-0}" = 1 ]; then
  X="--device cpu --quick"; H=$R/t/packs/cpu; M="tiny"; TO=200
  # the tiny model has no shipped fp8 pack: its attention tables, then its fp8 token ops (as fp8_static.sh)
  timeout 60 python3 $P ops --model tiny --stages "attn_decode,attn_prefill" $X --out $R/bf > $R/bf.log 2>&1
  timeout 150 python3 $P ops --model tiny --weights fp8 --attention-from $R/bf/packs/cpu --stages "token ops" --deadline-epoch $((T0+160)) $X --out $R/t > $R/t.log 2>&1
fi
st() { echo "$1 rc=$2 t=$(( $(date +%s)-T0 ))s" | tee -a $R/progress; }
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader > $R/smi_start.txt 2>&1
for k in 2 3; do
  O="--tp 1 --stages overhead --tables-from $H $W $X"; CMD=""
  for m in $M; do CMD="$CMD${CMD:+ --then} ops --model $m $O --out $R/o$k"; done
  timeout $TO python3 $P $CMD > $R/o$k.log 2>&1; st "process $k" $?
done
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader > $R/smi_end.txt 2>&1
grep -h "wrote" $R/o*.log; cat $R/progress
cd /tmp/fo && tar czf $OUT/fp8_overheads.tar.gz m; ls -la $OUT; echo "total $(( $(date +%s)-T0 ))s"
