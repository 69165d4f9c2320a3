"""heapcast_keras: the start-up hook that lets a fresh Python load heapcast's Keras models.

GIVEN the hook installed (scripts/setup.sh's .pth line runs at every start-up)
WHEN  a fresh Python starts, imports Keras and looks names up in Keras' registry
THEN  start-up imports nothing of Keras or heapcast; the hook leaves the import path once it
      swapped the registry; a look-up of another package's name
      imports nothing of heapcast; the first look-up of a heapcast name imports the layers'
      module and finds the class; a layers module that fails to import is not retried and
      Keras' own "not found" answer stands.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import heapcast_keras

# run under every Keras backend (`make test`: TensorFlow, then JAX)
pytestmark = [pytest.mark.backends, pytest.mark.slow]

CHECK = """
import sys
assert "keras" not in sys.modules and "heapcast_keras" in sys.modules, sorted(sys.modules)
from keras.src.saving import object_registration as reg
import pytest

import heapcast_keras
assert isinstance(reg.GLOBAL_CUSTOM_OBJECTS, heapcast_keras.LazyRegistry)
assert not any(isinstance(f, heapcast_keras._RegistryHook) for f in sys.meta_path)  # one-shot
assert reg.get_registered_object("other>Thing") is None
assert "tasks.learning.nextcall.model" not in sys.modules
found = reg.get_registered_object("heapcast>NGramFeatures")
print(found.__module__, found.__name__)
"""


def test_a_fresh_python_finds_heapcast_layers_on_first_look_up():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "tasks.learning.nextcall.model NGramFeatures"


def test_a_failing_layers_module_is_tried_once_and_keras_answers(monkeypatch):
    monkeypatch.setattr(heapcast_keras, "LAYERS_MODULE", "tasks.no_such_module")
    monkeypatch.setattr(heapcast_keras.LazyRegistry, "tried", False)
    registry = heapcast_keras.LazyRegistry({"keras>Dense": object})
    assert "heapcast>NGramFeatures" not in registry
    assert heapcast_keras.LazyRegistry.tried
    assert registry.get("heapcast>OnlineOrders") is None
    assert "keras>Dense" in registry
