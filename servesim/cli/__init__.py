"""Command line: parse, call the library, print. Nothing here computes results.

``commands.py`` holds the ``servesim`` verbs and :func:`main` (the console script's entry point);
``output.py`` what they print. The ``calibrate`` verbs live in :mod:`servesim.tools` and load only
when named.
"""

from servesim.cli.commands import app, main

__all__ = ["app", "main"]
