"""The manifest a replay leaves next to its traces: `<root>/raw/<workload>/<run>/manifest.json`.

The dataset converter reads it to know what a run is (which program, input, image and tracer)
and whether to use it: a run with `ok: false` (wrong exit code, time limit, engine error) keeps
its partial trace for inspection, but is not training data.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1


class RunManifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    manifest_version: int = MANIFEST_VERSION
    workload: str
    input: str
    run: str = Field(description="the run id: the input's name")
    seed: int
    size: int
    runner: Literal["docker", "local"]
    sandbox: str = Field(description="docker, bwrap or none")
    image: str | None = Field(description="image tag (docker runner)")
    image_id: str | None = Field(description="image id, sha256:... (docker runner)")
    command: list[str] = Field(description="argv as run, placeholders substituted")
    env: dict[str, str] = Field(description="environment of the traced program")
    exit_code: int | None = Field(description="None when the program was killed at its limit")
    expected_exit_code: int
    ok: bool
    error: str | None
    timed_out: bool
    time_limit_s: float
    started_at: str = Field(description="UTC, ISO 8601")
    duration_s: float
    processes: int = Field(description="trace files that could be read (process images)")
    threads: int = Field(description="THREAD_START records over all processes")
    events: int = Field(description="heap calls (every record but THREAD_START)")
    events_by_op: dict[str, int]
    files: list[str] = Field(description="trace file names in the run folder")
    unreadable_files: list[str] = Field(
        default_factory=list, description="trace files with no readable header"
    )
    input_files: list[str]
    tracer_sha256: str
    caller: bool
    frames: int = Field(default=0, description="frames per call stack (HEAPCAST_FRAMES; 0: none)")
    sysroot: list[str] = Field(
        default_factory=list,
        description="the image's modules copied into sysroot/ beside the traces, as they name them",
    )
    sysroot_bytes: int = Field(
        default=0, description="what sysroot/ holds, modules and debug files"
    )
    sysroot_s: float = Field(default=0.0, description="seconds spent copying them out")
    host: str
    log_tail: str = Field(default="", description="last lines of the program's output")

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> RunManifest:
        return cls.model_validate_json(text)
