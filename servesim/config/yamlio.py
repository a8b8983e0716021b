"""Reading scenario text: YAML files as plain data, ``--set`` overrides on dotted paths, and
pydantic's errors turned into one line naming the field, the value and what is allowed.
servesim/scenario.py builds the Scenario from what these return (and re-exports
``read_yaml_file`` and ``parse_overrides``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import (BaseModel, ValidationError)

from servesim.errors import ScenarioError
from servesim.policy_catalog import POLICIES
from servesim.models import ConfigError, ModelShape, shape_from_file
from servesim.yamltext import YamlDataError, load_yaml




def _read_model_config(path: str, base_dir: str) -> ModelShape:
    p = Path(path).expanduser()
    if not p.is_absolute():
        p = Path(base_dir) / p
    try:
        return shape_from_file(p)
    except ConfigError as e:
        raise ValueError(f"model.config = {path!r}: {e}") from None


def _tp_fits(shape: ModelShape, tp: int) -> bool:
    kv = shape.num_kv_heads
    return shape.num_heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)


# ------------------------------------------------------------------------- loading + errors
def _format_loc(loc: tuple) -> str:
    parts: list[str] = []
    for p in loc:
        if isinstance(p, int):
            parts.append(f"[{p}]")
        elif p in ("function-after", "function-before", "int", "float", "str", "list", "bool") or "[" in str(p) \
                or str(p).startswith(("Literal", "union", "ModelShape", "ModelRef", "Fixed", "Normal")):
            continue  # pydantic's internal union/validator branch labels
        else:
            parts.append(("." if parts else "") + str(p))
    return "".join(parts) or "scenario"


def _merged(base: dict, over: dict) -> dict:
    """A group's engine fields over the scenario's: sections merge at every depth (a group's
    ``kv: {static: {fit: best}}`` keeps the scenario's ``kv.static.reserve``, as ``--set`` does);
    ``options`` is replaced whole (a policy's knobs belong together)."""
    out = dict(base)
    for k, v in over.items():
        if k != "options" and isinstance(v, dict) and isinstance(out.get(k), dict):
            v = _merged(out[k], v)
        out[k] = v
    return out


def _first_error(err: ValidationError, source: str) -> str:
    errors = err.errors()
    # prefer the most specific error: longest location; at equal depth (the branches of a union
    # such as workload.classes or model), a bad value over a wrong type over an unknown field over
    # a missing one: the branch that knows the field says what is wrong with its value
    def rank(x: dict) -> int:
        kind = x["type"]
        if kind == "missing":
            return 0
        if kind == "extra_forbidden":
            return 1
        return 2 if kind.endswith("_type") or kind == "literal_error" else 3

    e = max(errors, key=lambda x: (len(x["loc"]), rank(x))) if errors else None
    if e is None:
        return f"{source}: invalid scenario"
    loc = _format_loc(e["loc"])
    kind = e["type"]
    value = e.get("input")
    msg = e["msg"].removeprefix("Value error, ")
    if kind == "extra_forbidden":
        return f"{source}: {loc}: unknown field (check the spelling; see docs/scenario.md for the allowed fields)"
    if kind == "missing":
        return f"{source}: {loc}: required field is missing"
    if kind == "union_tag_not_found":  # a tagged section (e.g. step_time) given without its tag
        tag = (e.get("ctx") or {}).get("discriminator", "").strip("'")
        return (f"{source}: {loc}.{tag} is missing: a {loc} section names its {tag} "
                f"(see docs/scenario-reference.md for the allowed values)")
    shown = repr(value) if not isinstance(value, dict) else "{...}"
    if len(shown) > 80:
        shown = shown[:77] + "..."
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    if kind in ("value_error", "assertion_error") and loc == "scenario":
        return f"{source}: {msg}{more}"
    return f"{source}: {loc} = {shown}: {msg}{more}"


def _apply_override(raw: dict, path: str, value_text: str, source: str) -> None:
    shown = repr(value_text) if len(value_text) <= 60 else repr(value_text[:57] + "...")
    try:
        value = load_yaml(value_text) if value_text != "" else ""
    except YamlDataError as exc:
        raise ScenarioError(f"{source}: --set {path}: value {shown}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{source}: --set {path}: value {shown} is not valid YAML "
                            f"({yaml_problem(exc)})") from None
    _set_path(raw, path, value, source, "--set")


def _set_path(raw: dict, path: str, value: Any, source: str, label: str, obj: Any = None) -> None:
    """Set ``raw[k1][k2]...[kn] = value`` for ``path = "k1.k2...kn"``, creating mappings on the way.

    ``obj`` is the validated object ``raw`` was dumped from (with only the fields that were
    given): a sub-config missing from ``raw`` because it kept its default is filled in from it, so
    ``workload.arrival.rate`` keeps the default arrival's ``process``."""
    keys = path.split(".")
    where = f"{label} {path}" if label else path
    if not all(keys):
        raise ScenarioError(f"{source}: {where!r}: empty key in dotted path")
    for i, k in enumerate(keys):
        if "[" in k or "]" in k or k.isdigit():  # (it read as an unknown field named 'streams[0]')
            head = ".".join(keys[:i] + ([k.split("[")[0]] if k.split("[")[0] and not k.isdigit() else []))
            raise ScenarioError(f"{source}: {where}: a list item cannot be set alone; lists are replaced "
                                f"whole: {label + ' ' if label else ''}'{head}=[...]' with every item")
    node: Any = raw
    for i, k in enumerate(keys[:-1]):
        obj = _child(obj, k)
        nxt = node.get(k) if isinstance(node, dict) else None
        if nxt is None:
            nxt = _as_raw(obj) if isinstance(obj, (BaseModel, dict)) else {}
            node[k] = nxt
        if isinstance(nxt, list):
            raise ScenarioError(f"{source}: {where}: {'.'.join(keys[: i + 1])} is a list, and lists are replaced "
                                f"whole: {label + ' ' if label else ''}'{'.'.join(keys[: i + 1])}=[...]' with "
                                f"every item")
        if not isinstance(nxt, dict):
            shown = repr(nxt) if len(repr(nxt)) <= 60 else repr(nxt)[:57] + "..."
            raise ScenarioError(
                f"{source}: {where}: {'.'.join(keys[: i + 1])} is {shown}, not a mapping"
            )
        node = nxt
    node[keys[-1]] = value


def _child(obj: Any, key: str) -> Any:
    if isinstance(obj, BaseModel):
        return getattr(obj, key, None) if key in type(obj).model_fields else None
    if isinstance(obj, dict):
        return obj.get(key)
    return None


def _as_raw(x: Any) -> Any:
    """Plain data for validation: pydantic objects become the mappings of the fields they were
    given (defaults stay defaults, so validators that look at which fields were given still
    work); containers are copied."""
    if isinstance(x, BaseModel):
        return _as_raw(x.model_dump(exclude_unset=True))
    if isinstance(x, Mapping):
        return {k: _as_raw(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_as_raw(v) for v in x]
    return x


def yaml_problem(exc: yaml.YAMLError) -> str:
    """What a YAML error says, on one line (a reader error's text spans two: the character,
    then where it is; an unprintable character is named by its code)."""
    if isinstance(exc, yaml.reader.ReaderError):
        ch = exc.character
        code = f"#x{ch:04x}" if isinstance(ch, int) else repr(ch)
        return f"{exc.reason}: character {code} at position {exc.position}"
    problem = getattr(exc, "problem", None) or str(exc)
    return " ".join(str(problem).split())


def parse_overrides(items: list[str] | None) -> list[tuple[str, str]]:
    out = []
    for item in items or []:
        if "=" not in item:
            raise ScenarioError(f"--set {item!r}: expected KEY=VALUE with a dotted KEY, e.g. engine.max_num_seqs=64")
        k, v = item.split("=", 1)
        out.append((k.strip(), v.strip()))
    return out


RESULT_KEYS = frozenset({"scenario", "requests", "throughput", "latency_s"})  # of a summary.json


def read_yaml_file(p: Path, source: str, what: str) -> Any:
    """The plain data of a YAML file (a scenario, a sweep spec), or ScenarioError in one line:
    missing, a folder, unreadable, not UTF-8, not valid YAML, not plain data (servesim/yamltext.py:
    duplicate keys, tags that build objects, recursive aliases, alias bombs), empty."""
    if not p.is_file():
        raise ScenarioError(f"{source}: no such {what} file" + (" (it is a folder)" if p.is_dir() else ""))
    try:
        text = p.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{source}: not UTF-8 text (byte {exc.start}); a {what} is a YAML text file"
                            + (" (this looks like a run's parquet output)" if p.suffix == ".parquet" else "")) from None
    except OSError as exc:
        raise ScenarioError(f"{source}: cannot be read ({exc.strerror})") from None
    try:
        raw = load_yaml(text)
    except YamlDataError as exc:
        raise ScenarioError(f"{source}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}:" if mark else ""
        raise ScenarioError(f"{source}:{where} not valid YAML ({yaml_problem(exc)})") from None
    if raw is None:
        raise ScenarioError(f"{source}: the file is empty")
    return raw


def _drop_foreign_options(before: dict, raw: dict, paths: list[str]) -> tuple[str, ...]:
    """Switching a preset's policy with ``--set engine.scheduler=X`` drops the file's
    ``engine.options`` that X does not know (they belong to the preset's policy), with a note.

    Why not an error: the user asked for another policy on purpose, and the preset's knobs of the
    old policy cannot apply to it; refusing would make every preset comparison two overrides
    long. Options given with ``--set engine.options...`` are never dropped, and a file that
    itself names options its own policy does not know is still an error (a typo must not vanish)."""
    if "engine.scheduler" not in paths or any(p == "engine" or p.startswith("engine.options") for p in paths):
        return ()
    engine = raw.get("engine")
    options = engine.get("options") if isinstance(engine, dict) else None
    if not isinstance(options, dict) or not options:
        return ()
    old = (before.get("engine") or {}).get("scheduler", "vllm") if isinstance(before.get("engine"), dict) else "vllm"
    spec = POLICIES.get(str(engine.get("scheduler")))
    if spec is None:
        return ()  # an unknown policy or one of the user's: validation names it
    known = spec.options
    dropped = [k for k in options if k not in known]
    if not dropped:
        return ()
    engine["options"] = {k: v for k, v in options.items() if k in known}
    return (f"engine.options: dropped {', '.join(dropped)} (options of scheduler {old!r}, which "
            f"--set engine.scheduler={engine.get('scheduler')} replaced)",)


PARALLEL_PATHS = ("engine.tensor_parallel_size", "engine.pipeline_parallel_size")


def _drop_derived_gpus(raw: dict, paths: list[str]) -> tuple[str, ...]:
    """``--set engine.tensor_parallel_size=2`` on a file stating ``hardware.gpus_per_replica: 1``
    drops the file's gpus_per_replica, with a note: it follows from tp x pp, and ``--set`` cannot
    remove a field (the run was refused, asking to remove it). A gpus_per_replica given by an
    override too is kept, and checked against tp x pp as in a file."""
    if not any(p in PARALLEL_PATHS for p in paths) or any(p in ("hardware", "hardware.gpus_per_replica")
                                                           for p in paths):
        return ()
    hw = raw.get("hardware")
    if not isinstance(hw, dict) or "gpus_per_replica" not in hw:
        return ()
    old = hw.pop("gpus_per_replica")
    given = ", ".join(p for p in paths if p in PARALLEL_PATHS)
    return (f"hardware.gpus_per_replica: dropped ({old!r} in the scenario; it follows from {given}: GPUs a "
            f"replica = tensor x pipeline parallel size)",)


def _flow(d: dict) -> str:
    """A mapping in YAML flow style, for messages that show a --set value."""
    return yaml.safe_dump(d, default_flow_style=True, width=1 << 16).strip() if d else "{}"


def _deep_copy(x: Any) -> Any:
    """A copy of the raw data; numpy scalars (from Python callers' grids) become Python ones, so
    strict validation sees what they mean (np.int64(64) is the integer 64), never their type."""
    if isinstance(x, dict):
        return {k: _deep_copy(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_deep_copy(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x
