#!/usr/bin/env python3
"""Eager vs CUDA-graph decode forwards at short contexts and large batches (issue 28).

The pack model's eager floor ``C(b)`` (servesim/perf/packmodel.py ``_cpu_floor_curve``) is fitted
on the CPU-bound overhead calibration forwards (decode, context 1,024); this measures points the
fit never read: decode batches of 256, 512 and 800 sequences at 128 and 450 tokens of context,
where the old floor (the calibration forwards' walls, GPU-bound there) priced an eager step at
1,024-token attention, plus CPU-bound references (batches 1, 32, 128 at 450) and the old floor's
own row shape at 512 x 1,024.

It is the profiler's ``iterations`` mode unchanged (calibration/profiler/mode_iterations.py: same
forward, timer, SDPA choice from the pack with ``--backends-from``, same CSV/YAML), run on these
compositions instead of ``validation_compositions``; the rest of the command line is that mode's::

    python3 calibration/device_runs/eager_check.py iterations --model llama-3-8b \\
        --backends-from calibration/packs/h200 --out /tmp/eager
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from calibration.profiler import mode_iterations  # noqa: E402
from calibration.profiler.cli import main  # noqa: E402
from calibration.profiler.grids import Composition  # noqa: E402

#: (batch, context per sequence) of the decode-only forwards; the quick set is for CPU logic tests
POINTS = [(256, 128), (512, 128), (800, 128), (256, 450), (512, 450), (800, 450),
          (1, 450), (32, 450), (128, 450), (512, 1024)]
QUICK_POINTS = [(4, 128), (8, 450)]


def compositions(model: str, quick: bool) -> list[Composition]:
    return [Composition(0, 0, 0, b, c) for b, c in (QUICK_POINTS if quick else POINTS)]


if __name__ == "__main__":
    mode_iterations.validation_compositions = compositions  # the only change to the mode
    sys.exit(main(sys.argv[1:]))
