# TP2 on two GPUs of one host (kind nvidia-h200-x2): the four TP2 packs and their whole-iteration
# validation forwards measured in one run on one machine, as main.sh did for TP1 (issue 16).
#   1  collectives: NCCL all_reduce / send_recv over the two GPUs, captured in CUDA graphs
#   2  op tables of the TP2 packs (per-rank slices, dense grid, per-op SDPA backend selection),
#      one process per GPU in parallel: qwen3-14b-tp2 (20/4 heads) on GPU 0; qwen3-8b-tp2,
#      llama-3-8b-tp2, qwen3-4b-tp2 (16/4 heads: one attention measurement) on GPU 1
#   3  collectives merged into those packs (no GPU)
#   4  `iterations --tp 2` per model: one process per GPU, NCCL all-reduces after o_proj and
#      down_proj, eager and CUDA graph (collectives captured too), each attention call on the
#      backend its pack chose in step 2 (--backends-from that process's output)
#   5  overhead forwards twice more per pack (same tables; median of 3 processes, as for TP1)
# Started detached (setsid) by tp2_start.sh; tp2_wait.sh collects. Deadlines keep it < ~800 s.
# CPU logic test: D=calibration X="--device cpu --quick" G=cpu M0=tiny M1=tiny R=/tmp/t bash tp2_main.sh
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=${D:-.device_carry}; P=$D/profile_gpu.py; R=${R:-/tmp/t}; X=${X:-}; G=${G:-h200}
M0=${M0:-qwen3-14b}; M1=${M1:-qwen3-8b,llama-3-8b,qwen3-4b}
mkdir -p $R; T0=$(date +%s); echo "T0 $T0" > $R/progress
step() { echo "$1 rc=$2 t=$(( $(date +%s)-T0 ))s" >> $R/progress; }
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader > $R/smi_start.txt 2>&1
nvidia-smi topo -m >> $R/smi_start.txt 2>&1
python3 $P allreduce --gpus 2 --time-budget-s 90 $X --out $R/coll > $R/coll.log 2>&1; step coll $?
OPS="--tp 2 --grid dense --prefill-max-rep 5 --deadline-epoch $((T0+330)) --soft-deadline-epoch $((T0+290)) $X"
CUDA_VISIBLE_DEVICES=0 python3 $P ops --model $M0 $OPS --out $R/a0 > $R/a0.log 2>&1 &
CUDA_VISIBLE_DEVICES=1 python3 $P ops --model $M1 $OPS --out $R/a1 > $R/a1.log 2>&1 &
wait %1; r0=$?; wait %2; step "ops gpu0 rc=$r0 gpu1" $?
for a in a0 a1; do mkdir -p $R/$a/collectives && cp -r $R/coll/collectives/. $R/$a/collectives/ && python3 $P merge --out $R/$a >> $R/merge.log 2>&1; done; step merge $?
# per-model deadlines, so a slow model cannot starve the others (s after T0)
DL=(440 540 630 720); i=0
for m in ${M0//,/ } ${M1//,/ }; do
  case ",$M0," in *",$m,"*) A=a0 ;; *) A=a1 ;; esac
  python3 $P iterations --model $m --tp 2 --backends-from $R/$A/packs --fwd-max-rep 5 --eager-every 2 --deadline-epoch $((T0+${DL[$i]:-720})) $X --out $R/v >> $R/v.log 2>&1; step "iterations $m" $?
  i=$((i+1))
done
for k in b c; do
  [ $(date +%s) -lt $((T0+760)) ] || break
  CUDA_VISIBLE_DEVICES=0 python3 $P ops --model $M0 --tp 2 --stages overhead --tables-from $R/a0/packs/$G --deadline-epoch $((T0+820)) $X --out $R/${k}0 > $R/${k}0.log 2>&1 &
  CUDA_VISIBLE_DEVICES=1 python3 $P ops --model $M1 --tp 2 --stages overhead --tables-from $R/a1/packs/$G --deadline-epoch $((T0+820)) $X --out $R/${k}1 > $R/${k}1.log 2>&1 &
  wait %1; r0=$?; wait %2; step "overheads $k gpu0 rc=$r0 gpu1" $?
done
nvidia-smi --query-gpu=index,clocks.sm,temperature.gpu,power.draw --format=csv,noheader > $R/smi_end.txt 2>&1
touch $R/DONE
