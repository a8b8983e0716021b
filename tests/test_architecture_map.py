"""docs/architecture.md's module index names every module of the package, as the code says."""

from __future__ import annotations

from servesim.tools.module_index import DOC, END, START, first_sentence, modules, section


def test_every_module_has_a_docstring():
    missing = [rel for rel, text in modules() if not text]
    assert not missing, f"modules without a docstring (the map's index reads it): {missing}"


def test_the_index_in_docs_architecture_is_current():
    text = DOC.read_text(encoding="utf-8")
    assert START in text and END in text, "docs/architecture.md lost its module index markers"
    current = text[text.index(START):text.index(END) + len(END)]
    assert current == section(), "docs/architecture.md's module index is stale: python -m servesim.tools.module_index --write"
    for rel, _ in modules():
        assert f"| `{rel}` |" in current


def test_first_sentence_stops_at_the_first_full_stop_and_keeps_abbreviations():
    assert first_sentence("Does a thing, e.g. this. Then more.") == "Does a thing, e.g. this."
    assert first_sentence("One line\nover two. Second.") == "One line over two."
    assert first_sentence("a | b.") == "a \\| b."
    assert first_sentence("x" * 300).endswith("…") and len(first_sentence("x" * 300)) == 180
