"""docs/scenario-reference.md is generated from the config models and must match them: this
test regenerates it and compares, and checks that every field of every reachable model has a
row with its type, default and declared bounds."""

from __future__ import annotations

import re

from servesim.tools.scenario_reference import field_type, model_order, reference
from servesim.scenario import Scenario
from tests.conftest import REPO

DOC = REPO / "docs" / "scenario-reference.md"
REGENERATE = "python -m servesim.tools.scenario_reference > docs/scenario-reference.md"


def test_reference_is_up_to_date():
    assert DOC.read_text() == reference(), f"docs/scenario-reference.md is out of date; run: {REGENERATE}"


def test_every_field_has_a_row_with_its_bounds():
    text = reference()
    order, _ = model_order(Scenario)
    assert len(order) > 30  # workload, KV and step-time models are reached, not only the top level
    for cls in order:
        sec = text.split(f'<a id="{cls.__name__.lower()}"></a>', 1)[1].split("<a id=", 1)[0]
        for name, f in cls.model_fields.items():
            row = next((line for line in sec.splitlines() if line.startswith(f"| `{f.alias or name}` |")), None)
            assert row is not None, f"{cls.__name__}.{name} has no row"
            for bound in field_type(f).bounds:
                assert bound in row, (cls.__name__, name, bound)


def test_known_facts_are_stated():
    text = reference()
    assert re.search(r"\| `block_size` \| integer \| `16` \| >= 1; <= 256 \|", text)
    assert "| `kv_allocator` | `paged` \\| `static` \\| `elastic` | `paged` |" in text
    assert "must be between 1 and 2^22 tokens" in text  # a bound only a field validator states
    assert "give stop.requests or stop.duration_s (or both)" in text  # a model validator's rule
    assert "chosen by `dist: lognormal`" in text
