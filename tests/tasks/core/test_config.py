"""Configs: strict models over YAML; errors name the file and the field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tasks.core.config import ConfigError, StrictModel, load_config


class Example(StrictModel):
    name: str
    epochs: int = 3


def test_valid_config_loads(tmp_path):
    p = tmp_path / "ok.yaml"
    p.write_text("name: a\nepochs: 5\n")
    assert load_config(Example, p) == Example(name="a", epochs=5)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("name: a\nepoch: 5\n", "epoch: Extra inputs are not permitted"),
        ("name: a\nepochs: many\n", "epochs:"),
        ("epochs: 1\n", "name: Field required"),
        ("- a\n- b\n", "expected a mapping"),
        ("name: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_config_names_file_and_field(tmp_path, text, fragment):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(Example, p)
    assert str(p) in str(err.value) and fragment in str(err.value)


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(Example, tmp_path / "none.yaml")


def test_configs_are_frozen():
    e = Example(name="x")
    with pytest.raises(ValidationError, match="frozen"):
        e.epochs = 9  # type: ignore[misc]
