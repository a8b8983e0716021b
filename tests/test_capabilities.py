"""Every engine knob declares who honours it (servesim/policy_catalog.py), so none is silently
ignored by the compiled engine or by a policy."""

from __future__ import annotations

from servesim.config.kv import KVConfig
from servesim.policy_catalog import ENGINE_KNOBS, KV_KNOBS, POLICIES
from servesim.scenario import EngineConfig


def test_every_engine_field_is_declared():
    assert set(EngineConfig.model_fields) == set(ENGINE_KNOBS), (
        "declare new EngineConfig fields in policy_catalog.ENGINE_KNOBS (and remove stale ones)")
    assert set(KVConfig.model_fields) == set(KV_KNOBS), "declare new KVConfig fields in policy_catalog.KV_KNOBS"


def test_declarations_name_real_policies():
    for name, knob in {**ENGINE_KNOBS, **KV_KNOBS}.items():
        if knob.policies is not None:
            assert set(knob.policies) <= set(POLICIES), name
        if not knob.compiled or knob.policies is not None:
            assert knob.why, f"{name}: say why it is restricted"
