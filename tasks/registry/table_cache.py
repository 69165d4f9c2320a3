"""A registered version's tables, kept on this host by version: the layer's table (`heapcast
layer --predictor model[:VERSION]`) and the placement layer's lifetime table (`--policy place`),
so that the layer starts without MLflow once the file is here.

Files (their names, formats and checks: tasks/registry/table_files.py):
`<scratch>/tables/v<N>.hcltab` and `v<N>.hclife`. A version number names its file; an alias is
resolved without MLflow (`alias_version`: the SQLite file read-only, or the server's REST API).
A file is used only when sound, else fetched again and the caller told why. Anything else goes
through MLflow (question_artifacts.fetch_table), written by a rename so a killed fetch leaves no
half file. The rules: docs/pipeline.md#the-tables-kept-on-this-host.

Light on purpose: MLflow, numpy and the learning modules are imported only to fetch.
"""

from __future__ import annotations

import json
import sqlite3
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tasks.core.storage import Root
from tasks.registry.table_files import (
    lifetime_fault,
    lifetime_file,
    table_dir,
    table_fault,
    table_file,
)
from tasks.registry.tracking import TrackingConfig, resolve_target, tracking_for

# MLflow's own alias for the highest version, kept in no table: MLflow answers it.
LATEST_ALIAS = "latest"
# A server that does not answer within this is asked again through MLflow's client.
_REST_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class LocalTable:
    """A registered version's table as a file on this host."""

    path: Path
    version: int  # the model version in its header: the layer's `model=N`
    # why a file that was here was not used and the table fetched again; "" otherwise
    refused: str = ""


class NoSuchVersion(LookupError):
    """The store says plainly that the model has no version under that alias."""


@dataclass(frozen=True)
class _Kind:
    """What model_table keeps: the reuse table (the cache layer's) or the lifetime table."""

    file: Callable[[Path, int], Path]
    fault: Callable[[Path, int], str]
    fetch: str  # the fetching function's name in tasks.registry.question_artifacts
    what: str


_KINDS = {
    "reuse": _Kind(table_file, table_fault, "fetch_table", "table"),
    "lifetime": _Kind(lifetime_file, lifetime_fault, "fetch_lifetime_table", "lifetime table"),
}


def _sqlite_alias(db: Path, name: str, alias: str) -> int | None:
    if not db.is_file():
        raise NoSuchVersion(f"no store at {db}")
    try:
        con = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error:
        return None
    try:
        rows = con.execute(
            "SELECT version FROM registered_model_aliases WHERE name = ? AND alias = ?",
            (name, alias),
        ).fetchall()
    except sqlite3.Error:
        return None  # a schema this does not know, or a store being created
    finally:
        con.close()
    if not rows:
        raise NoSuchVersion(f"{name} has no alias {alias!r}")
    if len(rows) > 1:
        return None  # the alias in several of MLflow's workspaces: MLflow knows which
    return int(rows[0][0])


def _rest_alias(server: str, name: str, alias: str) -> int | None:
    query = urllib.parse.urlencode({"name": name, "alias": alias})
    url = f"{server}/api/2.0/mlflow/registered-models/alias?{query}"
    try:
        with urllib.request.urlopen(url, timeout=_REST_TIMEOUT_S) as resp:
            body = json.load(resp)
        return int(body["model_version"]["version"])
    except urllib.error.HTTPError as err:
        try:
            code = json.loads(err.read()).get("error_code")
        except (ValueError, OSError):
            code = None
        if code == "RESOURCE_DOES_NOT_EXIST":  # no such model (an unknown alias is a 400)
            raise NoSuchVersion(f"no model {name} on {server}") from None
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # not there, not answering, or not MLflow's answer


def alias_version(tracking: TrackingConfig, alias: str) -> int | None:
    """The version number `alias` points at, read without MLflow; None when this cannot tell
    (MLflow's client can: an unknown alias on a server, `latest` in a SQLite store, another
    database); raises NoSuchVersion when the store says plainly there is none."""
    uri = resolve_target(tracking).tracking_uri
    if uri.startswith(("http://", "https://")):
        return _rest_alias(uri, tracking.model_name, alias)
    if uri.startswith("sqlite:///") and alias.lower() != LATEST_ALIAS:
        return _sqlite_alias(Path(uri.removeprefix("sqlite:///")), tracking.model_name, alias)
    return None


def model_table(
    root: Root, model: str, tracking: TrackingConfig | None = None, kind: str = "reuse"
) -> LocalTable | None:
    """The table of the registered version `model` names (a number, or an alias such as
    `champion`) of `root`'s registry (`tracking`: tracking_for(root) unless given), from this
    host's copy when it is sound, else fetched into it. None when no such version is
    registered; a version that logged no table raises FileNotFoundError naming it, and one whose
    logged table is not its own raises ValueError. `kind`: "reuse" (the cache layer's table) or
    "lifetime" (the placement layer's)."""
    k = _KINDS[kind]
    dest = table_dir(root)
    tracking = tracking or tracking_for(root)
    if model.isascii() and model.isdigit():
        version: int | None = int(model)
    else:
        try:
            version = alias_version(tracking, model)
        except NoSuchVersion:
            return None
    refused = ""
    if version is not None:
        path = k.file(dest, version)
        refused = k.fault(path, version)
        if not refused:
            return LocalTable(path, version)
        refused = "" if not path.exists() else f"{path} refused: {refused}"
    # deferred: MLflow's import is slow; only a table not here yet needs it
    from tasks.registry.question_artifacts import fetch_lifetime_table, fetch_table

    # the number the alias pointed at, not the alias again: the file must be that version's
    fetch = fetch_table if k.fetch == "fetch_table" else fetch_lifetime_table
    got = fetch(tracking, str(version) if version is not None else model, dest)
    if got is None:
        return None
    fault = k.fault(got.path, got.version)
    if fault:
        raise ValueError(
            f"model {tracking.model_name} v{got.version} (run {got.run_id}): the {k.what} it "
            f"logged ({got.path}) would be refused by the layer: {fault}"
        )
    return LocalTable(got.path, got.version, refused)
