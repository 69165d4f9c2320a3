"""A training SIGKILLed mid-epoch, for real, resumes from its checkpoint on the next run.

GIVEN a tiny training of three epochs on synthetic events
WHEN  the process training it is SIGKILLed in the middle of an epoch (no callback, no `finally`)
THEN  the next `train` resumes at the epoch that was cut short (from the last epoch's backup),
      its curves hold every epoch once, and the outcome says it resumed; a kill before the
      first backup, or one that tore the backup while it was being written, starts over.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("keras")

from tasks.core.storage import Root  # noqa: E402
from tasks.dataset.synthetic_events import write_synthetic_events  # noqa: E402
from tasks.learning.nextcall.training import checkpoint_dir  # noqa: E402
from tasks.learning.split import load_split  # noqa: E402
from tasks.learning.train import train  # noqa: E402
from tasks.learning.train_config import TrainConfig  # noqa: E402
from tasks.replay.workloads import load_catalog  # noqa: E402
from tests.faults import kill_at_marker  # noqa: E402
from tests.tasks.learning.tiny_training import tiny_train_config  # noqa: E402

# training in killed subprocesses: left out of the quick tier
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def events_root(tmp_path_factory) -> Root:
    root = Root.from_url(str(tmp_path_factory.mktemp("killed-events")))
    write_synthetic_events(root, {"alpha": 3, "beta": 2}, tokens_per_run=3000)
    return root


def tiny(tmp_path: Path) -> TrainConfig:
    """Three epochs of four steps (a kill can land mid-epoch with a backup behind it), every
    workload trained on."""
    return tiny_train_config(
        tmp_path / "ckpt",
        data={"heldout_workloads": [], "heldout_programs": []},
        epochs=3,
        steps_per_epoch=4,
    )


CHILD_TRAINS = """
    import keras
    from tasks.core.storage import Root
    from tasks.learning.train import train
    from tasks.learning.train_config import TrainConfig
    from tasks.replay.workloads import load_catalog

    class KilledMidEpoch(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if (self.epoch, batch) == ({epoch}, {batch}):
                pause_here({marker!r})

    TORN = {torn!r}
    if TORN:  # killed while writing the second epoch's backup: half of one file written
        original_save = keras.callbacks.BackupAndRestore._save_model

        def save(self):
            original_save(self)
            if self._current_epoch == 2:
                name = "latest.weights.h5" if TORN == "weights" else "training_metadata.json"
                path = os.path.join(self.backup_dir, name)
                data = open(path, "rb").read()
                with open(path, "wb") as f:
                    f.write(data[: len(data) // 2])
                pause_here({marker!r})

        keras.callbacks.BackupAndRestore._save_model = save

    cfg = TrainConfig.model_validate_json({config!r})
    train.fn(Root.from_url({root!r}), cfg, load_catalog(cfg.data.catalog), callbacks=[KilledMidEpoch()])
"""


def kill_training(
    tmp_path: Path, root: Root, cfg: TrainConfig, epoch: int, batch: int, torn: str | None = None
) -> None:
    """A child process runs the `train` task and is SIGKILLed after batch `batch` of `epoch`
    (torn: while writing the second epoch's backup, "weights" or "metadata", instead)."""
    marker = tmp_path / f"killed-{epoch}-{batch}-{torn}"
    code = CHILD_TRAINS.format(
        epoch=-1 if torn else epoch,
        batch=batch,
        marker=str(marker),
        config=cfg.model_dump_json(),
        root=root.url,
        torn=torn,
    )
    kill_at_marker(code, marker)


class Epochs:
    """A Keras callback recording the epochs a training runs."""

    def __new__(cls):
        import keras

        class _Epochs(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.seen: list[int] = []

            def on_epoch_begin(self, epoch, logs=None):
                self.seen.append(epoch)

        return _Epochs()


# the checkpoint a backend writes is the one it resumes from: under every Keras backend (`make
# test`: TensorFlow, then JAX); a kill before any backup (nothing to resume from) and a torn
# backup (below) are file-level facts, checked once
@pytest.mark.parametrize(
    ("epoch", "resumes_at"), [pytest.param(1, 1, marks=pytest.mark.backends), (0, 0)]
)
def test_a_training_killed_mid_epoch_resumes_from_its_checkpoint(
    events_root, tmp_path, epoch, resumes_at
):
    cfg = tiny(tmp_path)
    ckpt = checkpoint_dir(events_root, cfg, load_split(events_root, cfg.data))
    # WHEN the process training it is SIGKILLed after the second batch of `epoch`
    kill_training(tmp_path, events_root, cfg, epoch=epoch, batch=1)
    backup = ckpt / "backup" / "training_metadata.json"
    if epoch:
        assert json.loads(backup.read_text())["epoch"] == epoch  # the last epoch's backup
    else:
        assert not backup.exists()  # killed before any backup
    # THEN the next run resumes at the epoch that was cut short and completes
    epochs = Epochs()
    trained = train.fn(events_root, cfg, load_catalog(cfg.data.catalog), callbacks=[epochs])
    assert epochs.seen == list(range(resumes_at, 3))
    assert trained.initial_epoch == resumes_at
    assert len(trained.history["loss"]) == 3  # every epoch's curve point once
    resumed = [n for n in trained.notes if n.startswith("resumed a killed training")]
    assert resumed == ([f"resumed a killed training at epoch 2 from {ckpt}"] if epoch else [])
    assert not (ckpt / "backup").exists()  # a finished training leaves no backup behind


@pytest.mark.parametrize("torn", ["weights", "metadata"])
def test_a_training_killed_while_writing_its_backup_starts_over(events_root, tmp_path, torn):
    cfg = tiny(tmp_path)
    ckpt = checkpoint_dir(events_root, cfg, load_split(events_root, cfg.data))
    # WHEN the process is SIGKILLed half-way through writing the second epoch's backup
    kill_training(tmp_path, events_root, cfg, epoch=1, batch=0, torn=torn)
    assert (ckpt / "backup").exists()
    # THEN the next run cannot resume from it (Keras would fail on it every night): it discards
    # it, trains from the first epoch, completes, and says so
    epochs = Epochs()
    trained = train.fn(events_root, cfg, load_catalog(cfg.data.catalog), callbacks=[epochs])
    assert epochs.seen == [0, 1, 2] and trained.initial_epoch == 0
    assert len(trained.history["loss"]) == 3
    assert any(n.startswith("discarded the unreadable backup") for n in trained.notes)
