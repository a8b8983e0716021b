"""The resolved scenario: what a run actually simulated, as a scenario file that re-runs it.

Every run writes ``scenario.resolved.yaml``: the scenario after ``--set`` overrides, ``--seed``
and defaults (every field written out), with file paths made absolute so the file runs from any
folder, headed by the servesim version and the calibration pack's id. ``summary.json`` carries its
SHA-256 (``resolved_scenario.sha256``), so two summaries with the same hash came from the same
configuration.

The file is a fixed point: loading it and resolving again gives the same text (hence the same
hash), so ``servesim run out/x/scenario.resolved.yaml`` reproduces ``out/x/summary.json`` except
``wall_s`` (wall-clock time). Nothing depends on where a file was read from: ``base_dir`` is not
written (paths are absolute), and the header names no origin.
"""

from __future__ import annotations

import hashlib
import os

import yaml
from pydantic import BaseModel

from servesim.scenario import ModelRefConfig, Scenario
from servesim.version import __version__
from servesim.config.traces import LengthsConfig, ServeGenArrivalConfig, TraceConfig
from servesim.workload.trace_readers import resolve_path


def resolved_dict(sc: Scenario, seed: int | None = None) -> dict:
    """The scenario as a plain mapping: every field, inactive workload fields left out (a trace
    replay has no arrival process), paths absolute, no ``base_dir``."""
    data = sc.model_dump(mode="json", by_alias=True)
    _absolute_paths(sc, data, sc.base_dir)
    data.pop("base_dir", None)
    work = {k: v for k, v in data["workload"].items() if k in sc.workload.resolved_fields()}
    if "streams" in work:  # a stream's unused sources and empty SLO targets are noise: leave out None
        work["streams"] = [_without_none(x) for x in work["streams"]]
    if "contaminate" in work:
        work["contaminate"] = _without_none(work["contaminate"])
    data["workload"] = work
    # parallelism resolved in both spellings (engine's vLLM names, hardware's older ones), so
    # they agree when the file is read again
    data["engine"]["tensor_parallel_size"], data["engine"]["pipeline_parallel_size"] = sc.tp, sc.pp
    data["hardware"].update(tp=sc.tp, pp=sc.pp, gpus_per_replica=sc.gpus_per_replica)
    if seed is not None:
        data["seed"] = seed
    return _variant_first(data)


def _without_none(d):
    if isinstance(d, dict):
        return {k: _without_none(v) for k, v in d.items() if v is not None}
    return d


def _variant_first(x):
    """Mappings that name a variant (``dist``, ``process``, ``model``) list that key first."""
    if isinstance(x, list):
        return [_variant_first(v) for v in x]
    if not isinstance(x, dict):
        return x
    out = {k: _variant_first(v) for k, v in x.items()}
    for key in ("dist", "process", "model"):
        if key in out and isinstance(out[key], str):
            return {key: out[key], **{k: v for k, v in out.items() if k != key}}
    return out


def _absolute_paths(model: BaseModel, data: dict, base_dir: str) -> None:
    """Rewrite, in ``data`` (``model``'s dump), every file path as an absolute path."""
    if isinstance(model, (LengthsConfig, TraceConfig)):
        data["file"] = os.path.abspath(resolve_path(model.file, base_dir))
    if isinstance(model, ServeGenArrivalConfig):
        data["dir"] = os.path.abspath(resolve_path(model.dir, base_dir))
    if isinstance(model, ModelRefConfig) and model.config is not None:
        data["config"] = os.path.abspath(resolve_path(model.config, base_dir))
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        key = info.alias or name
        if isinstance(value, BaseModel) and isinstance(data.get(key), dict):
            _absolute_paths(value, data[key], base_dir)
        elif isinstance(value, list):
            for item, item_data in zip(value, data.get(key) or []):
                if isinstance(item, BaseModel) and isinstance(item_data, dict):
                    _absolute_paths(item, item_data, base_dir)


def pack_id(sc: Scenario) -> str | None:
    """``<gpu>/<pack> sha256:<first 16 hex of the CSV and YAML>`` of the pack the step-time model
    runs (``step_time`` pack, or the default ``auto`` where a pack fits), else None (roofline and
    constant models have no data file; servesim/perf/select.py decides)."""
    from servesim.perf.select import choose

    c = choose(sc)
    return c.pack_id if c.model == "pack" else None


def _step_label(sc: Scenario) -> str:
    from servesim.perf.select import choose

    return choose(sc).label


def resolved_yaml(sc: Scenario, seed: int | None = None) -> str:
    """The text of ``scenario.resolved.yaml``."""
    pack = pack_id(sc)
    head = [
        "# scenario.resolved.yaml: the scenario as simulated (after --set overrides, --seed and defaults);",
        "# run it again with: servesim run scenario.resolved.yaml",
        f"# servesim {__version__}",
        f"# step time: {_step_label(sc)}" + (f" ({pack})" if pack is not None else ""),
    ]
    body = yaml.safe_dump(resolved_dict(sc, seed), sort_keys=False, default_flow_style=False, width=100,
                          allow_unicode=True)
    return "\n".join(head) + "\n" + body


def resolved_info(sc: Scenario, seed: int | None = None) -> tuple[str, dict]:
    """(file text, the summary's ``resolved_scenario`` entry)."""
    text = resolved_yaml(sc, seed)
    return text, {"sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(), "servesim_version": __version__,
                  "calibration_pack": pack_id(sc)}
