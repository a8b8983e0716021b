#!/usr/bin/env python3
"""Measure op timings on a GPU and write servesim calibration packs and validation data.

The command line of the profiler package calibration/profiler/ (its __init__ says what each
module holds): ``python calibration/profile_gpu.py MODE ...``, e.g. ``ops``, ``iterations``,
``allreduce``, ``all``, ``merge``, ``combine``, ``survey``, ``backends`` (``--help``). Kept as a
script so that the device-run scripts (calibration/device_runs/) and the commands recorded in
packs run unchanged. Copied elsewhere (a ``.device_carry/`` folder at the repository root), it
still finds the package in the checkout's calibration/.
"""

from __future__ import annotations

import sys
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent  # calibration/.. or .device_carry/..
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

from calibration.profiler.cli import main  # noqa: E402
# for device_runs/precision_moe_integrate.sh, which calls it as profile_gpu.merge_collectives_into
from calibration.profiler.combine import merge_collectives_into  # noqa: E402,F401

if __name__ == "__main__":
    sys.exit(main())
