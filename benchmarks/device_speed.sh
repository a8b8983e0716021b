#!/bin/bash
# The quiet-core speed runs of benchmarks/RESULTS.md, on the lent device machine's host CPU (no
# GPU used): one core pinned, nothing else running. Needs .device_carry/ (git-ignored): wheels,
# shared (the traces), old-engine (a copy of servesim at 6ba1d0b, the engine before issue 10).
# Usage (device run): bash benchmarks/device_speed.sh   -- output also goes to $OUT/speed.txt
set -e
source benchmarks/device_env.sh
CORE=${CORE:-2}
LOG=${OUT:-/tmp}/speed.txt
run() { echo "\$ $*" | tee -a "$LOG"; taskset -c "$CORE" "$@" 2>&1 | tee -a "$LOG"; }
python3 -c "import numba, numpy, sys; print('numba', numba.__version__, 'numpy', numpy.__version__, sys.version)" | tee -a "$LOG"
run python3 -m servesim.warmup
run python3 benchmarks/startup.py --repeat 7
run python3 benchmarks/speed.py --requests 50000 --only a,b --policies vllm --baseline "$PWD/.device_carry/old-engine"
run python3 benchmarks/speed.py --requests 50000 --only a,b --whole-process 10000
