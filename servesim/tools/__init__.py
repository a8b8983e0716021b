"""Offline tools: what makes and checks the data a run reads, never run by a simulation.

The ``servesim calibrate`` verbs and the validation helpers (``calibrate_cli``), the Vidur
importer (``vidur``), derived packs (``derive``, ``derived_packs``) and the scenario reference
page's generator (``scenario_reference``). This is the top floor below the CLI
(pyproject.toml's import contract): no runtime package imports it, and the CLI loads it only
when a ``calibrate`` verb (or the command list) is asked for.
"""

from servesim.exports import exports

__all__, __getattr__ = exports(__name__, {
    "read_validation": "servesim.tools.calibrate_cli",
    "validate_frame": "servesim.tools.calibrate_cli",
    "error_table": "servesim.tools.calibrate_cli",
})
