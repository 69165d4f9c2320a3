"""A registered model, loaded by a fresh process the ways a user loads it.

GIVEN the hybrid model (its n-gram table in a custom Keras layer) registered as the champion
WHEN  a fresh Python, which imported nothing of heapcast, loads it with the bare
      mlflow.keras.load_model("models:/...@champion"); another through
      tasks.registry.champion.load_version; another through pyfunc, predicting 3 times
THEN  both Keras ways give the Keras model (no "Could not locate class 'NGramFeatures'"), all
      predict what the model predicted when it was trained, and nothing is printed per predict
      (no Keras progress bar). Without heapcast's start-up hook (python -S skips .pth files)
      the bare load fails as Keras does: the hook is what makes it work.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from tests.tasks.registry.outcome_factory import CONTEXT, make_outcome

# run under every Keras backend (`make test`: TensorFlow, then JAX)
pytestmark = [pytest.mark.backends, pytest.mark.slow]

# Each in a fresh process: loading through pyfunc imports the layers' module.
PRELUDE = """
import sys
import numpy as np
import mlflow

mlflow.set_tracking_uri({uri!r})
mlflow.set_registry_uri({uri!r})
x, y = np.load({x!r}), np.load({y!r})
"""
BARE_KERAS = """
import mlflow.keras

assert not {{m.split(".")[0] for m in sys.modules}} & {{"tasks", "cli", "flows"}}, "heapcast imported"
model = mlflow.keras.load_model("models:/{name}@champion")
print("bare", "same" if np.allclose(model.predict(x, verbose=0), y, atol=1e-5) else "differs")
"""
LOAD_VERSION = """
from tasks.registry.champion import load_version

assert "tasks.learning.nextcall.model" not in sys.modules, "the test must start without the layers"
model = load_version({name!r}, "1")
print("load_version", "same" if np.allclose(model.predict(x, verbose=0), y, atol=1e-5) else "differs")
"""
PYFUNC = """
import mlflow.pyfunc

pyfunc_model = mlflow.pyfunc.load_model("models:/{name}@champion")
print("BEGIN PREDICTS", flush=True)
answers = [np.asarray(pyfunc_model.predict(x)) for _ in range(3)]
sys.stdout.flush()
print("END PREDICTS")
print("pyfunc", "same" if all(np.allclose(a, y, atol=1e-5) for a in answers) else "differs")
"""


@pytest.fixture(scope="module")
def fresh_load(tmp_path_factory):
    """The fresh processes' output ({"load_version": ..., "pyfunc": ...}), after the hybrid
    model was registered."""
    from tasks.learning.nextcall.model import NGramTable, build_hybrid
    from tasks.registry.register import register_outcome
    from tasks.registry.tracking import TrackingConfig, resolve_target
    from tests.tasks.learning.nextcall.test_model import _flat, _threads, tiny

    tmp_path = tmp_path_factory.mktemp("fresh-load")
    rng = np.random.default_rng(5)
    table = NGramTable.fit(*_flat(_threads(rng, 2, 80, 6)), 3)
    _, hybrid = build_hybrid(
        tiny(model={"units": [8], "ngram_features": True, "ngram_order": 3}), table
    )
    tracking = TrackingConfig(root=str(tmp_path / "root"))
    assert register_outcome(make_outcome(hybrid, 0.9), tracking).promoted
    x = np.asarray(_threads(rng, 2, CONTEXT, 6), np.int32)  # the logged signature's shape
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", hybrid.predict(x, verbose=0))
    names = {
        "uri": resolve_target(tracking).tracking_uri,
        "x": str(tmp_path / "x.npy"),
        "y": str(tmp_path / "y.npy"),
        "name": tracking.model_name,
    }
    ways = {
        way: ([sys.executable, "-c", (PRELUDE + code).format(**names)])
        for way, code in (
            ("bare", BARE_KERAS),
            ("load_version", LOAD_VERSION),
            ("pyfunc", PYFUNC),
        )
    }
    # the same bare load with no site hooks: -S skips site-packages' .pth lines, so the
    # environment's packages come back through PYTHONPATH
    paths = subprocess.run(
        [sys.executable, "-c", "import sys, os; print(os.pathsep.join(p for p in sys.path if p))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ways["bare_without_hook"] = [sys.executable, "-S", *ways["bare"][1:]]
    env = {"without": {**os.environ, "PYTHONPATH": paths}}
    return {
        way: subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env=env["without"] if way == "bare_without_hook" else None,
        )
        for way, argv in ways.items()
    }


def test_bare_mlflow_keras_load_model_works_in_a_fresh_process(fresh_load):
    out = fresh_load["bare"]
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "bare same"


def test_without_the_start_up_hook_keras_cannot_find_the_layers(fresh_load):
    out = fresh_load["bare_without_hook"]
    assert out.returncode != 0
    assert "Could not locate class" in out.stderr


def test_load_version_loads_the_keras_model_in_a_fresh_process(fresh_load):
    out = fresh_load["load_version"]
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "load_version same"


def test_pyfunc_predict_prints_no_progress_bar(fresh_load):
    out = fresh_load["pyfunc"]
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "pyfunc same"
    during = out.stdout.split("BEGIN PREDICTS\n", 1)[1].split("END PREDICTS", 1)[0]
    assert during == ""
    assert "step" not in out.stderr and "\u2501" not in out.stderr
