# Device call 1 (smoke): backends on CUDA, a full-size survey, the pipeline on a real shape.
export PYTHONUNBUFFERED=1; set -o pipefail; T0=$(date +%s); D=.device_carry; P=$D/profile_gpu.py
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.limit --format=csv,noheader
python3 -c "import torch;print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())"
mkdir -p /tmp/s
echo "== 1. full-size survey, qwen3-14b TP1 (40/8 heads)"
timeout 170 python3 $P backends --model qwen3-14b --out /tmp/s 2>&1 | tee $OUT/backends.log | grep -E "survey [a-z_]+:|wrote|SDPA|passing|rror"
echo "t=$(( $(date +%s)-T0 ))s"
echo "== 2. quick pipeline llama-3-8b: ops (all stages) -> iterations with the tables' choice"
timeout 200 python3 $P ops --model llama-3-8b --tp 1 --quick --out /tmp/s/q --then iterations --model llama-3-8b --quick --backends-from /tmp/s/q/packs/h200 --out /tmp/s/q 2>&1 | tee $OUT/quick.log | grep -E "stage |survey [a-z_]+:|wrote|SKIP|DROP|rror|peaks|iterations:|/4\]|SDPA|capture"
echo "t=$(( $(date +%s)-T0 ))s"
echo "== 3. mixed backends in one captured forward (decode cudnn, prefill flash/cudnn), 9 full compositions"
timeout 120 python3 $P iterations --model llama-3-8b --every 10 --backends-from $D/mixed --out /tmp/s/m 2>&1 | tee $OUT/mixed.log | grep -E "iterations:|/[0-9]+\]|SKIP|rror|wrote"
echo "t=$(( $(date +%s)-T0 ))s"
tar czf $OUT/smoke.tar.gz -C /tmp s; ls -la $OUT; echo total $(( $(date +%s)-T0 ))s
