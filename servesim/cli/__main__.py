"""``python -m servesim.cli``: the ``servesim`` command."""

from servesim.cli import main

main()
