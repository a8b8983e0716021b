# Device call 2 of the 2026-12-05 run: wait for precision_moe.sh to finish (same machine), bring everything back.
S=$(date +%s)
while [ ! -f /tmp/m/DONE ] && [ $(( $(date +%s)-S )) -lt 570 ]; do sleep 5; done
cat /tmp/m/progress /tmp/m/smi_start.txt /tmp/m/smi_end.txt 2>/dev/null; for f in /tmp/m/*.log; do echo "== $f"; grep -E "wrote|SKIP|DROP|rror|FAIL|accuracy|budget|Traceback" $f | tail -10; done
cd /tmp && tar czf $OUT/final.tar.gz --exclude='m/*.log' m; tar czf $OUT/logs2.tar.gz m/*.log; ls -la $OUT; echo call $(( $(date +%s)-S ))s
