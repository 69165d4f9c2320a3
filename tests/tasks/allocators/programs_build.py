"""The test program (programs/alloc_mix.c) as a catalog workload: compiled on the host, put
into the input folder by a generator of its own, run in the sqlite3 image (which, as every
workload image, has the allocators installed)."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from tasks.allocators.config import AllocatorsConfig
from tasks.allocators.measure import Case, Measurements, Sample, measure_cases
from tasks.core.storage import Root
from tasks.replay.workloads import Catalog, Workload, parse_catalog

if TYPE_CHECKING:  # numba behind it: not imported by every allocators test
    from tasks.learning.table.layer_file import ModelTable

PROGRAMS = Path(__file__).parent / "programs"
GENERATOR = "alloc_mix_program"


def build_alloc_mix(dest: Path) -> Path:
    """Compile alloc_mix.c into `dest`; the binary's path."""
    out = dest / "alloc_mix"
    subprocess.run(
        ["gcc", "-O2", "-Wall", "-pthread", "-o", str(out), str(PROGRAMS / "alloc_mix.c")],
        check=True,
        capture_output=True,
    )
    return out


def generator_for(binary: Path):
    """An input generator that copies the compiled program into the input folder."""

    def generate(seed: int, size: int, dest: Path) -> list[str]:
        shutil.copy(binary, dest / "alloc_mix")
        (dest / "alloc_mix").chmod(0o755)
        return ["alloc_mix"]

    return generate


def alloc_mix_workloads(iterations: int = 4000, fail_under: str = "tcmalloc") -> dict:
    """The catalog's data (as in a workloads YAML): `alloc_mix` (clean everywhere) and
    `alloc_mix_failing` (exits 3 under the allocator `fail_under`).
    Needs GENERATOR registered in tasks.replay.inputs.GENERATORS."""

    def workload(name: str, env: dict[str, str]) -> dict:
        return {
            "name": name,
            "image": "sqlite3",
            "generator": GENERATOR,
            # env execs the program in its own process (the catalog wants an absolute path first)
            "command": ["/usr/bin/env", "{input}/alloc_mix", "{size}"],
            "env": env,
            "expected_exit_code": 0,
            "time_limit_s": 300,
            "inputs": [{"name": "small", "seed": 1, "size": iterations, "quick": True}],
        }

    return {
        "workloads": [
            workload("alloc_mix", {}),
            workload("alloc_mix_failing", {"ALLOC_MIX_FAIL_UNDER": fail_under}),
        ]
    }


def alloc_mix_catalog(iterations: int = 4000) -> Catalog:
    """alloc_mix_workloads as a Catalog (`alloc_mix_failing` exits 3 under tcmalloc)."""
    return parse_catalog(alloc_mix_workloads(iterations), "tests/tasks/allocators (alloc_mix)")


def measure_alloc_mix(
    w: Workload, cfg: AllocatorsConfig, root_dir: Path, runner: str, **kwargs
) -> Measurements:
    """The test program's first input measured as the case `alloc_mix` under `cfg`'s
    allocators, into a data root at `root_dir` (`kwargs`: measure_cases' repetitions, warmup)."""
    return measure_cases(
        [Case(w, w.inputs[0], "alloc_mix")], cfg, Root.from_url(str(root_dir)), runner, **kwargs
    )


def measure_table_candidate(
    catalog: Catalog,
    cfg: AllocatorsConfig,
    name: str,
    table: ModelTable,
    folder: Path,
    short: str | None = None,
) -> tuple[Measurements, dict[str, Sample]]:
    """A table candidate (`name` in `cfg`: the layer's or the placement's) measured once on
    alloc_mix's first input on the local runner beside glibc, three ways: given `table` (as
    `name`); given the same file but told the next version (`{short}-v{version + 1}`: its layer
    must refuse the file); given none (`{short}-none`: unavailable). `short` defaults to `name`.
    The measurements (into a data root at `folder`/root) and their samples by allocator."""
    short = short or name
    good = cfg.get(name).model_copy(update={"model_table": table})
    wrong = good.model_copy(
        update={
            "name": f"{short}-v{table.version + 1}",
            "model_table": dataclasses.replace(table, version=table.version + 1),
        }
    )
    none = cfg.get(name).model_copy(update={"name": f"{short}-none"})
    runs = cfg.model_copy(
        update={
            "allocators": [cfg.get("glibc"), good, wrong, none],
            "warmup": 0,
            "max_repetitions": None,
            "seeds": None,
        }
    )
    m = measure_alloc_mix(catalog.get("alloc_mix"), runs, folder / "root", "local", repetitions=1)
    return m, {s.allocator: s for s in m.samples}
