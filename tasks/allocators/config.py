"""configs/allocators.yaml as a strict model: the allocators, the repetitions, the rule."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from tasks.core.config import CONFIG_DIR, StrictModel, default_root, load_config
from tasks.replay.workloads import Name

CONFIG_PATH = CONFIG_DIR / "allocators.yaml"
# Below this many runs per allocator a rank test cannot reach p < 0.05 (4 vs 4: p >= 0.029,
# 3 vs 3: 0.1); the stage's contract is five.
MIN_REPETITIONS = 5


class Allocator(StrictModel):
    """One allocator: LD_PRELOADed `library` (none: the C library's malloc), its Debian package."""

    name: Name
    library: str | None = None
    package: str | None = Field(default=None, description="the Debian package installing it")

    @field_validator("library")
    @classmethod
    def _absolute(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError(
                f"library {v!r} must be an absolute path (as the workload sees it: inside the "
                "image for docker, on the host for local)"
            )
        if v is not None and (":" in v or " " in v):
            raise ValueError(f"library {v!r}: LD_PRELOAD separates entries with ':' and spaces")
        return v

    @model_validator(mode="after")
    def _package_for_library(self) -> Allocator:
        if self.library is not None and not self.package:
            raise ValueError(
                f"allocator {self.name!r}: `package` (the Debian package that installs "
                f"{self.library}) is required, so that a missing library can say what to install"
            )
        return self

    @property
    def preload(self) -> tuple[str, ...]:
        return (self.library,) if self.library else ()


class RecommendationRule(StrictModel):
    """The fastest by median `time` among those within `memory_tolerance` of the smallest
    median `memory`; the margin over the baseline is beyond noise by `noise` at `alpha`."""

    time: Literal["wall_s", "cpu_s"] = "wall_s"
    memory: Literal["peak_rss_mb", "max_process_rss_mb"] = "peak_rss_mb"
    memory_tolerance: float = Field(default=0.10, ge=0.0)
    noise: Literal["mann_whitney", "minmax"] = "mann_whitney"
    alpha: float = Field(default=0.05, gt=0.0, lt=1.0)

    def describe(self) -> str:
        noise = (
            f"two-sided exact Mann-Whitney rank test, p < {self.alpha:g}"
            if self.noise == "mann_whitney"
            else "the [min, max] ranges do not overlap"
        )
        return (
            f"the fastest by median {self.time} among allocators whose median {self.memory} is "
            f"within {self.memory_tolerance:.0%} of the smallest; beyond noise: {noise}"
        )


class AllocatorsConfig(StrictModel):
    allocators: list[Allocator] = Field(min_length=1)
    baseline: Name = "glibc"
    repetitions: int = Field(default=MIN_REPETITIONS, ge=MIN_REPETITIONS)
    warmup: int = Field(default=1, ge=0, description="baseline runs before a case, discarded")
    inputs: list[Name] | None = Field(
        default=None, description="input names measured per workload; None: the selection's"
    )
    experiment: str = Field(default="heapcast-allocators", min_length=1)
    rule: RecommendationRule = RecommendationRule()
    large_block_bytes: int = Field(default=128 * 1024, ge=1)

    @field_validator("allocators")
    @classmethod
    def _unique(cls, v: list[Allocator]) -> list[Allocator]:
        names = [a.name for a in v]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"allocator(s) named twice: {', '.join(twice)}")
        return v

    @model_validator(mode="after")
    def _baseline_listed(self) -> AllocatorsConfig:
        if self.baseline not in self.names():
            raise ValueError(
                f"baseline {self.baseline!r} is not one of the allocators ({', '.join(self.names())})"
            )
        return self

    def names(self) -> list[str]:
        return [a.name for a in self.allocators]

    def get(self, name: str) -> Allocator:
        for a in self.allocators:
            if a.name == name:
                return a
        raise KeyError(f"no allocator {name!r} in the config; it has: {', '.join(self.names())}")


def load_allocators_config(path: str | Path | None = None) -> AllocatorsConfig:
    """configs/allocators.yaml (or `path`); a bad field is a ConfigError naming file and field."""
    return load_config(AllocatorsConfig, path or CONFIG_PATH)


class AllocatorsParams(StrictModel):
    """Parameters of an `allocators` flow (plain values, for Prefect's form)."""

    workloads: list[str] | None = Field(
        default=None, description="workload names to measure; all when empty"
    )
    quick: bool = Field(default=False, description="only the quick inputs' workloads")
    runner: Literal["auto", "docker", "local"] = "auto"
    root: str = Field(default_factory=default_root, description="data root (fsspec URL)")
    catalog: str | None = Field(
        default=None, description="catalog file; configs/workloads.yaml when empty"
    )
    config: str | None = Field(
        default=None, description="allocators config; configs/allocators.yaml when empty"
    )
    mlflow: bool = Field(default=True, description="log one MLflow run")
