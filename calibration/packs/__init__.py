"""Calibration packs, installed as the package ``servesim.packs`` (see pyproject.toml):
``<gpu>/<model>[-tp<N>].csv`` with a YAML of provenance next to each; format in
calibration/PACK_FORMAT.md."""
