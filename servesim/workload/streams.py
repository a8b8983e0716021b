"""Named random streams.

Every random source of a simulation (arrivals, prompt lengths, output lengths, classes, think
times, ...) draws from its own generator, derived from the scenario seed and the source's *name*
through ``numpy.random.SeedSequence``. Adding a new source therefore never shifts the numbers of
the existing ones, and no code touches numpy's global RNG.
"""

from __future__ import annotations

import zlib

import numpy as np


def stream(seed: int, name: str) -> np.random.Generator:
    key = zlib.crc32(name.encode("utf-8"))
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(key,))))
