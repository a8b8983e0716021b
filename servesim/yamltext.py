"""Reading YAML scenario text as plain data, refusing what ``yaml.safe_load`` lets through.

``yaml.safe_load`` builds only plain data (no Python objects), but it still accepts:

* **duplicate keys** (``name: a`` then ``name: b``): the last one silently wins;
* **recursive aliases** (``a: &x [*x]``): a self-containing list that later code recurses into
  until Python's stack overflows;
* **alias bombs** ("billion laughs"): ten nested levels of ten aliases each are a few hundred
  bytes of text but 10^10 nodes once anything walks the data (validation took over 120 s).

Here the text is composed into YAML's node graph first (aliases are shared nodes there, so this
is cheap), the graph is checked for cycles and for its expanded size, then it is constructed with
duplicate keys refused. Numbers follow YAML 1.2: ``1e3`` is a float (PyYAML's YAML 1.1 rules read
it as the string ``"1e3"``), so a value written as a number is a number and a quoted one a string.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

MAX_NODES = 1_000_000  # expanded nodes (aliases counted as copies): far above any scenario

_FLOAT_12 = re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")


class YamlDataError(ValueError):
    """The YAML text is not acceptable data; the message is one line."""


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 exponent floats and duplicate keys refused."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # '<<' merges: later keys override merged ones by design
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # unhashable key: the base constructor reports it
                line = key_node.start_mark.line + 1
                if first is not None:
                    raise YamlDataError(f"line {line}: duplicate key {key!r} (first at line {first}); "
                                        f"a mapping names each key once")
                seen[key] = line
        return super().construct_mapping(node, deep)

    def construct_yaml_int(self, node):
        """An integer too long for Python to convert (over ``sys.get_int_max_str_digits()``,
        4,300 digits) is refused in one line, not a ValueError traceback: no field takes anything
        near that size."""
        try:
            return super().construct_yaml_int(node)
        except ValueError:
            digits = sum(c.isdigit() for c in str(node.value))
            raise YamlDataError(f"line {node.start_mark.line + 1}: an integer of {digits:,} digits; no field "
                                f"accepts a number that long (Python reads at most {_max_digits():,})") from None


def _max_digits() -> int:
    import sys

    return sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 4300


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+0123456789"))


def _check_graph(root: Node) -> None:
    """Refuse cycles (recursive aliases) and graphs whose expansion exceeds MAX_NODES."""
    size: dict[int, int] = {}
    on_path: set[int] = set()
    # iterative post-order walk: a deep document must not overflow Python's stack either
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            total = 1
            for child in _children(node):
                total += size[id(child)]
                if total > MAX_NODES:
                    break
            if total > MAX_NODES:
                mark = node.start_mark
                raise YamlDataError(
                    f"line {mark.line + 1}: aliases expand to more than {MAX_NODES:,} values "
                    f"(an alias bomb?); write the data out instead"
                )
            size[key] = total
            continue
        if key in size:
            continue
        if key in on_path:
            raise YamlDataError(f"line {node.start_mark.line + 1}: a recursive alias (the value contains "
                                f"itself); scenario data must be a tree")
        on_path.add(key)
        stack.append((node, True))
        for child in _children(node):
            cid = id(child)
            if cid in on_path:
                raise YamlDataError(f"line {child.start_mark.line + 1}: a recursive alias (the value "
                                    f"contains itself); scenario data must be a tree")
            if cid not in size:
                stack.append((child, False))


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def load_yaml(text: str) -> Any:
    """Plain data from YAML ``text`` (None for an empty document). Raises :class:`YamlDataError`
    (duplicate key, recursive alias, alias bomb) or ``yaml.YAMLError`` (syntax)."""
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        _check_graph(root)
        return loader.construct_document(root)
    except RecursionError:
        raise YamlDataError("the data is nested too deeply (thousands of levels)") from None
    finally:
        loader.dispose()
