"""Where models and their metrics are kept: MLflow, embedded or behind a tracking server.

Two access modes, one per store (do not mix them: a server's experiments get
`mlflow-artifacts:/` locations, the SQLite file's get `file://`):

- embedded (default, `tracking_uri: null`): `<root>/mlflow/mlflow.db` and
  `<root>/mlflow/artifacts`, no service to start. For an `s3://` root the SQLite file stays on
  this machine (`<project>/data/mlflow-s3/<bucket>/<prefix>/mlflow.db`), the artifacts go under
  the root; several machines need a server.
- server (`tracking_uri: http://host:port`): everything through the REST API, artifacts proxied
  (scripts/mlflow-server.sh).

Details: docs/pipeline.md#where-models-are-kept. MLflow itself is imported lazily: flows import
this module at start-up.
"""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import PlainSerializer, PlainValidator, field_validator

from tasks.core.config import CONFIG_DIR, PROJECT_DIR, StrictModel, default_root, load_config
from tasks.core.storage import Root

DEFAULT_EXPERIMENT = "heapcast"
DEFAULT_MODEL_NAME = "heapcast-next-call"
CHAMPION_ALIAS = "champion"

# No internet here: MLflow's telemetry would only produce errors and delays; a logged model must
# never try to build a virtualenv/conda env.
_QUIET_ENV = {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_ENV_CREATION": "true",
}


def _data_root(value: Root | str) -> Root:
    """A config's data root: resolved once, where the YAML (or the flow's root) is read."""
    return value if isinstance(value, Root) else Root.from_url(str(value))


# A Root in memory, its URL in a YAML file or a JSON dump.
DataRoot = Annotated[
    Root, PlainValidator(_data_root), PlainSerializer(lambda r: r.url, return_type=str)
]


class TrackingConfig(StrictModel):
    """Where runs and models go, and how a champion is chosen."""

    # None: the embedded SQLite store inside the data root; else a tracking server URL.
    tracking_uri: str | None = None
    # The data root whose mlflow/ folder holds the embedded store (a URL); None in
    # configs/tracking.yaml: the flow's data root (tracking_for fills it in).
    root: DataRoot | None = None
    experiment: str = DEFAULT_EXPERIMENT
    model_name: str = DEFAULT_MODEL_NAME
    # The score a candidate must beat the champion on: the model's, over all workloads, on the
    # unseen-runs table. top1/top5: higher is better; log_loss: lower is better.
    promote_on: Literal["top1", "top5", "log_loss"] = "top1"
    # A candidate must beat the champion by more than this (0: any strict improvement).
    min_improvement: float = 0.0

    @field_validator("tracking_uri")
    @classmethod
    def _server_url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not re.match(r"^(https?|sqlite|postgresql|mysql|file|databricks)(\+\w+)?:", v):
            raise ValueError(
                f"tracking_uri {v!r}: expected an http(s):// tracking server URL (or a database "
                "URI such as sqlite:////abs/mlflow.db); leave it null for the embedded store"
            )
        return v.rstrip("/")

    @field_validator("min_improvement")
    @classmethod
    def _non_negative(cls, v: float) -> float:
        if v < 0:
            raise ValueError("min_improvement must be >= 0")
        return v


def load_tracking_config(path: str | Path | None = None) -> TrackingConfig:
    """configs/tracking.yaml (or `path`) as a TrackingConfig."""
    return load_config(TrackingConfig, path or CONFIG_DIR / "tracking.yaml")


def tracking_for(root: Root) -> TrackingConfig:
    """configs/tracking.yaml, with the flow's resolved data root and $MLFLOW_TRACKING_URI where
    it says null."""
    tracking = load_tracking_config()
    update: dict[str, object] = {}
    if tracking.root is None:
        update["root"] = root
    if tracking.tracking_uri is None and os.environ.get("MLFLOW_TRACKING_URI"):
        update["tracking_uri"] = os.environ["MLFLOW_TRACKING_URI"]
    return TrackingConfig.model_validate({**dict(tracking), **update}) if update else tracking


@dataclass(frozen=True)
class TrackingTarget:
    """The resolved URIs of one configuration."""

    tracking_uri: str
    registry_uri: str
    # Where the experiment's artifacts go when this process creates it; None: the server decides.
    artifact_location: str | None

    @property
    def is_server(self) -> bool:
        return self.tracking_uri.startswith(("http://", "https://"))


def _s3_local_store_dir(root: Root) -> Path:
    bucket_prefix = root.url.split("://", 1)[1]
    safe = re.sub(r"[^A-Za-z0-9._/-]", "_", bucket_prefix).strip("/")
    return PROJECT_DIR / "data" / "mlflow-s3" / safe


def resolve_target(tracking: TrackingConfig) -> TrackingTarget:
    """The tracking/registry URIs and artifact location a config stands for."""
    if tracking.tracking_uri is not None:
        return TrackingTarget(tracking.tracking_uri, tracking.tracking_uri, None)
    if tracking.root is None:
        raise ValueError(
            "tracking config: neither tracking_uri nor root is set, so there is no store to use; "
            "build it with tracking_for(root) (the flow's data root), or set one of the two in "
            "configs/tracking.yaml"
        )
    root = tracking.root
    if root.is_local:
        base = Path(root.path) / "mlflow"
        base.mkdir(parents=True, exist_ok=True)
        (base / "artifacts").mkdir(exist_ok=True)
        uri = f"sqlite:///{base.resolve() / 'mlflow.db'}"
        return TrackingTarget(uri, uri, (base.resolve() / "artifacts").as_uri())
    if root.url.startswith("s3://"):
        store = _s3_local_store_dir(root)
        store.mkdir(parents=True, exist_ok=True)
        uri = f"sqlite:///{store.resolve() / 'mlflow.db'}"
        return TrackingTarget(uri, uri, root.url_of("mlflow", "artifacts"))
    raise ValueError(
        f"data root {root.url}: no embedded MLflow store for this kind of URL; set tracking_uri "
        "in configs/tracking.yaml to a tracking server (scripts/mlflow-server.sh start)"
    )


def store_lock_path(tracking: TrackingConfig) -> Path | None:
    """The lock file of a SQLite store (`mlflow.db.lock` next to the database); None for a
    tracking server or another database, which no file lock can cover."""
    uri = resolve_target(tracking).tracking_uri
    if not uri.startswith("sqlite:///"):
        return None
    db = Path(uri.removeprefix("sqlite:///"))
    return db.with_name(db.name + ".lock")


@contextmanager
def store_lock(tracking: TrackingConfig) -> Iterator[bool]:
    """Hold the store's exclusive lock for what must not interleave between writers: creating
    the store, and a promotion's read-compare-write of the alias (tasks/registry/register.py).

    A SQLite store lives on this machine, so every process that writes to it can take an
    flock on the file next to it (released by the kernel when a holder dies, even by SIGKILL).
    A tracking server offers no lock: yields False, and the promotion re-checks the alias after
    moving it instead (tasks.registry.champion.settle).
    """
    path = store_lock_path(tracking)
    if path is None:
        yield False
        return

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def quiet_mlflow_env() -> None:
    """Turn off MLflow's telemetry and env creation (no internet); keeps values already set."""
    for k, v in _QUIET_ENV.items():
        if k == "DO_NOT_TRACK":
            # conftest and users may set DO_NOT_TRACK=1; MLflow only honours "true".
            if os.environ.get(k, "").lower() in ("1", "yes", ""):
                os.environ[k] = v
            continue
        os.environ.setdefault(k, v)
    if os.environ.get("AWS_ENDPOINT_URL") and not os.environ.get("MLFLOW_S3_ENDPOINT_URL"):
        os.environ["MLFLOW_S3_ENDPOINT_URL"] = os.environ["AWS_ENDPOINT_URL"]


def configure(tracking: TrackingConfig) -> str:
    """Point MLflow (tracking and registry) at the configured store; return the experiment id.

    Idempotent and cheap after the first call; the experiment is created with the artifact
    location of the access mode. An existing experiment whose artifacts live elsewhere (made by
    another access mode, or for another root) is an error that says what to do.
    """
    quiet_mlflow_env()
    # deferred: imported on first use, for start-up time
    import mlflow
    from mlflow import MlflowClient

    target = resolve_target(tracking)
    # set_tracking_uri also exports MLFLOW_TRACKING_URI (and the registry's) into os.environ.
    # tracking_for reads that variable as the user's choice of server, so in a long-lived
    # process (a worker, a test session) the first root configured would capture every later
    # flow's models. Keep the environment as the user set it.
    saved = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    mlflow.set_tracking_uri(target.tracking_uri)
    mlflow.set_registry_uri(target.registry_uri)
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    # Two processes opening a new SQLite store at once would both create its tables (and fail
    # in MLflow's migrations): the client (which opens the store) and the experiment under the
    # lock.
    with store_lock(tracking):
        client = MlflowClient(target.tracking_uri, target.registry_uri)
        exp = _experiment(client, tracking, target)
    mlflow.set_experiment(experiment_id=exp)
    return exp


def _experiment(client, tracking: TrackingConfig, target: TrackingTarget) -> str:
    """The experiment's id, created with the access mode's artifact location if missing."""
    client.search_registered_models(max_results=1)  # the registry's tables, on a new store
    exp = client.get_experiment_by_name(tracking.experiment)
    if exp is None:
        try:
            exp_id = client.create_experiment(
                tracking.experiment, artifact_location=target.artifact_location
            )
        except Exception:
            # Created concurrently by another process: use theirs.
            exp = client.get_experiment_by_name(tracking.experiment)
            if exp is None:
                raise
            exp_id = exp.experiment_id
    else:
        exp_id = exp.experiment_id
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp_id)
        if (
            target.artifact_location
            and exp.artifact_location.rstrip("/") != target.artifact_location
        ):
            raise ValueError(
                f"MLflow experiment {tracking.experiment!r} in {target.tracking_uri} keeps its "
                f"artifacts at {exp.artifact_location}, not {target.artifact_location}: it was "
                "created by another access mode or for another data root. Set another "
                "`experiment` in configs/tracking.yaml, or use the store it was made for."
            )
    return exp_id


def server_store(root: Root) -> dict[str, str]:
    """The embedded store of a data root, as `mlflow server` options (scripts/mlflow-server.sh).

    The server serves the same SQLite file the embedded mode writes, so the UI shows every run
    logged without a server. Runs logged through the server into that store keep the
    experiment's own artifact location (file:// or s3://, written by the client directly).
    """
    target = resolve_target(TrackingConfig(root=root))
    db = target.tracking_uri.removeprefix("sqlite:///")
    loc = target.artifact_location or ""
    artifacts = Path(loc.removeprefix("file://")).as_posix() if loc.startswith("file://") else loc
    return {
        "backend_store_uri": target.tracking_uri,
        "artifacts_destination": artifacts,
        "state_dir": str(Path(db).parent),
    }


if __name__ == "__main__":
    # `python -m tasks.registry.tracking server-store [ROOT]`: shell-friendly KEY=VALUE lines.
    import shlex
    import sys

    if len(sys.argv) < 2 or sys.argv[1] != "server-store":
        sys.exit("usage: python -m tasks.registry.tracking server-store [ROOT]")
    root = Root.from_url(sys.argv[2] if len(sys.argv) > 2 else default_root())
    for k, v in server_store(root).items():
        print(f"{k.upper()}={shlex.quote(v)}")
