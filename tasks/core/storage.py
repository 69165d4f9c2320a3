"""The data root: one fsspec URL (a folder by default, `s3://bucket/prefix` through s3fs).

Every stage reads and writes through `Root` alone, so moving the data to object storage is a
change of URL, not of code. Layout under the root (DESIGN.md):
  raw/<workload>/<run>/<pid>-<ns>.hct + manifest.json   (replay)
  events/workload=<w>/run=<r>/part-*.parquet + summary  (dataset)
  mlflow/                                               (embedded MLflow store, local roots only)
"""

from __future__ import annotations

import os
import posixpath
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec
from fsspec.core import url_to_fs


def s3_storage_options() -> dict[str, Any]:
    """s3fs options from the environment; AWS_ENDPOINT_URL points at an S3-compatible store."""
    opts: dict[str, Any] = {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("HEAPCAST_S3_ENDPOINT")
    if endpoint:
        opts["client_kwargs"] = {"endpoint_url": endpoint}
    return opts


@dataclass(frozen=True)
class Root:
    url: str
    storage_options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_url(cls, url: str, storage_options: dict[str, Any] | None = None) -> Root:
        if storage_options is None:
            storage_options = s3_storage_options() if url.startswith("s3://") else {}
        if "://" not in url:
            url = os.path.abspath(url)
        return cls(url=url.rstrip("/"), storage_options=storage_options)

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        return url_to_fs(self.url, **self.storage_options)[0]

    @property
    def path(self) -> str:
        """The root as a path inside `fs` (no protocol)."""
        return url_to_fs(self.url, **self.storage_options)[1]

    @property
    def is_local(self) -> bool:
        return "://" not in self.url or self.url.startswith("file://")

    def join(self, *parts: str) -> str:
        """A path inside `fs` under the root."""
        return posixpath.join(self.path, *parts)

    def url_of(self, *parts: str) -> str:
        """A full URL under the root (for Dask/pyarrow readers that take URLs)."""
        return posixpath.join(self.url, *parts)

    def raw_run(self, workload: str, run: str) -> str:
        return self.join("raw", workload, run)

    def events_run(self, workload: str, run: str) -> str:
        return self.join("events", f"workload={workload}", f"run={run}")


def scratch_parent(root: Root) -> Path:
    """Local scratch for a root's inputs, run folders and fetched tables: the runners bind these
    folders, so a local path even when the root is remote (HEAPCAST_SCRATCH overrides)."""
    env = os.environ.get("HEAPCAST_SCRATCH")
    if env:
        return Path(env)
    if root.is_local:
        return Path(root.join("allocators", ".scratch"))
    return Path(tempfile.gettempdir())
