"""The reference experiments of issue 15, replayed: ``python -m benchmarks.reference``.

plan.py (what runs: the scenario files and sweep specs of scenarios/reference/), execute.py (one
run and its record), capacity.py (experiment A's capacity searches), tables.py and charts.py
(what docs/reference-experiments.md shows), doc.py (its generated blocks), __main__.py (the
command).
"""
