"""Fixtures of the allocators tests: the config, the test program as a workload, an engine."""

from __future__ import annotations

import pytest

from tasks.allocators.config import AllocatorsConfig, load_allocators_config
from tests.tasks.allocators.programs_build import (
    GENERATOR,
    alloc_mix_catalog,
    build_alloc_mix,
    generator_for,
)


@pytest.fixture(scope="session")
def config() -> AllocatorsConfig:
    """configs/allocators.yaml's four libraries, every input of the selection measured."""
    cfg = load_allocators_config()
    return cfg.model_copy(
        update={"inputs": None, "allocators": cfg.allocators[:4], "max_repetitions": None}
    )


@pytest.fixture(scope="session")
def alloc_catalog(tmp_path_factory):
    """The catalog of the test program, its generator registered for the session."""
    from tasks.replay.inputs import GENERATORS

    binary = build_alloc_mix(tmp_path_factory.mktemp("alloc_mix"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(GENERATORS, GENERATOR, generator_for(binary))
        yield alloc_mix_catalog()


@pytest.fixture(scope="session")
def sqlite3_image(engine):
    """The image the test program runs in, built (with the allocators) when out of date."""
    from tasks.replay.images import build_all

    return build_all(["sqlite3"], host=engine)[-1]
