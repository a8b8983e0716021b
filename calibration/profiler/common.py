"""Pieces every mode shares, torch-free: the log line, the time budget, one measurement."""

from __future__ import annotations

import shlex
import sys
import time
from dataclasses import dataclass
from typing import Optional


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


def this_command() -> str:
    return "python " + " ".join(shlex.quote(a) for a in sys.argv)


def _csv_list(text, conv=str) -> list:
    return [conv(x) for x in str(text).split(",") if x.strip()]


class BudgetExceeded(RuntimeError):
    """Raised when the hard deadline passes: the caller writes what it has and says what it skipped."""


@dataclass
class Budget:
    """Deadlines (epoch seconds). Past ``soft`` measurements use the minimum repeats; past ``hard``
    they stop. This keeps one device call inside its limit and still returns files."""

    soft: Optional[float] = None
    hard: Optional[float] = None

    def fast(self) -> bool:
        return self.soft is not None and time.time() > self.soft

    def check(self) -> None:
        if self.hard is not None and time.time() > self.hard:
            raise BudgetExceeded("hard deadline passed")


@dataclass
class Meas:
    median_ms: float
    std_ms: float
    n: int
    method: str
