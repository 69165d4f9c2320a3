"""Policy configs are strict: errors name the field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tasks.whatif.policies import (
    POLICY_KINDS,
    GuidedConfig,
    LruConfig,
    OracleConfig,
    Seed001Config,
    Seed002Config,
    policy_from_dict,
)


def _fields(err: ValidationError) -> set[str]:
    return {str(e["loc"][-1]) for e in err.errors()}


def test_unknown_field_is_named():
    with pytest.raises(ValidationError) as e:
        Seed002Config(n=4, nn=5)
    assert "nn" in _fields(e.value)
    with pytest.raises(ValidationError) as e:
        policy_from_dict({"kind": "lru", "budgett": 10})
    assert "budgett" in _fields(e.value)


@pytest.mark.parametrize(
    "cls, field, value",
    [
        (Seed002Config, "n", 0),
        (Seed002Config, "n", -1),
        (Seed002Config, "min_size", -1),
        (Seed001Config, "decay_ns", 0),
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
    p = Seed002Config()
    assert p.n == 4 and p.min_size == 128 * 1024
    with pytest.raises(ValidationError):
        p.n = 5  # type: ignore[misc]
    for kind in POLICY_KINDS:
        assert policy_from_dict({"kind": kind}).kind == kind
    assert isinstance(policy_from_dict({"kind": "seed002", "n": 8}), Seed002Config)
    with pytest.raises(ValidationError):
        policy_from_dict({"kind": "nope"})


def test_guided_modes():
    assert GuidedConfig().mode == "priority" and GuidedConfig().label == "guided"
    g = policy_from_dict({"kind": "guided", "mode": "admit", "horizons": [16, 256]})
    assert g.mode == "admit" and g.label == "guided_admit" and g.horizons == (16, 256)
