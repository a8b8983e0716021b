#!/bin/bash
# The quiet-core speed runs of benchmarks/RESULTS.md, on the lent device machine's host CPU (no
# GPU used): one core pinned, nothing else running. Needs .device_carry/ (git-ignored): wheels,
# shared (the traces), and the baseline checkout's servesim package (default: old-engine, a copy
# of servesim at 6ba1d0b, the engine before issue 10).
# Usage (device run): [BASELINE=dir BASELINE_ENGINE=compiled] bash benchmarks/device_speed.sh
#   -- output also goes to $OUT/speed.txt
set -e
source benchmarks/device_env.sh
CORE=${CORE:-2}
LOG=${OUT:-/tmp}/speed.txt
BASELINE=${BASELINE:-$PWD/.device_carry/old-engine}
BASELINE_ENGINE=${BASELINE_ENGINE:-old}
run() { echo "\$ $*" | tee -a "$LOG"; taskset -c "$CORE" "$@" 2>&1 | tee -a "$LOG"; }
python3 -c "import numba, numpy, sys; print('numba', numba.__version__, 'numpy', numpy.__version__, sys.version)" | tee -a "$LOG"
run python3 -m servesim.cli warm
run python3 benchmarks/startup.py --repeat 7
if [ "$BASELINE_ENGINE" = old ]; then
    run python3 benchmarks/speed.py --requests 50000 --only a,b --policies vllm --baseline "$BASELINE"
    run python3 benchmarks/speed.py --requests 50000 --only a,b --whole-process 10000
else
    run python3 benchmarks/speed.py --requests 50000 --only a,b --baseline "$BASELINE" --baseline-engine compiled \
        --whole-process 10000
fi
