"""What the commands print: the rich console (made on first use), the one-line ``error:`` and
its exit, the quiet commands' folder line, and the line naming the report files written."""

from __future__ import annotations

import functools
import os
import sys
from typing import TYPE_CHECKING

import typer

from servesim.errors import ServesimError

if TYPE_CHECKING:
    from pathlib import Path

    from rich.console import Console


@functools.cache
def console(stderr: bool = False) -> Console:
    """rich's console on stdout (stderr), made on first use: ``servesim run -q`` prints one plain
    line and so never imports rich (~30 ms of a 10k-request run's start-up)."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    if is_terminal(stream) or os.environ.get("COLUMNS"):
        return Console(stderr=stderr)
    # a pipe or a file: rich would wrap and cut every line and table at 80 columns; a log keeps
    # whole lines (a table is as wide as its columns, never padded to this width)
    return Console(stderr=stderr, width=NO_TERMINAL_WIDTH)


NO_TERMINAL_WIDTH = 400  # columns of the console without a terminal


def is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def print_folder(path: Path) -> None:
    """The quiet commands' one line: the output folder, plain (never wrapped at a terminal's
    width or styled, so a script can read it)."""
    print(path, flush=True)


def fail(message: str, code: int = 2) -> None:
    error_line(message)
    raise typer.Exit(code)


def error_line(message: str) -> None:
    """``error: <message>`` on stderr, on one line (a newline inside a message from a library
    becomes a space); plain text, never rich markup (a value such as ``[foo]`` must survive)."""
    from rich.text import Text

    message = " ".join(str(message).split())
    console(stderr=True).print(Text("error:", style="bold red"), Text(message), highlight=False, soft_wrap=True)


def run_writer(write) -> list:
    """Run a report writer; bad input is one line and exit 2, a file system error too."""
    try:
        return write()
    except ServesimError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"writing the report failed: {exc.strerror or exc} ({getattr(exc, 'filename', '') or ''})")
    return []


def written_line(paths: list) -> str:
    html = [str(p) for p in paths if p.suffix == ".html"]
    static = [p for p in paths if p.suffix != ".html"]
    parts = html + ([f"{len(static)} chart files in {static[0].parent}"] if static else [])
    return "wrote " + ", ".join(parts)
