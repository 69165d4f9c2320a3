"""Configs are strict pydantic models over YAML: a typo is an error that names the field.

Each job has one YAML file in configs/ and one model; `load_config` reads a file into a model
and turns validation errors into one message naming the file and the fields.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from tasks.core import quiet

PROJECT_DIR = Path(__file__).resolve().parents[2]
CONFIG_DIR = PROJECT_DIR / "configs"


class StrictModel(BaseModel):
    """Base of every config model: unknown fields are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ConfigError(ValueError):
    """A config file that does not validate; the message names the file and the fields."""


M = TypeVar("M", bound=BaseModel)


def format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid configuration ({err.error_count()} problem(s)):"]
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        lines.append(f"  - {where}: {e['msg']}")
    return "\n".join(lines)


def read_yaml(path: str | Path, what: str = "config file") -> object:
    """The YAML document at `path`; a missing file or bad YAML raises ConfigError naming it."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} not found") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None


def load_config(model: type[M], path: str | Path) -> M:
    """Read YAML at `path` into `model`; a missing file or bad field raises ConfigError."""
    path = Path(path)
    data = read_yaml(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, str(path))) from None


def default_root() -> str:
    """The data root (an fsspec URL): $HEAPCAST_ROOT, else ./data in the project."""
    return os.environ.get("HEAPCAST_ROOT", str(PROJECT_DIR / "data"))


def apply_embedded_defaults() -> None:
    """Environment defaults for the embedded mode, set before Prefect or MLflow are imported.

    Prefect keeps its state in the project (not ~/.prefect), sends no telemetry (there is no
    internet on these machines: it would only log errors), and gives its ephemeral API time to
    start on a loaded machine. A user's own settings win: only unset variables are filled.
    MLflow's own quiet settings are tasks.registry.tracking's (quiet_mlflow_env, before it imports mlflow).
    """
    os.environ.setdefault("PREFECT_HOME", str(PROJECT_DIR / ".prefect"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    # The in-process Dask scheduler logs every client connection at INFO (60 lines a quick night,
    # through Prefect's handlers); warnings and errors still show.
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
    # TensorFlow's C++ logs: no INFO or WARNING ("2"), and without an NVIDIA GPU no ERROR either
    # ("3"): its only errors there are its CUDA probes failing ("failed call to cuInit"). Its
    # start-up lines ignore this level (Abseil not yet initialised): tasks.core.quiet holds them
    # to it. CUDA_VISIBLE_DEVICES is left alone: hiding the devices silences none of these
    # lines, and would hide a real GPU.

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2" if quiet.has_nvidia_gpu() else "3")
    quiet.install()
    quiet.quiet_library_lines()
