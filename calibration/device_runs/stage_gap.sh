# Device diagnostic of 2026-12-06 (ninth session): why does the `ops` overhead stage's 1-sequence
# CUDA-graph decode forward run 15-20 % slower than the `iterations` (validation) stage's forwards of
# the same kind? On the H100 (call 35) three fresh processes gave 7.14-7.54 ms for
# llama-3.1-8b-fp8's 1 x 1,024 overhead forward, the validation stage 6.03 / 6.20 ms at contexts
# 100 / 2,048 (calibration/VALIDATION.md, "Call 35"); the packs reproduce the first, so they
# over-predict batch-1 decodes (the two H200 FP8 files' 15.5 / 18.5 % max).
# One process, the stages interleaved with --then so that neither the process nor the GPU's state
# differs between them: overhead (batches 1, 8) -> iterations of validation compositions 0 and 40
# (1 x 17 prefill, 1 x 100 decode) -> of 0 and 41 (1 x 2,048 decode) -> overhead -> the same
# iterations -> overhead, for the fp8 pack and then its bf16 twin. (Call 36 ran the first three
# compositions instead, all prefills: the overhead forward alone moved 6.42 -> 7.07 ms.) If the two stages still disagree side by side, the cause is in their code
# paths (mode_ops.overhead_rows against mode_iterations.cmd_iterations); if they agree, it is the
# order within a call. Results: $OUT/stage_gap.tar.gz (logs with every forward's time, the written
# rows). Ends inside 4 minutes.
#   bash calibration/device_runs/stage_gap.sh          (CPU dry run: DRY=1 bash ...)
export PYTHONUNBUFFERED=1; set -o pipefail
P=calibration/profile_gpu.py; R=/tmp/sg/m; rm -rf /tmp/sg; mkdir -p $R; T0=$(date +%s)
OUT=${OUT:-/tmp/sg/out}; mkdir -p $OUT
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')" > $R/env.txt 2>&1; cat $R/env.txt
if grep -q H200 $R/env.txt; then G=h200; else G=h100-80g; fi
H=calibration/packs/$G; M=llama-3.1-8b; X=; TO=100; CB="1,8"
if [ "${DRY:-0}" = 1 ]; then
  X="--device cpu --quick"; H=$R/t/packs/cpu; M=tiny; CB="1"
  timeout 90 python3 $P ops --model tiny --stages "attn_decode,attn_prefill,token ops" $X --out $R/t > $R/t.log 2>&1
  cp $H/tiny.csv $H/tiny-fp8.csv; cp $H/tiny.yaml $H/tiny-fp8.yaml  # a stand-in fp8 pack: only its tables are read
fi
st() { echo "$1 rc=$2 t=$(( $(date +%s)-T0 ))s" | tee -a $R/progress; }
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader > $R/smi_start.txt 2>&1
for W in fp8 bf16; do
  O="ops --model $M --tp 1 --stages overhead --calib-batches $CB --tables-from $H --weights $W $X"
  I="iterations --model $M --weights $W --backends-from $H --max-compositions 2 --eager-every 1000 $X"
  timeout $TO python3 $P $O --out $R/$W/o1 --then $I --every 40 --out $R/$W/i1 --then $I --every 41 --out $R/$W/j1 \
    --then $O --out $R/$W/o2 --then $I --every 40 --out $R/$W/i2 --then $I --every 41 --out $R/$W/j2 \
    --then $O --out $R/$W/o3 > $R/$W.log 2>&1; st "$W" $?
done
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader > $R/smi_end.txt 2>&1
grep -hE "overhead_cuda_graph batch=|\[[0-9]/2\]" $R/fp8.log $R/bf16.log; cat $R/progress
cd /tmp/sg && tar czf $OUT/stage_gap.tar.gz m; ls -la $OUT; echo "total $(( $(date +%s)-T0 ))s"
