"""Typed, frozen configuration models below the scenario: KV (``kv``), length distributions
(``dists``), traces, length files and sessions (``traces``), arrival processes (``arrivals``),
streams (``streams``), the fleet (``cluster``: router, delays, replica groups) and its placement
on servers (``placement``). ``servesim.scenario`` composes them; the packages that act on a config
(kv, workload) import it from here, so configs never import code that runs them."""
