"""Typed, frozen configuration models below the scenario: KV (``kv``), length distributions
(``dists``), traces, length files and sessions (``traces``), arrival processes (``arrivals``),
streams (``streams``). ``servesim.scenario`` composes them; the packages that act on a config
(kv, workload) import it from here, so configs never import code that runs them."""
