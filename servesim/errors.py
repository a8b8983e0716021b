"""User-facing errors.

Every mistake a user can make in a scenario, a trace file or a calibration pack is raised as a
:class:`ServesimError` whose message is one line naming the field (or file and line), the value and
what is allowed. The CLI prints that line and exits with status 2; it never shows a traceback for
these. Programming errors stay ordinary exceptions so they are not mistaken for bad input.
"""

from __future__ import annotations


class ServesimError(Exception):
    """Bad input from the user: one clear line, exit code 2."""

    exit_code = 2


class ScenarioError(ServesimError):
    """A scenario file, field or override is malformed."""


class PackError(ServesimError):
    """A calibration pack is missing, malformed or does not match the hardware/model asked for."""


class TraceError(ServesimError):
    """A trace or length file is missing or has a malformed row."""


class WorkloadError(ServesimError):
    """A workload (built by hand through the Python API, or drawn from a scenario) holds values
    the engine cannot represent, such as a token count above ``servesim.fields.MAX_TOKENS``."""


class ReportError(ServesimError):
    """A folder given to a report (a run, a sweep, runs to compare) is missing, incomplete or
    unreadable, or a chart option names something the results do not hold."""
