# source me on the lent device machine (benchmarks/RESULTS.md: the quiet runs): servesim's missing
# dependencies from wheels carried in .device_carry/wheels (pip download --python-version 3.12
# --only-binary=:all: simpy pydantic "dask[distributed]"), the data from .device_carry/shared
set -e
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --find-links .device_carry/wheels --target /tmp/site simpy pydantic 'dask[distributed]' 2>&1 | grep -v -i warning || true
export PYTHONPATH=$PWD:/tmp/site
export SERVESIM_SHARED=$PWD/.device_carry/shared
lscpu | grep -E "Model name|^CPU\(s\)" || true
