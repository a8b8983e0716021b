"""Progress bars of the CLI: one over a run's requests, one over a sweep's or replications' tasks.

rich is imported when a bar first draws, not before: ``servesim run -q`` (scripts, sweeps over
the shell) shows no bar and so never loads rich's progress machinery.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

SHOW_AFTER_S = 2.0  # a run's bar appears only once the run has lasted this long


class _Bar:
    """A bar drawn on ``console`` once there is something to show; none at all without a console
    (quiet commands), so calling it costs nothing there."""

    def __init__(self, console: Console | None):
        self.console = console
        self._progress: Progress | None = None
        self._task = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._progress is not None:
            self._progress.stop()


class ProgressReporter(_Bar):
    """Shows a bar only once a run has lasted a few seconds; cheap to call often."""

    def __init__(self, console: Console | None, total: int | None):
        super().__init__(console)
        self.total = total
        self._t0 = 0.0

    def __enter__(self):
        self._t0 = time.perf_counter()
        return self

    def update(self, done: int) -> None:
        if self.console is None:
            return
        if self._progress is None:
            if time.perf_counter() - self._t0 < SHOW_AFTER_S:
                return
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn("simulating"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("requests"), TimeElapsedColumn(), console=self.console,
                                      transient=True)
            self._progress.start()
            self._task = self._progress.add_task("sim", total=self.total)
        self._progress.update(self._task, completed=done)


PLAIN_EVERY_S = 5.0  # without a terminal: a progress line at most this often (and the last)


class PointsProgress(_Bar):
    """A progress bar over tasks (points x seeds): done/total, rate per minute, elapsed, ETA.
    Call it as ``progress(done, total)``; tasks found done on resume count as done from the start
    and do not inflate the rate."""

    def __init__(self, console: Console | None, label: str = "sweep", unit: str = "runs"):
        super().__init__(console)
        self.label, self.unit = label, unit

    def __call__(self, done: int, total: int) -> None:
        if self.console is None:
            return
        if not self.console.is_terminal:  # a pipe or a log: no live bar (it drew only at the end)
            self._plain(done, total)
            return
        if self._progress is None:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)
            from rich.text import Text

            unit = self.unit

            class Rate(ProgressColumn):
                def render(self, task) -> Text:
                    return Text("-" if not task.speed else f"{task.speed * 60:,.1f} {unit}/min")

            self._progress = Progress(TextColumn(self.label), BarColumn(), MofNCompleteColumn(), TextColumn(unit),
                                      Rate(), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                      console=self.console, transient=False)
            self._progress.start()
            self._task = self._progress.add_task(self.label, total=total, completed=done)
            return
        self._progress.update(self._task, completed=done, total=total)

    def _plain(self, done: int, total: int) -> None:
        """One plain line as tasks finish, at most every PLAIN_EVERY_S, and the last state when
        the bar closes: a log or a pipe sees the sweep go on, where a live bar shows only once
        it is over."""
        now = time.perf_counter()
        if not hasattr(self, "_t0"):
            self._t0, self._last, self._first = now, -PLAIN_EVERY_S, done
        self._pending = (done, total)
        if done < total and now - self._last < PLAIN_EVERY_S:
            return
        self._last, self._pending = now, None
        self._line(done, total, now)

    def _line(self, done: int, total: int, now: float) -> None:
        ran, spent = done - self._first, now - self._t0
        text = f"{self.label}: {done:,}/{total:,} {self.unit}"
        if ran > 0 and spent > 0:
            per_s = ran / spent
            left = int(round((total - done) / per_s))
            text += f", {per_s * 60:,.1f} {self.unit}/min, ETA {left // 3600}:{left // 60 % 60:02d}:{left % 60:02d}"
        self.console.print(f"{text}, {spent:,.0f} s elapsed", markup=False, highlight=False, soft_wrap=True)

    def __exit__(self, *exc):
        if getattr(self, "_pending", None) is not None:  # the last state, not yet printed
            self._line(*self._pending, time.perf_counter())
            self._pending = None
        super().__exit__(*exc)
