"""Convert Vidur's public A100 profiles into servesim packs (thin wrapper; logic in servesim.tools.vidur).

    python calibration/import_vidur.py [--src ../shared/calibration/vidur_profiles] [--out calibration/packs]

Same as ``servesim calibrate import-vidur``.
"""

from __future__ import annotations

from servesim.tools.calibrate_cli import app

if __name__ == "__main__":
    app(["import-vidur", *__import__("sys").argv[1:]])
