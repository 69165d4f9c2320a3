"""A training bundle: exported from a data root, read back as it was written, trained elsewhere
with the same scores as the night's own evaluation, and refused with a line when it is not one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("keras")

from cli.main import main  # noqa: E402
from tasks.learning.evaluate import UNSEEN_RUNS  # noqa: E402
from tasks.learning.nextcall.bundle import BundleError, read_bundle, train_bundle, write_bundle  # noqa: E402
from tasks.learning.nextcall.training import export_bundle, score_model_on_unseen_runs  # noqa: E402
from tasks.learning.scores import MODEL, OVERALL  # noqa: E402
from tasks.learning.split import load_split  # noqa: E402
from tests.tasks.learning.tiny_training import tiny_train_config  # noqa: E402

PROJECT = Path(__file__).resolve().parents[4]

# the test marked `backends` (a bundle trained here) runs under every Keras backend (`make test`:
# TensorFlow, then JAX); the others run once (the two-device training's child is JAX whatever the
# pass, and the refusals are backend-free)
pytestmark = pytest.mark.slow


def _cfg(tmp_path):
    return tiny_train_config(
        tmp_path / "ckpt", model={"units": [8], "ngram_features": True, "online_features": True}
    )


@pytest.mark.backends
def test_a_bundle_reads_back_as_written_and_trains_to_the_nights_scores(events_root, tmp_path):
    # GIVEN a bundle exported from the data root (n-gram table, both feature columns)
    cfg = _cfg(tmp_path)
    size, written = export_bundle(events_root, cfg, tmp_path / "b.npz")
    back = read_bundle(tmp_path / "b.npz")
    # THEN every array and the config come back as they were
    assert 0 < size < 48 << 20
    assert back.config == cfg and back.source == events_root.url
    w, b = written.inputs, back.inputs
    for name in ("train_run", "val_run"):
        assert np.array_equal(getattr(w, name).tokens, getattr(b, name).tokens)
        assert np.array_equal(getattr(w, name).offsets, getattr(b, name).offsets)
    assert np.array_equal(w.train_feats, b.train_feats) and w.train_feats.shape[1] == 8
    assert np.array_equal(w.table.keys, b.table.keys) and w.table.max_order == b.table.max_order
    assert [(r.workload, r.run) for r in back.evaluation] == [
        (r.workload, r.run) for r in written.evaluation
    ]
    # WHEN it is trained from the file alone
    result = train_bundle(back, tmp_path / "trained", verbose=0)
    # THEN the result says where, how fast and how well, and its scores are the night's scoring
    # of the saved model on the same runs
    saved = json.loads((tmp_path / "trained" / "result.json").read_text())
    assert saved["placement"]["backend"] and saved["positions_per_second"] > 0
    import keras

    model = keras.saving.load_model(tmp_path / "trained" / "model.keras")
    night = score_model_on_unseen_runs(model, cfg, load_split(events_root, cfg.data))
    assert result["unseen_runs"][OVERALL]["top1"] == pytest.approx(
        night.get(MODEL, OVERALL, UNSEEN_RUNS).top1, abs=1e-9
    )
    assert (
        result["unseen_runs"][OVERALL]["positions"]
        == night.get(MODEL, OVERALL, UNSEEN_RUNS).positions
    )


def test_what_is_not_a_bundle_is_refused_naming_the_file(tmp_path, capsys):
    with pytest.raises(BundleError, match="no such file"):
        read_bundle(tmp_path / "missing.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(BundleError, match=r"junk.npz: does not look like a training bundle"):
        read_bundle(tmp_path / "junk.npz")
    # the CLI says the same in one line, and --help runs nothing
    assert main(["bundle", "train", str(tmp_path / "junk.npz"), "-o", str(tmp_path / "o")]) == 1
    assert "junk.npz: does not look like a training bundle" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    with pytest.raises(SystemExit) as e:
        main(["bundle", "export", "--help"])
    assert e.value.code == 0 and not (tmp_path / "bundle.npz").exists()


def test_a_bundle_too_large_to_carry_is_removed_and_says_what_to_lower(events_root, tmp_path):
    cfg = _cfg(tmp_path)
    _, bundle = export_bundle(events_root, cfg, tmp_path / "b.npz")
    with pytest.raises(BundleError, match=r"over the 0 MiB .* lower data.max_train_tokens"):
        write_bundle(bundle, tmp_path / "big.npz", max_bytes=1000)
    assert not (tmp_path / "big.npz").exists()


def test_a_bundle_trains_data_parallel_over_two_devices(events_root, tmp_path):
    # GIVEN a bundle and JAX showing two devices (simulated host devices, as two GPUs would be)
    export_bundle(events_root, _cfg(tmp_path), tmp_path / "b.npz")
    env = {
        **os.environ,
        "KERAS_BACKEND": "jax",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
    }
    # WHEN `heapcast bundle train` runs there
    child = subprocess.run(
        [sys.executable, "-m", "cli.main", "bundle", "train", str(tmp_path / "b.npz"),
         "-o", str(tmp_path / "two"), "--set", "epochs=1"],
        env=env, capture_output=True, text=True, timeout=600, cwd=PROJECT,
    )  # fmt: skip
    # THEN each step was split over both and the model was scored
    assert child.returncode == 0, child.stderr[-3000:]
    result = json.loads((tmp_path / "two" / "result.json").read_text())
    assert result["placement"]["backend"] == "jax" and result["placement"]["replicas"] == "2"
    assert result["epochs"] == 1 and 0 <= result["unseen_runs"][OVERALL]["top1"] <= 1
    assert "heapcast bundle: trained on jax (cpu" in child.stdout
