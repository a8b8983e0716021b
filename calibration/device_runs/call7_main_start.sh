# Device call 2: start main.sh detached, wait up to ~560 s, bring back what exists so far.
S=$(date +%s); mkdir -p /tmp/m; setsid nohup bash .device_carry/main.sh > /tmp/m/main.out 2>&1 < /dev/null &
while [ ! -f /tmp/m/DONE ] && [ $(( $(date +%s)-S )) -lt 560 ]; do sleep 5; done
cat /tmp/m/progress; grep -E "wrote|survey [a-z_]+:|budget|SKIP|DROP|rror|peaks|ops: " /tmp/m/a.log | tail -40
cd /tmp && tar czf $OUT/part.tar.gz --exclude='m/*.log' m; gzip -c m/a.log > $OUT/a.log.gz; ls -la $OUT; echo call $(( $(date +%s)-S ))s
