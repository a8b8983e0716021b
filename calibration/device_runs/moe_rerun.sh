# Device call of 2026-12-05 (issue #34), after the first run: the MoE pack and its forwards again,
# with routing uniform at random per token in both (route_bias, calibration/profiler/ops.py): in the first run the
# validation prefills of one prompt routed its tokens to a few experts (the attention of random
# weights makes a prompt's hidden states nearly equal), 2x faster than the op table's uniform routing.
# Attention rows (routing-independent) come from the first run's pack (moe_first/, measured on
# another H200 an hour earlier). Then the long grid's prefill rows with each chunk's longest context (B3 on H200 extrapolated 0.1 %).
export PYTHONUNBUFFERED=1; set -o pipefail
P=calibration/profile_gpu.py; R=/tmp/m; mkdir -p $R; T0=$(date +%s)
python3 $P ops --model qwen3-30b-a3b --attention-from calibration/device_runs/moe_first --stages "token ops,overhead" --deadline-epoch $((T0+75)) --soft-deadline-epoch $((T0+60)) --out $R/c > $R/c.log 2>&1; echo "C rc=$? t=$(( $(date +%s)-T0 ))s"
python3 $P iterations --model qwen3-30b-a3b --backends-from $R/c/packs/h200 --fwd-max-rep 8 --fwd-budget-ms 250 --eager-every 3 --deadline-epoch $((T0+175)) --out $R/v > $R/f2.log 2>&1; echo "F2 rc=$? t=$(( $(date +%s)-T0 ))s"
# the long grid's prefill rows again, now with each chunk's longest context (max_model_len - chunk)
[ $(( $(date +%s)-T0 )) -lt 120 ] && python3 $P ops --model qwen3-8b --grid long --stages attn_prefill --prefill-max-rep 5 --deadline-epoch $((T0+185)) --soft-deadline-epoch $((T0+180)) --out $R/d2 > $R/d2.log 2>&1; echo "D2 rc=$? t=$(( $(date +%s)-T0 ))s"
grep -E "wrote|SKIP|DROP|rror" $R/c.log $R/f2.log $R/d2.log | tail -14
cd /tmp && tar czf $OUT/moe.tar.gz m; ls -la $OUT
