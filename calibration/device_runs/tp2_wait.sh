# Device call 2 (same machine, still warm): wait for tp2_main.sh's DONE, bring everything back.
S=$(date +%s)
while [ ! -f /tmp/t/DONE ] && [ $(( $(date +%s)-S )) -lt 560 ]; do sleep 5; done
cat /tmp/t/progress /tmp/t/smi_end.txt 2>/dev/null; grep -hE "wrote|budget|SKIP|DROP|rror" /tmp/t/*.log | tail -30
cd /tmp && tar czf $OUT/final.tar.gz --exclude='t/*.log' t; tar czf $OUT/logs.tar.gz t/*.log t/main.out; ls -la $OUT; echo call $(( $(date +%s)-S ))s
