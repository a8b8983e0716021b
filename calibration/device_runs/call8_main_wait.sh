# Device call 3: wait for main.sh to finish (same machine, same run), bring everything back.
S=$(date +%s)
while [ ! -f /tmp/m/DONE ] && [ $(( $(date +%s)-S )) -lt 570 ]; do sleep 5; done
cat /tmp/m/progress /tmp/m/smi_start.txt /tmp/m/smi_end.txt 2>/dev/null
grep -E "wrote|budget|SKIP|DROP|rror|chained" /tmp/m/b.log /tmp/m/c.log 2>/dev/null | tail -30
cd /tmp && tar czf $OUT/final.tar.gz --exclude='m/*.log' m; for f in a b c; do [ -f m/$f.log ] && gzip -c m/$f.log > $OUT/$f.log.gz; done; ls -la $OUT; echo call $(( $(date +%s)-S ))s
