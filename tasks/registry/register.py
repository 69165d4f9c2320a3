"""Register a trained model in MLflow: params, metrics, plots, the model, and the champion alias.

Metrics: `headline/...` (tasks/registry/headline.py), `log_loss/...`, `train/...`,
`promotion/...` (tasks/registry/champion.py); the detail in tables, `evaluation/<table>.json`.
Params: `config.<dotted path>`, `dataset.*`, `code.*`, `lib.*`. Artifacts: plots, evaluation
tables, config.json, the heap report of the first training run (handed in as a file). The
version's description and tags (`heapcast.decision`, ...) say what it is. Every name:
docs/pipeline.md#what-a-registration-logs.

Retries, kills and concurrent registrations are safe: see "faults" below (one run and one
version per trained model; a registration that never finished leaves no version behind), and
tasks/registry/champion.py for the alias.

`register` (the Prefect task) returns a `RegisteredModel` (tasks.learning.outcome): the version,
its run, the runs it was evaluated on and the decision, which the stages after it take.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import platform
import re
import socket
import subprocess
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from PIL import Image
from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.core.config import PROJECT_DIR
from tasks.learning import plots
from tasks.learning.evaluate import TABLES, evaluation_markdown
from tasks.learning.nextcall.hedge import HEDGE_ARTIFACT, hedge_settings
from tasks.learning.nextcall.training import score_model_on_unseen_runs
from tasks.learning.outcome import DatasetRef, RegisteredModel, TrainOutcome
from tasks.learning.scores import BASELINES, MODEL, OVERALL, Evaluation
from tasks.learning.train_config import TrainConfig
from tasks.registry import champion as champion_rules
from tasks.registry import headline
from tasks.registry.answer_artifacts import log_answers
from tasks.registry.question_artifacts import log_questions
from tasks.registry.tracking import CHAMPION_ALIAS, TrackingConfig, configure, store_lock

PREDICTORS = (MODEL, *BASELINES)
DATASET_NAME = "heapcast-events"


# ----------------------------------------------------------------------------- metric names


def curve_key(name: str) -> str:
    return "train/" + re.sub(r"[^A-Za-z0-9_./ -]", "_", name)


# ----------------------------------------------------------------------------- params


def flatten_params(obj: Any, prefix: str) -> dict[str, str]:
    """A nested config as dotted MLflow params; lists and scalars as JSON, strings as they are."""
    out: dict[str, str] = {}
    if isinstance(obj, dict) and obj:
        for k, v in obj.items():
            out.update(flatten_params(v, f"{prefix}.{k}"))
        return out
    value = obj if isinstance(obj, str) else json.dumps(obj, default=str, sort_keys=True)
    out[prefix[:250]] = value[:6000]
    return out


def git_commit(project_dir: Path = PROJECT_DIR) -> tuple[str, bool]:
    """(commit, dirty) of the code being run; ("unknown", False) outside a git checkout."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=project_dir,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=project_dir,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return commit, bool(status.strip())
    except (OSError, subprocess.CalledProcessError):
        return "unknown", False


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def library_versions() -> dict[str, str]:
    """Versions of what shapes a model's numbers (read from metadata, nothing imported)."""
    out = {"python": platform.python_version()}
    for dist in (
        "tensorflow",
        "tensorflow-cpu",
        "keras",
        "jax",
        "torch",
        "numpy",
        "pyarrow",
        "pandas",
        "dask",
        "mlflow",
        "prefect",
    ):
        v = _version(dist)
        if v:
            out[dist] = v
    return out


def model_pip_requirements() -> list[str]:
    """Explicit requirements of a logged model (inferring them costs ~15 s per log_model)."""
    # deferred: imported on first use, for start-up time
    import keras

    backend = keras.backend.backend()
    if backend == "tensorflow":
        dists = ["tensorflow" if _version("tensorflow") else "tensorflow-cpu"]
    else:
        dists = {"jax": ["jax", "jaxlib"], "torch": ["torch"]}.get(backend, [])
    dists += ["keras", "numpy", "mlflow"]
    return [f"{d}=={_version(d)}" for d in dists if _version(d)]


def dataset_params(outcome: TrainOutcome) -> dict[str, str]:
    d = outcome.dataset
    workloads = sorted({w for w, _ in (*d.train_runs, *d.eval_runs)})
    heldout = sorted({w for w, _ in d.heldout_runs})
    unseen_programs = sorted({w for w, _ in d.unseen_program_runs})
    runs = lambda rs: ",".join(f"{w}/{r}" for w, r in rs)  # noqa: E731
    return {
        "dataset.root": d.root.url,
        "dataset.content_hash": d.content_hash,
        "dataset.workloads": ",".join(workloads),
        "dataset.heldout_workloads": ",".join(heldout),
        "dataset.unseen_program_workloads": ",".join(unseen_programs),
        "dataset.train_runs": runs(d.train_runs)[:6000],
        "dataset.eval_runs": runs(d.eval_runs)[:6000],
        "dataset.heldout_runs": runs(d.heldout_runs)[:6000],
        # the runs the whatif stage replays by default (tasks/whatif/night.py) include these
        "dataset.unseen_program_runs": runs(d.unseen_program_runs)[:6000],
        "dataset.validation_runs": runs(getattr(d, "validation_runs", ()))[:6000],
        "dataset.train_events": str(d.train_tokens),
        "dataset.eval_events": str(d.eval_tokens),
    }


def run_params(outcome: TrainOutcome) -> dict[str, str]:
    params = flatten_params(outcome.config, "config")
    params.update(dataset_params(outcome))
    commit, dirty = git_commit()
    params["code.git_commit"] = commit
    params["code.git_dirty"] = str(dirty).lower()
    params.update({f"lib.{k}": v for k, v in library_versions().items()})
    params.update({f"train.{k}": v for k, v in (getattr(outcome, "placement", None) or {}).items()})
    for s in outcome.evaluation.scores:
        if s.slice == OVERALL and s.table == "unseen_runs":
            for k, v in s.detail.items():
                params[f"predictor.{s.predictor}.{k}"[:250]] = str(v)[:6000]
    return params


# ----------------------------------------------------------------------------- tables, plots


def evaluation_rows(evaluation: Evaluation) -> list[dict[str, Any]]:
    """One row per (table, slice, predictor): the evaluation table."""
    order = {p: i for i, p in enumerate(PREDICTORS)}
    rows = []
    for s in sorted(
        evaluation.scores,
        key=lambda s: (
            TABLES.index(s.table) if s.table in TABLES else 9,
            s.slice != OVERALL,
            s.slice,
            order.get(s.predictor, 9),
        ),
    ):
        rows.append(
            {
                "table": s.table,
                "slice": s.slice,
                "predictor": s.predictor,
                "positions": int(s.positions),
                "top1": float(s.top1),
                "top5": float(s.top5),
                "log_loss": float(s.log_loss),
                "detail": json.dumps(s.detail, default=str, sort_keys=True),
            }
        )
    return rows


def write_evaluation_tables(evaluation: Evaluation, folder: Path) -> list[Path]:
    """evaluation.csv, evaluation.json, evaluation.md and per_class_accuracy.csv in `folder`."""

    folder.mkdir(parents=True, exist_ok=True)
    rows = evaluation_rows(evaluation)
    cols = ["table", "slice", "predictor", "positions", "top1", "top5", "log_loss", "detail"]
    with open(folder / "evaluation.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    (folder / "evaluation.json").write_text(json.dumps(rows, indent=1, allow_nan=True))
    # The same tables a person reads in the Prefect artifacts and the nightly summary.
    (folder / "evaluation.md").write_text(evaluation_markdown(evaluation))
    with open(folder / "per_class_accuracy.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["table", "slice", "predictor", *[f"t{t}" for t in range(64)]])
        for s in evaluation.scores:
            acc = np.asarray(s.per_class_accuracy, dtype=np.float64)
            w.writerow(
                [s.table, s.slice, s.predictor, *("" if np.isnan(a) else f"{a:.6f}" for a in acc)]
            )
    np.savetxt(
        folder / "confusion.csv",
        np.asarray(evaluation.confusion, dtype=np.int64),
        fmt="%d",
        delimiter=",",
    )
    return sorted(folder.iterdir())


def write_plots(outcome: TrainOutcome, folder: Path) -> dict[str, Path]:
    """The four PNGs, keyed by their image key."""

    ev = outcome.evaluation
    per_class = {}
    for p in PREDICTORS:
        try:
            per_class[p] = ev.get(p, OVERALL, "unseen_runs").per_class_accuracy
        except KeyError:
            pass
    support = np.asarray(ev.confusion).sum(axis=1)
    return {
        "confusion_matrix": plots.confusion_matrix_png(
            ev.confusion, folder / "confusion_matrix.png"
        ),
        "per_class_accuracy": plots.per_class_accuracy_png(
            per_class, support, folder / "per_class_accuracy.png"
        ),
        "learning_curves": plots.learning_curves_png(
            outcome.history, folder / "learning_curves.png"
        ),
        "token_histogram": plots.token_histogram_png(
            outcome.dataset.token_histogram, folder / "token_histogram.png"
        ),
    }


# ----------------------------------------------------------------------------- registration


@dataclass(frozen=True)
class RegistrationResult:
    """What registration did: where the run is, which version, and whether it took the alias."""

    run_id: str
    experiment_id: str
    model_name: str
    model_version: str
    model_uri: str  # models:/<name>/<version>
    promoted: bool
    champion_version: str | None  # holder of the alias after this registration
    decision: str
    reason: str
    metric: str
    candidate_score: float
    champion_score: float | None
    scores: dict[str, float] = field(default_factory=dict)  # the headline metrics logged


def _dataset_input(outcome: TrainOutcome):
    """The data as an MLflow dataset: one row per (workload, run, split), digest = content hash."""
    # deferred: imported on first use, for start-up time
    import mlflow.data

    d = outcome.dataset
    rows = (
        [(w, r, "train") for w, r in d.train_runs]
        + [(w, r, "eval") for w, r in d.eval_runs]
        + [(w, r, "heldout") for w, r in d.heldout_runs]
        + [(w, r, "unseen_program") for w, r in d.unseen_program_runs]
        + [(w, r, "validation") for w, r in getattr(d, "validation_runs", ())]
    )
    df = pd.DataFrame(rows, columns=["workload", "run", "split"])
    try:
        with (
            warnings.catch_warnings()
        ):  # "can be interpreted in multiple ways": both are local files
            warnings.simplefilter("ignore", UserWarning)
            return mlflow.data.from_pandas(
                df, source=d.root.url, name=DATASET_NAME, digest=d.content_hash[:36]
            )
    except Exception:  # a root URL MLflow has no dataset source for: keep the URL in params only
        return mlflow.data.from_pandas(df, name=DATASET_NAME, digest=d.content_hash[:36])


def _png_as_array(path: Path) -> np.ndarray:

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def log_keras_model(model, **kwargs):
    """`mlflow.keras.log_model`, with the model folder made before the input example is written,
    and pyfunc loading through tasks.registry.keras_pyfunc (custom layers registered first).

    MLflow's Keras flavor writes input_example.json into a folder it has not created yet
    (mlflow/mlflow#16183, open in 3.17): logging with an input example fails with
    FileNotFoundError. The same `Model.log` call mlflow.keras.log_model makes, through a flavor
    whose save_model creates the folder first, keeps the flavor, the signature and the example.
    """

    # deferred: imported on first use, for start-up time
    import mlflow.keras
    from mlflow.models import Model

    class _KerasFlavor:
        __name__ = "mlflow.keras"

        @staticmethod
        def save_model(path, **kw):
            os.makedirs(path, exist_ok=True)
            saved = mlflow.keras.save_model(path=path, **kw)
            # pyfunc loads through tasks.registry.keras_pyfunc, which registers our custom layers first.
            meta = kw.get("mlflow_model")
            if meta is not None and "python_function" in meta.flavors:
                meta.flavors["python_function"]["loader_module"] = "tasks.registry.keras_pyfunc"
                meta.save(os.path.join(path, "MLmodel"))
            return saved

    with registry_lines_dropped():
        return Model.log(
            artifact_path=None,
            name="model",
            flavor=_KerasFlavor,
            flavor_name="mlflow.keras",
            model=model,
            **kwargs,
        )


# What MLflow prints on stderr (its eprint, not a logger) for every version it creates:
# "Registered model 'm' already exists. Creating a new version of this model..." and "Created
# version 'N' of model 'm'." The night says which version it registered, and why, itself.
REGISTRY_LINES = ("Registered model ", "Successfully registered model ", "Created version ")


@contextmanager
def registry_lines_dropped() -> Iterator[None]:
    """Drops REGISTRY_LINES from MLflow's event stream while heapcast logs its model; every
    other line of that stream still passes."""
    # deferred: imported on first use, for start-up time
    from mlflow.utils.logging_utils import MLFLOW_LOGGING_STREAM as stream

    write = stream.write
    after_dropped = False

    def filtered(text: str):
        nonlocal after_dropped
        if text.startswith(REGISTRY_LINES):
            after_dropped = True  # print() writes the line, then its "\n": that goes too
            return
        if after_dropped and text == "\n":
            after_dropped = False
            return
        after_dropped = False
        write(text)

    stream.write = filtered
    try:
        yield
    finally:
        del stream.write  # the class's own write again


# ----------------------------------------------------------------------------- faults
#
# A registration is a run of steps (log the run and the model, which creates the version; log
# the metrics; record the version's evaluation; decide and move the alias; log the decision),
# any of which may fail or be killed. The rules that make it safe to repeat:
#
# - Idempotency: the run carries `heapcast.registration_key`, a hash of what was trained (data
#   content hash, config, evaluation, history, model weights). Registering an outcome whose key
#   is already in the experiment resumes that run instead of logging a second one: a version
#   that exists is finished (the steps after it are each done once, marked on the run); a run
#   that died before its version is closed and the model registered once. A registration that
#   completed returns its result again.
# - Progress: `heapcast.registration` is `started` when the run is created and `complete` at the
#   end; the promotion's decision is written as a run tag right after the alias moves, so a
#   retry never decides twice.
# - One registrar per key: looking for an earlier registration and creating the run happen
#   under a claim (`registration_claim`): the SQLite store's file lock, or on a tracking server
#   (no transactions, no locks) a registered model named `<model>.claim-<key>` that exists only
#   while one process decides (created atomically: the store's unique name refuses a second;
#   deleted when the decision is made). A run of the key still being registered by a live
#   owner is waited for, never resumed beside it (`registration_in_progress`).
# - Owner and lease: the run names its owner (host, boot, pid, process start) and a lease (an
#   epoch-ms deadline), renewed at each step; a failing attempt extends it by ABANDON_AFTER_S,
#   the time its owner's retries have to come back.
# - Abandoned registrations: a `started` run whose owner is known dead (a process of this
#   machine that no longer exists) or whose lease ran out never finishes. The next registration
#   deletes its version (never evaluated against the champion, never promoted), so the registry
#   holds exactly the versions whose registration finished; a version that already took the
#   alias is kept and marked complete. A run owned on another machine is judged by its lease
#   only: this machine cannot see that process, and its retry may still be pending.

TAG_KEY = "heapcast.registration_key"
TAG_STATE = "heapcast.registration"  # started | complete | abandoned
TAG_OWNER = "heapcast.registration_owner"  # host|boot id|pid|process start of the registrar
TAG_METRICS = "heapcast.registration_metrics"  # "logged" once the metrics are in
TAG_DECISION = "heapcast.promotion_decision"  # champion.decision_json, once the alias moved
TAG_LEASE = "heapcast.registration_lease"  # epoch ms until which the owner answers for the run
ABANDON_AFTER_S = 3600  # a failed registration not retried within this is abandoned
# A running registration renews its lease at each step; its longest step (logging the model to
# a slow artifact store) must fit in it.
LEASE_S = 900
# A claim is held only while one process looks for the key's run and creates it (seconds).
CLAIM_LEASE_S = 120
WAIT_POLL_S = 2.0  # how often a registration waiting for another one of its key looks again


class RegistrationRefused(ValueError):
    """The outcome must not be registered (its evaluation is too small to compare honestly)."""


def _model_weights(model: Any) -> list[np.ndarray]:
    try:
        return [np.asarray(w) for w in model.get_weights()]
    except Exception:  # not a Keras model (a stand-in): the other facts still identify it
        return []


def registration_key(outcome: TrainOutcome, model_name: str) -> str:
    """What identifies one trained model: the same outcome (a retry, a process that resumes a
    killed registration) gives the same key; another training, other data or another
    evaluation give another."""
    facts = {
        "model_name": model_name,
        "content_hash": outcome.dataset.content_hash,
        "config": outcome.config,
        "history": outcome.history,
        "scores": [
            (s.table, s.slice, s.predictor, int(s.positions), s.top1, s.top5, s.log_loss)
            for s in outcome.evaluation.scores
        ],
    }
    h = hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode())
    for w in _model_weights(outcome.model):
        h.update(f"{w.dtype}{w.shape}".encode())
        h.update(np.ascontiguousarray(w).tobytes())
    return h.hexdigest()[:32]


def refuse_small_evaluation(outcome: TrainOutcome) -> None:
    """RegistrationRefused when the unseen-runs evaluation has fewer positions than the
    training config's data.min_eval_positions (the train task refuses such data before
    training; this keeps an outcome made elsewhere from taking the alias on a handful of
    positions)."""
    minimum = int((outcome.config.get("data") or {}).get("min_eval_positions") or 0)
    if not minimum:
        return
    try:
        n = int(outcome.evaluation.get(MODEL, OVERALL, champion_rules.UNSEEN).positions)
    except KeyError:
        n = 0
    if n < minimum:
        raise RegistrationRefused(
            f"the evaluation on unseen runs has {n:,} positions, fewer than "
            f"data.min_eval_positions={minimum:,}: not registered, the champion is left alone"
        )


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot ("" where /proc is missing); None
    when there is no such live process (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return ""
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def process_owner() -> str:
    """This process, as a registration's owner tag."""
    pid = os.getpid()
    return f"{socket.gethostname()}|{_boot_id()}|{pid}|{_process_start(pid) or ''}"


def owner_state(owner: str | None) -> str:
    """'alive', 'dead', or 'unknown' (another machine: nothing here can tell)."""
    try:
        host, boot, pid, start = (owner or "").split("|")
        pid_n = int(pid)
    except ValueError:
        return "unknown"
    if host != socket.gethostname():
        return "unknown"
    if boot and _boot_id() and boot != _boot_id():
        return "dead"  # the machine rebooted since
    now = _process_start(pid_n)
    if now is None or (start and now and now != start):
        return "dead"  # gone, or the pid now belongs to another process
    return "alive"


def lease_until_ms(run) -> int | None:
    """The epoch ms until which the run's owner answers for it; None: no end. A run logged
    before leases: ABANDON_AFTER_S after it ended, none while it runs."""
    try:
        return int(run.data.tags[TAG_LEASE])
    except (KeyError, ValueError):
        if run.info.status == "RUNNING":
            return None
        return int(run.info.end_time or run.info.start_time or 0) + ABANDON_AFTER_S * 1000


def _is_abandoned(run, now_ms: int) -> bool:
    """Whether a `started` run will never finish: its owner is known dead, or (a running owner
    of this machine is alive: kept) its lease ran out."""
    state = owner_state(run.data.tags.get(TAG_OWNER))
    if state == "dead":
        return True
    if run.info.status == "RUNNING" and state == "alive":
        return False
    until = lease_until_ms(run)
    return until is not None and now_ms > until


def registration_in_progress(run, now_ms: int) -> bool:
    """Whether another live registrar is at work on this run (to be waited for, never
    resumed beside it)."""
    tags = run.data.tags
    return (
        run.info.status == "RUNNING"
        and tags.get(TAG_STATE) == "started"
        and tags.get(TAG_OWNER) != process_owner()
        and not _is_abandoned(run, now_ms)
    )


def _renew_lease(client, run_id: str, seconds: float) -> None:
    client.set_tag(run_id, TAG_LEASE, str(int((time.time() + seconds) * 1000)))


TAG_CLAIM = "heapcast.claim_token"  # the claim holder's own token, on the claim model


@contextmanager
def registration_claim(client, tracking: TrackingConfig, key: str) -> Iterator[None]:
    """Only one process at a time decides who registers `key` (see "faults" above): the SQLite
    store's file lock, or a claim on a tracking server."""
    with store_lock(tracking) as locked:
        if locked:
            yield
            return
    name = f"{tracking.model_name}.claim-{key}"
    token = uuid.uuid4().hex
    while not _take_claim(client, name, token):
        time.sleep(0.2)
    try:
        yield
    finally:
        _drop_claim(client, name, token)


def _take_claim(client, name: str, token: str) -> bool:
    """Create the claim model (the store refuses a second model of that name: the one atomic
    compare-and-set MLflow offers over REST); remove a stale one (its owner dead here, or its
    lease out) so that the next try can take it."""
    # deferred: imported on first use, for start-up time
    from mlflow.exceptions import MlflowException

    now_ms = int(time.time() * 1000)
    tags = {
        TAG_OWNER: process_owner(),
        TAG_CLAIM: token,
        TAG_LEASE: str(now_ms + CLAIM_LEASE_S * 1000),
    }
    try:
        client.create_registered_model(
            name, tags=tags, description="heapcast: a registration deciding; removed when done"
        )
        return True
    except MlflowException as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    try:
        held = client.get_registered_model(name).tags
    except MlflowException as err:
        if err.error_code == "RESOURCE_DOES_NOT_EXIST":
            return False  # released meanwhile: try again
        raise
    stale = owner_state(held.get(TAG_OWNER)) == "dead" or now_ms > int(held.get(TAG_LEASE) or 0)
    if stale:
        _drop_claim(client, name, held.get(TAG_CLAIM, ""))
    return False


def _drop_claim(client, name: str, token: str) -> None:
    """Delete the claim model if it is still the one with `token`."""
    # deferred: imported on first use, for start-up time
    from mlflow.exceptions import MlflowException

    try:
        if client.get_registered_model(name).tags.get(TAG_CLAIM) == token:
            client.delete_registered_model(name)
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise


@contextmanager
def _lease_kept_on_failure(client, run_id: str) -> Iterator[None]:
    """A failing attempt's lease extended by ABANDON_AFTER_S: the time its owner's retries
    have to come back before its version is reaped."""
    try:
        yield
    except BaseException:
        with suppress(Exception):  # the store itself may be what failed
            _renew_lease(client, run_id, ABANDON_AFTER_S)
        raise


def claim_registration(
    client, tracking: TrackingConfig, experiment_id: str, key: str, run_name: str
) -> tuple[Any, Any]:
    """(run, its version or None) of the registration of `key`, now owned by this process: an
    earlier one to resume or return, else a new run. Waits while another live registrar of the
    same key is at work, then takes what it left."""
    # deferred: imported on first use, for start-up time
    from mlflow.tracking.context.registry import resolve_tags

    while True:
        with registration_claim(client, tracking, key):
            run, version = find_registration(client, experiment_id, key, tracking.model_name)
            if run is None:
                lease = str(int((time.time() + LEASE_S) * 1000))
                tags = {TAG_KEY: key, TAG_STATE: "started", TAG_OWNER: process_owner()}
                run = client.create_run(
                    experiment_id, run_name=run_name, tags=resolve_tags({**tags, TAG_LEASE: lease})
                )
                return run, None
            if not registration_in_progress(run, int(time.time() * 1000)):
                if run.data.tags.get(TAG_STATE) != "complete":
                    client.set_tag(run.info.run_id, TAG_OWNER, process_owner())
                    _renew_lease(client, run.info.run_id, LEASE_S)
                return run, version
        time.sleep(WAIT_POLL_S)


def _versions_of_run(client, model_name: str, run_id: str) -> list:
    found = client.search_model_versions(f"run_id = '{run_id}'")
    return sorted((v for v in found if v.name == model_name), key=lambda v: int(v.version))


def reap_abandoned_registrations(
    client, experiment_id: str, model_name: str, keep_key: str | None = None
) -> list[str]:
    """Close the registrations that will never finish (see the comment above); returns what was
    done, one line each. The registration of `keep_key` is left to its caller to resume."""
    now_ms = int(time.time() * 1000)
    done = []
    runs = client.search_runs([experiment_id], f"tags.`{TAG_STATE}` = 'started'", max_results=1000)
    for run in runs:
        tags, run_id = run.data.tags, run.info.run_id
        if tags.get(TAG_KEY) == keep_key or not _is_abandoned(run, now_ms):
            continue
        versions = _versions_of_run(client, model_name, run_id)
        holds_alias = any(client.get_model_version(v.name, v.version).aliases for v in versions)
        if TAG_DECISION in tags or holds_alias:
            # The promotion happened: the version is a finished one in all that counts.
            client.set_tag(run_id, TAG_STATE, "complete")
            done.append(f"run {run_id}: promoted before its process ended; marked complete")
        else:
            for v in versions:
                client.delete_model_version(v.name, v.version)
            gone = ", ".join(f"v{v.version}" for v in versions) or "no version"
            client.set_tag(run_id, TAG_STATE, "abandoned")
            client.set_tag(
                run_id,
                "heapcast.abandoned",
                f"its registration never finished (owner {tags.get(TAG_OWNER)}); removed {gone}",
            )
            done.append(f"run {run_id}: registration abandoned; removed {gone}")
        if run.info.status == "RUNNING":
            client.set_terminated(run_id, "KILLED")
    return done


def find_registration(client, experiment_id: str, key: str, model_name: str):
    """(run, version) of an earlier registration of the same outcome: the run holding a version
    of `model_name`, else (run, None) for one still logging its model, else (None, None). Runs
    of that key that died before their version are closed (tagged abandoned) on the way."""
    runs = client.search_runs(
        [experiment_id],
        f"tags.`{TAG_KEY}` = '{key}'",
        order_by=["attributes.start_time ASC"],
        max_results=100,
    )
    found = in_progress = None
    now_ms = int(time.time() * 1000)
    for run in runs:
        if run.data.tags.get(TAG_STATE) == "abandoned":
            continue
        versions = _versions_of_run(client, model_name, run.info.run_id)
        if versions and found is None:
            found = (run, versions[0])
        elif not versions and registration_in_progress(run, now_ms):
            in_progress = in_progress or (run, None)
        elif (
            not versions
            and run.data.tags.get(TAG_STATE) != "complete"
            and (run.info.status != "RUNNING" or _is_abandoned(run, now_ms))
        ):
            client.set_tag(run.info.run_id, TAG_STATE, "abandoned")
            client.set_tag(
                run.info.run_id, "heapcast.abandoned", "died before its model was registered"
            )
            if run.info.status == "RUNNING":
                client.set_terminated(run.info.run_id, "FAILED")
    return found or in_progress or (None, None)


# ----------------------------------------------------------------------------- registration


def register_outcome(
    outcome: TrainOutcome,
    tracking: TrackingConfig,
    evaluate_model: Callable[[Any], Evaluation] | None = None,
    run_name: str | None = None,
    report: Path | None = None,
    report_error: str | None = None,
) -> RegistrationResult:
    """Log one training run, register its model, and move `champion` if it wins (see module doc).

    Safe to call again with the same outcome after any failure, or after a process registering
    it was killed: one run, one version (see "faults" above). `report` is the heap report of
    the training data (logged as report/<name>), or None with `report_error` saying why."""
    refuse_small_evaluation(outcome)
    experiment_id = configure(tracking)
    # deferred: imported on first use, for start-up time
    import mlflow
    from mlflow import MlflowClient

    client = MlflowClient()
    key = registration_key(outcome, tracking.model_name)
    reap_abandoned_registrations(client, experiment_id, tracking.model_name, keep_key=key)
    # The run of this key, new or an earlier attempt's, is this process's from here on.
    prior_run, prior_version = claim_registration(
        client, tracking, experiment_id, key, run_name or time.strftime("train-%Y%m%d-%H%M%S")
    )
    scores = headline.training_metrics(
        outcome.evaluation, outcome.seconds, outcome.predictions_per_second
    )
    tags = prior_run.data.tags
    if tags.get(TAG_STATE) == "complete" and TAG_DECISION in tags:
        decision = champion_rules.decision_from_json(tags[TAG_DECISION])
        return _result(prior_run.info.run_id, experiment_id, tracking, decision, scores)
    resumed = prior_version is not None
    with (
        mlflow.start_run(run_id=prior_run.info.run_id) as run,
        _lease_kept_on_failure(client, prior_run.info.run_id),
    ):
        run_id = run.info.run_id
        if prior_version is None:
            dataset = _dataset_input(outcome)
            info = _log_run_and_model(outcome, tracking, dataset, report, report_error)
            version, model_id = str(info.registered_model_version), info.model_id
            tags = {}
            _renew_lease(client, run_id, LEASE_S)
        else:  # an earlier attempt logged the model: finish what it left undone
            dataset = _dataset_input(outcome)
            version = str(prior_version.version)
            model_id = getattr(prior_version, "model_id", None)
        if tags.get(TAG_METRICS) != "logged":
            _log_metrics(client, run_id, outcome, scores, dataset, model_id)
            log_questions(outcome, version)
            log_answers(outcome)  # whatif reads them instead of computing them again
            mlflow.set_tag(TAG_METRICS, "logged")

        # The version's evaluation, then the promotion decision on that same evaluation.
        champion_rules.record_evaluation(
            client, tracking.model_name, version, outcome.evaluation, outcome.dataset.content_hash
        )
        client.set_model_version_tag(tracking.model_name, version, champion_rules.TAG_RUN, run_id)
        client.set_model_version_tag(tracking.model_name, version, TAG_KEY, key)
        _renew_lease(client, run_id, LEASE_S)
        decision = _promote(
            client, tracking, run_id, version, outcome, evaluate_model, tags, resumed
        )
        champion_rules.log_decision(client, run_id, decision)
        headline.describe_version(
            client, tracking.model_name, version, outcome, decision.decision, decision.reason
        )
        if decision.champion_evaluation is not None:
            mlflow.log_dict(
                {
                    "champion_version": decision.previous_champion_version,
                    "content_hash": outcome.dataset.content_hash,
                    "rows": evaluation_rows(decision.champion_evaluation),
                },
                "promotion/champion_evaluation.json",
            )
        mlflow.set_tags({"heapcast.model_version": version, TAG_STATE: "complete"})

    return _result(run_id, experiment_id, tracking, decision, scores)


TAG_REPORT = "heapcast.report"  # the heap report's artifact path, or why there is none


def log_data_report(report: Path | None, report_error: str | None) -> None:
    """The heap report of the model's training data, made by the train flow (a local page
    named <workload>-<run>.html), as the artifact report/<name>, named by the tag
    heapcast.report. A report that could not be made is that tag saying why, never a failed
    registration: the model does not depend on it."""
    # deferred: imported on first use, for start-up time
    import mlflow

    if report is None:
        why = report_error or "no report was handed to registration"
        mlflow.set_tag(TAG_REPORT, f"not made: {why}"[:5000])
        return
    mlflow.log_artifact(str(report), "report")
    mlflow.set_tag(TAG_REPORT, f"report/{report.name}")


def _log_run_and_model(
    outcome: TrainOutcome,
    tracking: TrackingConfig,
    dataset,
    report: Path | None,
    report_error: str | None,
):
    """Everything of a run up to its model (which registers the version); the ModelInfo."""
    # deferred: imported on first use, for start-up time
    import mlflow
    from mlflow import MlflowClient
    from mlflow.models import infer_signature

    commit, _ = git_commit()
    mlflow.set_tags(
        {
            "mlflow.source.git.commit": commit,
            "heapcast.content_hash": outcome.dataset.content_hash,
            "heapcast.model_name": tracking.model_name,
        }
    )
    notes = list(getattr(outcome, "notes", []) or [])
    if notes:  # the run's description in the UI, and a tag
        mlflow.set_tags(
            {
                "mlflow.note.content": "\n".join(f"- {n}" for n in notes),
                "heapcast.notes": " | ".join(notes)[:5000],
            }
        )
    mlflow.log_params(run_params(outcome))
    mlflow.log_input(dataset, context="training")

    # Artifacts: plots (also as images for the chart view), tables, the config.
    with tempfile.TemporaryDirectory(prefix="heapcast-register-") as tmp:
        tmp_path = Path(tmp)
        pngs = write_plots(outcome, tmp_path / "plots")
        write_evaluation_tables(outcome.evaluation, tmp_path / "evaluation")
        mlflow.log_artifacts(str(tmp_path / "plots"), "plots")
        mlflow.log_artifacts(str(tmp_path / "evaluation"), "evaluation")
        headline.log_evaluation_tables(
            MlflowClient(), mlflow.active_run().info.run_id, outcome.evaluation
        )
        for key, png in pngs.items():
            mlflow.log_image(_png_as_array(png), key=f"plots/{key}", step=0, synchronous=True)
    log_data_report(report, report_error)
    mlflow.log_dict(outcome.config, "config.json")
    # what a HedgedStream of this model needs beyond its weights
    smoothing = TrainConfig.model_validate(outcome.config).ngram.smoothing
    mlflow.log_dict(hedge_settings(outcome.dataset.token_histogram, smoothing), HEDGE_ARTIFACT)

    # The model: signature from a real prediction, explicit requirements.
    example = outcome.input_example
    example = (
        {k: np.asarray(v, dtype=np.int32) for k, v in example.items()}
        if isinstance(example, dict)
        else np.asarray(example, dtype=np.int32)
    )
    prediction = np.asarray(outcome.model.predict(example, verbose=0))
    return log_keras_model(
        outcome.model,
        registered_model_name=tracking.model_name,
        signature=infer_signature(example, prediction),
        input_example=example,
        pip_requirements=model_pip_requirements(),
    )


def _log_metrics(
    client, run_id: str, outcome: TrainOutcome, scores: dict[str, float], dataset, model_id
) -> None:
    """The headline (linked to the logged model and the dataset) and the curves."""
    # deferred: imported on first use, for start-up time
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    metrics = [
        Metric(
            k,
            v,
            now,
            0,
            dataset_name=dataset.name,
            dataset_digest=dataset.digest,
            model_id=model_id,
            run_id=run_id,
        )
        for k, v in scores.items()
    ]
    for name, values in outcome.history.items():
        metrics += [
            Metric(curve_key(name), float(v), now, epoch, run_id=run_id)
            for epoch, v in enumerate(values)
        ]
    client.log_batch(run_id, metrics=metrics)


def _promote(
    client,
    tracking: TrackingConfig,
    run_id: str,
    version: str,
    outcome: TrainOutcome,
    evaluate_model,
    tags: dict[str, str],
    resumed: bool,
) -> champion_rules.PromotionDecision:
    """Decide, move the alias, settle it, and write the decision on the run: once.

    Under the store's lock (a SQLite store: no other registration reads or moves the alias in
    between); `settle` covers stores without one. An earlier attempt's decision is read back,
    never made again."""
    if TAG_DECISION in tags:
        return champion_rules.decision_from_json(tags[TAG_DECISION])
    name, content_hash = tracking.model_name, outcome.dataset.content_hash
    with store_lock(tracking):
        # Read again under the lock: the tags in hand were read before it was taken.
        decided = client.get_run(run_id).data.tags.get(TAG_DECISION)
        if decided is not None:
            return champion_rules.decision_from_json(decided)
        holder = champion_rules.current_champion(client, name, CHAMPION_ALIAS)
        if resumed and holder is not None and str(holder.version) == version:
            # An earlier attempt moved the alias here and died before writing why.
            score = champion_rules.score_of(outcome.evaluation, tracking.promote_on)
            decision = champion_rules.PromotionDecision(
                True,
                "promoted",
                f"v{version} already holds {CHAMPION_ALIAS}: an earlier attempt of this "
                "registration promoted it",
                metric=tracking.promote_on,
                candidate_version=version,
                candidate_score=score,
                previous_champion_version=None,
                champion_score=None,
                champion_reevaluated=False,
            )
        else:
            decision = champion_rules.decide(
                client,
                name,
                version,
                outcome.evaluation,
                content_hash,
                metric=tracking.promote_on,
                min_improvement=tracking.min_improvement,
                alias=CHAMPION_ALIAS,
                evaluate_model=evaluate_model,
            )
            champion_rules.apply(client, name, decision, CHAMPION_ALIAS, content_hash)
            decision = champion_rules.settle(client, name, decision, content_hash, CHAMPION_ALIAS)
        client.set_tag(run_id, TAG_DECISION, champion_rules.decision_json(decision))
    return decision


def _result(
    run_id: str,
    experiment_id: str,
    tracking: TrackingConfig,
    decision: champion_rules.PromotionDecision,
    scores: dict[str, float],
) -> RegistrationResult:
    version = decision.candidate_version
    return RegistrationResult(
        run_id=run_id,
        experiment_id=experiment_id,
        model_name=tracking.model_name,
        model_version=version,
        model_uri=f"models:/{tracking.model_name}/{version}",
        promoted=decision.promoted,
        champion_version=decision.champion_version,
        decision=decision.decision,
        reason=decision.reason,
        metric=decision.metric,
        candidate_score=decision.candidate_score,
        champion_score=decision.champion_score,
        scores=scores,
    )


def rescore_config(today, champion_config: dict | None):
    """The config to score a champion with today: today's data split, n-gram and batch settings,
    the champion's own model shape (mode, context, network) where its config was logged."""

    if not champion_config:
        return today
    try:
        champ = TrainConfig.model_validate(champion_config)
    except Exception:  # a config from an older schema: score with today's settings
        return today
    return today.model_copy(
        update={"mode": champ.mode, "context": champ.context, "model": champ.model}
    )


def champion_rescorer(config, split) -> Callable[[Any, dict | None], Evaluation]:
    """evaluate_model for promotion: a champion scored on today's unseen runs, at the positions
    and with the settings the candidate was (tasks.learning.train), with the champion's own
    model shape; the model alone on that table, which is what promotion compares."""

    def rescore(model, champion_config: dict | None = None) -> Evaluation:
        return score_model_on_unseen_runs(model, rescore_config(config, champion_config), split)

    return rescore


def registered_model(result: RegistrationResult, dataset: DatasetRef) -> RegisteredModel:
    """The registered version as the stages after registration take it: name, version, run,
    the runs it was evaluated on, and the registry's decision."""
    return RegisteredModel(
        name=result.model_name,
        version=result.model_version,
        run_id=result.run_id,
        eval_runs=tuple(dataset.eval_runs),
        unseen_program_runs=tuple(dataset.unseen_program_runs),
        heldout_runs=tuple(dataset.heldout_runs),
        decision=result.decision,
        reason=result.reason,
        headline=tuple(sorted(result.scores.items())),
    )


@task(retries=2, retry_delay_seconds=[10, 30], cache_policy=NO_CACHE)
def register(
    outcome: TrainOutcome,
    tracking: TrackingConfig,
    report: Path | None,
    report_error: str | None = None,
    evaluate_model: Callable[[Any], Evaluation] | None = None,
) -> RegisteredModel:
    """Log the run, its model and the training data's heap report (`report`, a file the flow
    made; None with `report_error` saying why); promote it to `champion` when it wins.

    evaluate_model(model, champion_config) -> Evaluation re-scores the champion on today's
    evaluation when it was scored on other data (champion_rescorer(config, split) in the flow).
    """
    result = register_outcome(
        outcome, tracking, evaluate_model=evaluate_model, report=report, report_error=report_error
    )
    return registered_model(result, outcome.dataset)
