#!/bin/bash
# Whole-process runs of benchmarks/RESULTS.md on the lent device machine's host CPU (no GPU used),
# one pinned core: where start-up goes there (benchmarks/startup_breakdown.py) and `servesim run`
# at 10,000 requests per policy beside the baseline checkout (.device_carry/base/, git-ignored: a
# copy of an earlier commit's servesim package). Both checkouts' numba caches are warmed in
# parallel on the free cores first.
# Usage (device run): bash benchmarks/device_startup.sh   -- output also goes to $OUT/startup.txt
set -e
source benchmarks/device_env.sh
CORE=${CORE:-2}
LOG=${OUT:-/tmp}/startup.txt
BASELINE=${BASELINE:-$PWD/.device_carry/base}
run() { echo "\$ $*" | tee -a "$LOG"; taskset -c "$CORE" "$@" 2>&1 | tee -a "$LOG"; }
python3 -c "import numpy, sys; print('numpy', numpy.__version__, sys.version)" | tee -a "$LOG"
(cd /tmp && python3 -m servesim.cli warm > /tmp/warm-new.log 2>&1) &
(cd /tmp && PYTHONPATH=$BASELINE:$PYTHONPATH python3 -m servesim.cli warm > /tmp/warm-base.log 2>&1) &
wait
run python3 benchmarks/startup_breakdown.py --repeat 5 --baseline "$BASELINE"
run python3 benchmarks/speed.py --skip-run --whole-process 10000 --baseline "$BASELINE" --baseline-engine compiled
