"""Policy configs are strict: errors name the field."""

from __future__ import annotations

import pandas as pd
import pytest
from pydantic import ValidationError

from tasks.whatif.policies import (
    POLICY_KINDS,
    GuidedConfig,
    LargestConfig,
    LruConfig,
    OracleConfig,
    PoolsConfig,
    policy_from_dict,
)


def _fields(err: ValidationError) -> set[str]:
    return {str(e["loc"][-1]) for e in err.errors()}


def test_unknown_field_is_named():
    with pytest.raises(ValidationError) as e:
        LargestConfig(n=4, nn=5)
    assert "nn" in _fields(e.value)
    with pytest.raises(ValidationError) as e:
        policy_from_dict({"kind": "lru", "budgett": 10})
    assert "budgett" in _fields(e.value)


@pytest.mark.parametrize(
    "cls, field, value",
    [
        (LargestConfig, "n", 0),
        (LargestConfig, "n", -1),
        (LargestConfig, "min_size", -1),
        (PoolsConfig, "decay_ns", 0),
        (LruConfig, "budget", -5),
        (LruConfig, "budget", 0),
        (GuidedConfig, "budget", -1),
        (GuidedConfig, "ttl_calls", 0),
        (GuidedConfig, "mode", "keep"),
        (GuidedConfig, "horizons", (16, 4)),
        (GuidedConfig, "horizons", (0, 4)),
        (GuidedConfig, "horizons", ()),
        (GuidedConfig, "horizons", tuple(range(1, 9))),
        (OracleConfig, "budget", -1.0),
    ],
)
def test_bad_values_name_the_field(cls, field, value):
    with pytest.raises(ValidationError) as e:
        cls(**{field: value})
    assert _fields(e.value) == {field}


def test_frozen_and_dispatch():
    p = LargestConfig()
    assert p.n == 4 and p.min_size == 128 * 1024
    with pytest.raises(ValidationError):
        p.n = 5  # type: ignore[misc]
    for kind in POLICY_KINDS:
        assert policy_from_dict({"kind": kind}).kind == kind
    assert isinstance(policy_from_dict({"kind": "largest", "n": 8}), LargestConfig)
    with pytest.raises(ValidationError):
        policy_from_dict({"kind": "nope"})


def test_guided_modes():
    assert GuidedConfig().mode == "priority" and GuidedConfig().label == "guided"
    g = policy_from_dict({"kind": "guided", "mode": "admit", "horizons": [16, 256]})
    assert g.mode == "admit" and g.label == "guided_admit" and g.horizons == (16, 256)


def test_the_policies_former_names_are_the_policies_now():
    """issue 46: seed002 and seed001 are largest and pools; a YAML entry, the layer's options
    or a stored night's table that gives an old name gets the policy it names now."""
    from tasks.core.policy_names import RENAMED_POLICIES
    from tasks.whatif.night import AtBudget, WhatifParams, policy_labels
    from tasks.whatif.policy_core import LayerPolicy

    assert RENAMED_POLICIES == {"seed002": "largest", "seed001": "pools"}
    assert policy_from_dict({"kind": "seed002", "n": 8}) == LargestConfig(n=8)
    assert policy_from_dict({"kind": "seed001", "decay_ns": 5}) == PoolsConfig(decay_ns=5)
    assert WhatifParams(policies=[{"kind": "seed002", "n": 2}]).policies == [LargestConfig(n=2)]
    assert LayerPolicy(policy="seed001").env() == LayerPolicy(policy="pools").env()
    assert AtBudget(workload="all", best_heuristic="seed002").best_heuristic == "largest"
    stored = pd.DataFrame(
        {"policy": ["seed002", "seed001", "lru"], "config": ["{}"] * 3, "predictor": [""] * 3}
    )
    assert list(policy_labels(stored)) == ["largest", "pools", "lru"]
    assert not {k for k in POLICY_KINDS if k in RENAMED_POLICIES}
