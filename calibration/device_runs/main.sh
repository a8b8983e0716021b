# The main H200 run (device calls 2 and 3): every op of the 8 packs and the whole-iteration
# validation forwards, on one machine, in three processes started one after another:
#   A  ops: token ops, decode + prefill attention (every SDPA backend that passes the float64
#      check considered, the fastest kept), overhead forwards, device peaks -- 8 packs, one process
#   B  the overhead forwards again (same tables) -> validation forwards of the 4 models (TP1),
#      each attention call on the backend the tables chose
#   C  the overhead forwards a third time (median of 3 processes per overhead row)
# Started detached (setsid) by main_start.sh; main_wait.sh collects. Deadlines keep it < 1150 s.
export PYTHONUNBUFFERED=1; set -o pipefail
D=.device_carry; P=$D/profile_gpu.py; M=qwen3-14b,qwen3-8b,llama-3-8b,qwen3-4b; R=/tmp/m
T0=$(date +%s); echo "T0 $T0" > $R/progress
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader > $R/smi_start.txt
python3 $P ops --model $M --tp 1,2 --grid dense --prefill-max-rep 5 --deadline-epoch $((T0+640)) --soft-deadline-epoch $((T0+560)) --out $R/a > $R/a.log 2>&1
echo "A rc=$? t=$(( $(date +%s)-T0 ))s" >> $R/progress
TB=$R/a/packs/h200; IT="--backends-from $TB --fwd-max-rep 10 --fwd-budget-ms 300 --deadline-epoch $((T0+1040)) --out $R/v"
python3 $P ops --model $M --tp 1,2 --stages overhead --tables-from $TB --out $R/b --then iterations --model qwen3-14b $IT --then iterations --model qwen3-8b $IT --then iterations --model llama-3-8b $IT --then iterations --model qwen3-4b $IT > $R/b.log 2>&1
echo "B rc=$? t=$(( $(date +%s)-T0 ))s" >> $R/progress
if [ $(date +%s) -lt $((T0+1075)) ]; then
  python3 $P ops --model $M --tp 1,2 --stages overhead --tables-from $TB --deadline-epoch $((T0+1125)) --out $R/c > $R/c.log 2>&1
  echo "C rc=$? t=$(( $(date +%s)-T0 ))s" >> $R/progress
fi
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader > $R/smi_end.txt
touch $R/DONE
