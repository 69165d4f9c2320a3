"""Registration prints nothing of MLflow's own per version (tasks/registry/register.py).

GIVEN a real embedded MLflow store and a tiny real Keras model
WHEN  two versions of the model are registered (the second: "already exists")
THEN  stderr holds neither "Registered model ... already exists" nor "Created version", while
      another line MLflow's event stream writes during the same call still passes.
"""

from __future__ import annotations

import pytest

from tasks.registry import register
from tasks.registry.register import register_outcome
from tasks.registry.tracking import TrackingConfig
from tests.tasks.registry.outcome_factory import make_outcome, tiny_model

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow


def test_registering_twice_prints_no_mlflow_version_lines(tmp_path, capfd):
    tracking = TrackingConfig(root=str(tmp_path / "store"))
    first = register_outcome(make_outcome(tiny_model(0), 0.80, seed=0), tracking)
    second = register_outcome(make_outcome(tiny_model(1), 0.85, seed=1), tracking)
    assert (first.model_version, second.model_version) == ("1", "2")
    err = capfd.readouterr().err
    assert "Created version" not in err and "already exists" not in err, err[-2000:]


def test_other_lines_of_the_stream_pass(capfd):
    from mlflow.utils.logging_utils import eprint

    with register.registry_lines_dropped():
        eprint("Created version '3' of model 'm'.")
        eprint("a line kept")
    eprint("Created version '4' of model 'm'.")  # outside: MLflow's own behaviour
    err = capfd.readouterr().err
    assert err == "a line kept\nCreated version '4' of model 'm'.\n"
