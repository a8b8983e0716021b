# Device call 1 of the 2026-12-05 run: start precision_moe.sh detached, wait up to ~540 s, bring back what exists.
S=$(date +%s); mkdir -p /tmp/m; setsid nohup bash calibration/device_runs/precision_moe.sh > /tmp/m/main.out 2>&1 < /dev/null &
while [ ! -f /tmp/m/DONE ] && [ $(( $(date +%s)-S )) -lt 540 ]; do sleep 5; done
cat /tmp/m/env.txt /tmp/m/progress; for f in /tmp/m/*.log; do echo "== $f"; grep -E "wrote|SKIP|DROP|rror|FAIL|accuracy|budget|Traceback" $f | tail -12; done
cd /tmp && tar czf $OUT/part.tar.gz --exclude='m/*.log' m; tar czf $OUT/logs1.tar.gz m/*.log; ls -la $OUT; echo call $(( $(date +%s)-S ))s
