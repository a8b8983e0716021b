"""What the derivation rules share: the GPU's op surveys and the interpolation helpers
(:mod:`servesim.tools.derive_variants`, :mod:`servesim.tools.derive_moe`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from servesim.errors import PackError
from servesim.perf.kvfp8 import survey_root  # noqa: F401 (one definition, at the runtime's floor)

IDW_POWER = 2.0


def read_survey(gpu: str, name: str) -> pd.DataFrame:
    path = survey_root() / gpu / f"{name}.csv"
    if not path.is_file():
        raise PackError(f"{path}: no {name} survey for gpu {gpu}; surveys exist for: "
                        f"{', '.join(sorted(p.name for p in survey_root().glob('*') if p.is_dir())) or 'none'}")
    return pd.read_csv(path)


def _interp_log(x: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Linear in log x, held at the ends."""
    return np.interp(np.log(np.maximum(np.asarray(x, np.float64), 1e-12)), np.log(xs), ys)


def _idw(d: np.ndarray) -> np.ndarray:
    if d.min() < 1e-12:
        return (d < 1e-12).astype(np.float64)
    return 1.0 / d ** IDW_POWER
