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


class NoProgress(ServesimError):
    """The run cannot make progress with this configuration (a request preempted over and over:
    the KV pool cannot keep it running beside what the others hold). One line naming the request,
    the pool and the knobs that give it room, instead of a run that never ends."""


class PolicyBug(ServesimError, AssertionError):
    """An invariant the engine checks (``sim.check_invariants``) broken by the policy's decisions,
    such as admitting a request past the KV pool: one line from the CLI, not a traceback, since a
    user's policy part is input to the run; still an AssertionError, as every engine check raises."""


def kernel_typing_line(exc: BaseException) -> str | None:
    """One line for numba's TypingError (pages of text) when a Python part of a user's policy
    called a compiled servesim kernel with the Python engine's state, which numba cannot type;
    None for any other exception."""
    if not any(c.__name__ == "TypingError" for c in type(exc).__mro__):
        return None
    import re

    name, tb = None, exc.__traceback__
    while tb is not None and name is None:  # numba's dispatcher frame holds the kernel called
        fn = getattr(tb.tb_frame.f_locals.get("self"), "py_func", None)
        name = getattr(fn, "__name__", None)
        tb = tb.tb_next
    if name is None:  # (SimPy re-raises a process's exception without numba's frames)
        name = _kernel_at(str(exc))
    return (f"a part of your policy called the compiled kernel {name} from Python, where it cannot take the "
            f"Python engine's state (numba TypingError); call servesim.jit.pure({name}) instead, the same "
            f"function uncompiled (docs/testing.md, \"Calling a built-in part\")")


def _kernel_at(message: str) -> str:
    """The kernel a numba typing message is about: ``>>> name(``, or the function defined at
    ``typing of argument at FILE (LINE)`` (its decorator line)."""
    import re
    from pathlib import Path

    m = re.search(r">>> (\w+)\(", message)
    if m:
        return m.group(1)
    m = re.search(r"typing of argument at (\S+\.py) \((\d+)\)", message)
    if m:
        try:
            lines = Path(m.group(1)).read_text().splitlines()[int(m.group(2)) - 1:int(m.group(2)) + 5]
        except (OSError, ValueError):
            lines = []
        for line in lines:
            d = re.match(r"\s*def (\w+)\(", line)
            if d:
                return d.group(1)
    return "a servesim kernel"
