"""One model on every backend: a model saved on one loads and answers the same on the other, a
step split over two devices is the step on one, and what cannot run says what to do.

The other backend runs in a child process (Keras picks its backend once per process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

# the tests marked `backends` run under every Keras backend (`make test`: TensorFlow, then JAX):
# a model saved here loads there, whichever is here; the others run once (the two-device step's
# child is JAX whatever the pass, and the rest is backend-free)
pytestmark = pytest.mark.slow

keras = pytest.importorskip("keras")

from tasks.learning.nextcall.backend import out_of_memory, precision_for  # noqa: E402
from tasks.learning.nextcall.fitting import TrainingOutOfMemory, _fit  # noqa: E402
from tasks.learning.train_config import TrainConfig  # noqa: E402

PROJECT = Path(__file__).resolve().parents[4]
HERE = keras.backend.backend()
OTHER = "jax" if HERE == "tensorflow" else "tensorflow"


def _child(code: str, backend: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=PROJECT,
        env={**os.environ, "KERAS_BACKEND": backend, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


def _hybrid(tmp_path: Path):
    """A small n-gram + online hybrid (orders past 9 take the hashed keys), its inputs, saved."""
    from tasks.learning.nextcall.model import NGramTable, build_hybrid

    rng = np.random.default_rng(5)
    tokens = rng.integers(0, 8, 400).astype(np.uint8)
    pos = np.concatenate([np.arange(250), np.arange(150)])
    table = NGramTable.fit(tokens, pos, 12)
    cfg = TrainConfig.model_validate(
        {
            "context": 6,
            "model": {
                "units": [8, 4],
                "ngram_features": True,
                "ngram_order": 12,
                "online_features": True,
            },
        }
    )
    _, full = build_hybrid(cfg, table)
    x = {
        "tokens": rng.integers(0, 8, (3, 30)).astype(np.int32),
        "online": rng.integers(0, 4, (3, 30, 4)).astype(np.int32),
    }
    path = tmp_path / "hybrid.keras"
    full.save(path)
    np.savez(tmp_path / "x.npz", **x)
    return full, x, path


@pytest.mark.backends
def test_a_model_saved_on_one_backend_answers_the_same_on_the_other(tmp_path):
    # GIVEN a hybrid saved here (its n-gram table, 62-bit keys, inside as weights)
    full, x, path = _hybrid(tmp_path)
    here = full.predict(x, verbose=0)
    np.save(tmp_path / "here.npy", here)
    # WHEN the other backend loads it with nothing of heapcast imported first, and predicts
    code = f"""
import numpy as np, keras
m = keras.saving.load_model({str(path)!r})
x = dict(np.load({str(tmp_path / "x.npz")!r}))
np.save({str(tmp_path / "there.npy")!r}, np.asarray(m.predict(x, verbose=0)))
print(keras.backend.backend())
"""
    child = _child(code, OTHER)
    assert child.returncode == 0, child.stderr[-3000:]
    # THEN it ran there and gave the same probabilities
    assert child.stdout.split()[-1] == OTHER
    there = np.load(tmp_path / "there.npy")
    assert np.allclose(there, here, atol=1e-5), np.abs(there - here).max()


def test_a_backend_not_installed_is_one_line_saying_what_to_install():
    child = _child("import tasks.learning.nextcall.model", "torch")
    assert child.returncode != 0
    last = child.stderr.strip().splitlines()[-1]
    assert "BackendUnavailable: KERAS_BACKEND=torch: torch is not installed" in last
    assert "pip install torch" in last and "unset KERAS_BACKEND" in last
    child = _child("import tasks.learning.nextcall.model", "numpy")
    assert "KERAS_BACKEND=numpy: not a backend heapcast runs on" in child.stderr


def test_precision_suits_the_chip():
    assert precision_for([]) == "float32"
    assert precision_for([("NVIDIA H200", 9.0)]) == "mixed_bfloat16"
    assert precision_for([("NVIDIA A100", 8.0), ("NVIDIA A100", 8.0)]) == "mixed_bfloat16"
    assert precision_for([("Tesla T4", 7.5)]) == "mixed_float16"


def test_a_gpu_out_of_memory_names_the_batch_size_to_lower():
    from tasks.learning.nextcall.backend import Placement

    class Exhausted:
        def fit(self, *a, **k):
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 9 GB")

    cfg = TrainConfig.model_validate({"batch_size": 128, "gpu_batch_size": 4096})
    gpu = Placement("jax", "gpu: NVIDIA H200", 1, "mixed_bfloat16")
    with pytest.raises(TrainingOutOfMemory, match="at batch size 4096 .* lower gpu_batch_size"):
        _fit(Exhausted(), None, None, cfg, gpu, 4096, 409600, 0, [])
    assert out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not out_of_memory(ValueError("Input 0 of layer gru is incompatible"))

    class Broken:
        def fit(self, *a, **k):
            raise ValueError("Input 0 of layer gru is incompatible")

    with pytest.raises(ValueError, match="incompatible"):  # anything else passes unchanged
        _fit(Broken(), None, None, cfg, gpu, 4096, 409600, 0, [])


DATA_PARALLEL_STEP = """
import json, numpy as np, keras
from tasks.learning.nextcall.backend import data_parallel, placement
from tasks.learning.nextcall.model import build_model
from tasks.learning.train_config import TrainConfig

where = placement()
cfg = TrainConfig.model_validate({"context": 6, "model": {"kind": "gru", "units": [8, 4]},
                                  "batch_size": 8, "learning_rate": 0.05})
rng = np.random.default_rng(0)
x = rng.integers(0, 9, (8, 6)).astype("int32")
y = rng.integers(0, 9, (8, 6)).astype("int32")
keras.utils.set_random_seed(1)
one = build_model(cfg)
start = one.get_weights()
one.train_on_batch(x, y)
with data_parallel(where, 8):
    two = build_model(cfg)
    two.set_weights(start)
    two.train_on_batch(x, y)
    sharding = str(two.trainable_weights[0].value.sharding)
a, b = one.get_weights(), two.get_weights()
print(json.dumps({"replicas": where.replicas, "sharding": sharding,
                  "moved": max(float(np.abs(w - s).max()) for w, s in zip(a, start)),
                  "diff": max(float(np.abs(u - v).max()) for u, v in zip(a, b))}))
try:
    data_parallel(where, 7)
except ValueError as e:
    print(e)
"""


def test_a_step_split_over_two_devices_is_the_step_on_one():
    # GIVEN JAX with two simulated host devices (as a machine with two GPUs has two)
    child = _child(DATA_PARALLEL_STEP, "jax", XLA_FLAGS="--xla_force_host_platform_device_count=2")
    assert child.returncode == 0, child.stderr[-3000:]
    facts = json.loads(child.stdout.splitlines()[-2])
    # THEN training spreads over both, and one step there moves the weights as on one device
    assert facts["replicas"] == 2 and "2" in facts["sharding"]
    assert facts["moved"] > 1e-3
    assert facts["diff"] < 1e-5
    # and a batch that does not split evenly is refused with the sizes that would
    assert "batch size 7 does not split over 2 devices: use 6 or 8" in child.stdout.splitlines()[-1]


@pytest.mark.backends
def test_a_model_saved_before_the_backends_loads_and_answers_as_it_did():
    # GIVEN a hybrid (n-gram orders to 12, online features, copy paths) saved by heapcast before
    # the model was backend-neutral (commit 493191d, TensorFlow), with what it predicted then
    data = Path(__file__).parent / "fixtures"
    then = np.load(data / "hybrid_before_backends.npz")
    # WHEN this backend loads it (the registry's old versions are such files)
    model = keras.saving.load_model(data / "hybrid_before_backends.keras")
    now = model.predict({"tokens": then["tokens"], "online": then["online"]}, verbose=0)
    # THEN it answers as it did
    assert np.allclose(now, then["probs"], atol=1e-5), np.abs(now - then["probs"]).max()
