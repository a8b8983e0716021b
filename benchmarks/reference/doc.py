"""Generated blocks of docs/reference-experiments.md.

The prose (the field reports' claims, where and why our predictions differ) is written by hand;
each table and chart sits between two markers and is rewritten by the runner::

    <!-- generated: B1-latency -->
    | model | clients | ...
    <!-- end: B1-latency -->

A block this run did not produce (``--only``) is left as it was; a block it produced whose
markers the document lacks is an error (the document and the runner must agree).
"""

from __future__ import annotations

import re


class DocError(ValueError):
    pass


def _pattern(name: str) -> re.Pattern:
    n = re.escape(name)
    return re.compile(rf"(<!-- generated: {n} -->\n)(.*?)(<!-- end: {n} -->)", re.S)


def blocks_in(text: str) -> list[str]:
    return re.findall(r"<!-- generated: (\S+) -->", text)


def fill(text: str, blocks: dict[str, str]) -> str:
    for name, body in blocks.items():
        pat = _pattern(name)
        if not pat.search(text):
            raise DocError(f"the document has no block '{name}' (add '<!-- generated: {name} -->' and "
                           f"'<!-- end: {name} -->' where it goes)")
        text = pat.sub(lambda m: m.group(1) + body.rstrip("\n") + "\n" + m.group(3), text, count=1)
    return text
