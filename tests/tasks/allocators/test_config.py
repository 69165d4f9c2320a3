"""configs/allocators.yaml: strict, and every problem names its field."""

from __future__ import annotations

import pytest
import yaml

from tasks.allocators.config import CONFIG_PATH, AllocatorsConfig, load_allocators_config
from tasks.core.config import ConfigError


def _write(tmp_path, data: dict):
    path = tmp_path / "allocators.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _base() -> dict:
    return yaml.safe_load(CONFIG_PATH.read_text())


def test_the_project_config_lists_the_four_allocators_with_their_packages():
    cfg = load_allocators_config()
    assert cfg.names()[:4] == ["glibc", "jemalloc", "tcmalloc", "mimalloc"]
    assert cfg.baseline == "glibc" and cfg.get("glibc").preload == ()
    assert {a.name: a.package for a in cfg.allocators[:4]} == {
        "glibc": "libc6",
        "jemalloc": "libjemalloc2",
        "tcmalloc": "libtcmalloc-minimal4",
        "mimalloc": "libmimalloc2.0",
    }
    assert cfg.get("mimalloc").library == "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2.0"
    assert cfg.repetitions >= 5 and cfg.rule.memory_tolerance == 0.10
    assert cfg.rule.time == "wall_s" and cfg.rule.memory == "peak_rss_mb"


@pytest.mark.parametrize(
    ("change", "names"),
    [
        (lambda d: d.update(repetition=5), "repetition"),  # a typo
        (lambda d: d.update(repetitions=3), "repetitions"),  # fewer than 5
        (lambda d: d.update(baseline="ptmalloc"), "baseline 'ptmalloc'"),
        (lambda d: d["rule"].update(noise="t-test"), "rule.noise"),
        (lambda d: d["rule"].update(memory_tolerance=-0.1), "rule.memory_tolerance"),
        (lambda d: d["allocators"].append(dict(d["allocators"][1])), "named twice: jemalloc"),
        (lambda d: d["allocators"][1].update(library="libjemalloc.so.2"), "absolute path"),
        (lambda d: d["allocators"][1].pop("package"), "`package`"),
        (lambda d: d["allocators"][2].update(packge="x"), "packge"),
        # candidates with knobs: a typo, a value glibc would ignore, a knob on the wrong malloc
        (
            lambda d: d["allocators"][0].update(env={"GLIBC_TUNABLES": "glibc.malloc.arena=2"}),
            "allocators.0: Value error, allocator 'glibc', env.GLIBC_TUNABLES",
        ),
        (
            lambda d: d["allocators"][0].update(
                env={"GLIBC_TUNABLES": "glibc.malloc.tcache_count=99999"}
            ),
            "above glibc's 65535",
        ),
        (lambda d: d["allocators"][0].update(env={"MALLOC_ARENA_MAX": "0"}), "MALLOC_ARENA_MAX"),
        (
            lambda d: d["allocators"][1].update(env={"TCMALLOC_RELEASE_RATE": "2"}),
            "env.TCMALLOC_RELEASE_RATE: tunes tcmalloc's malloc, but this candidate runs jemalloc's",
        ),
        (
            lambda d: d["allocators"][1].update(env={"MALLOC_CONF": "background_thread:yes"}),
            "background_thread",
        ),
        (lambda d: d["allocators"][1].update(env={"MALLOCCONF": "x"}), "unknown allocator knob"),
        (lambda d: d["tune"].update(candidates=["glibc", "hoard"]), "tune.candidates: hoard"),
        (lambda d: d["tune"].update(candidates=["jemalloc"]), "include the baseline"),
        # 16 candidates against glibc: Holm's bar 0.05/16 is out of reach of 5 runs each
        (lambda d: d.update(max_repetitions=5), "give max_repetitions at least 6"),
        # the seeds' full rounds too: every allocator, 5 rounds and no more
        (
            lambda d: d["seeds"].update(
                allocators=[a["name"] for a in d["allocators"]], max_repetitions=None
            ),
            "give seeds.max_repetitions at least 6",
        ),
        (lambda d: d["allocators"][1].update(kind="layer"), "a layer's `library`"),
    ],
)
def test_a_bad_field_is_an_error_naming_it(tmp_path, change, names):
    data = _base()
    change(data)
    with pytest.raises(ConfigError) as err:
        load_allocators_config(_write(tmp_path, data))
    assert str(tmp_path / "allocators.yaml") in str(err.value)
    assert names in str(err.value)


def test_config_is_frozen():
    cfg = load_allocators_config()
    with pytest.raises(Exception, match="frozen"):
        cfg.repetitions = 9  # type: ignore[misc]
    assert isinstance(cfg, AllocatorsConfig)
