# Device call 1 (nvidia-h200-x2): start tp2_main.sh detached, wait up to ~540 s, bring back what exists.
S=$(date +%s); mkdir -p /tmp/t; python3 -c "import torch; print(torch.__version__, torch.cuda.device_count())"
setsid nohup bash .device_carry/tp2_main.sh > /tmp/t/main.out 2>&1 < /dev/null &
while [ ! -f /tmp/t/DONE ] && [ $(( $(date +%s)-S )) -lt 540 ]; do sleep 5; done
cat /tmp/t/progress /tmp/t/smi_start.txt; grep -hE "wrote|budget|SKIP|DROP|rror|peaks|all_reduce n=2 bytes=(2048|1048576|16777216):" /tmp/t/*.log | tail -40
cd /tmp && tar czf $OUT/part.tar.gz --exclude='t/*.log' t; tar czf $OUT/logs.tar.gz t/*.log t/main.out; ls -la $OUT; echo call $(( $(date +%s)-S ))s
