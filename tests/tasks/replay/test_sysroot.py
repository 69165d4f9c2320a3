"""A container run's modules brought home: which modules a run's traces name, and their copy
out of a (stand-in) container into the run's sysroot, where frame names are read from. The real
engine: test_sysroot_docker.py."""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path

import pytest

from tasks.format.frames import frame_names, module_file
from tasks.format.symbols import symbol_table
from tasks.replay.runners.sysroot import (
    SYSROOT_DIR,
    build_id,
    copy_modules,
    debug_file,
    image_cache,
    named_modules,
)
from tests.tracegen import StackTrie, free, malloc, module, thread_start, write_trace


class Absent(Exception):
    """The stand-in engine's NotFound."""


class StandInContainer:
    """A stopped container's file system as the engine's archive API shows it: `get_archive`
    gives a tar of the one path and its stat (a symlink's target as `linkTarget`)."""

    def __init__(self, files: dict[str, bytes], links: dict[str, str] | None = None):
        self.files = files
        self.links = links or {}
        self.asked: list[str] = []

    def get_archive(self, path: str):
        self.asked.append(path)
        buf = io.BytesIO()
        name = path.rsplit("/", 1)[-1]
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(name)
            if path in self.links:
                info.type, info.linkname = tarfile.SYMTYPE, self.links[path]
                tar.addfile(info)
            elif path in self.files:
                info.size = len(self.files[path])
                tar.addfile(info, io.BytesIO(self.files[path]))
            else:
                raise Absent(path)
        data = buf.getvalue()
        chunks = (data[i : i + 1000] for i in range(0, len(data), 1000))
        stat = {"name": name, "size": info.size, "linkTarget": self.links.get(path, "")}
        return chunks, stat


def _run_traces(folder: Path) -> None:
    """Two processes of one run: callers and stack frames in three image modules, a module mapped
    but never calling malloc, the vDSO, the tracer (under /heapcast/), and an unreadable file."""
    trie = StackTrie()
    mods = (
        module(0, 0x400000, 0x500000, 0, "/usr/bin/prog")
        + module(0, 0x7F0000000000, 0x7F0000100000, 0x7F0000000000, "/lib/libc.so.6")
        + module(0, 0x7F0000200000, 0x7F0000300000, 0x7F0000200000, "/usr/lib/libidle.so")
        + module(0, 0x7F0000400000, 0x7F0000401000, 0x7F0000400000, "linux-vdso.so.1")
        + module(0, 0x7F0000500000, 0x7F0000600000, 0x7F0000500000, "/heapcast/tracer/x.so")
    )
    # frame 0 (the caller) in libc; the stack runs on through the program
    stack = trie.id((0x7F0000000100, 0x401000, 0x402000))
    recs = [
        thread_start(1, tid=10),
        malloc(2, 24, 0x1000, caller=0x7F0000000100, stack=stack),
        free(3, 0x1000, caller=0x7F0000500010),  # from the tracer's range: skipped
    ]
    write_trace(folder / "1-1.hct", mods + trie.records() + recs, stacks=True)
    # a caller-only process (version 2 style records) whose one caller is in libm
    libm = module(0, 0x7F0000800000, 0x7F0000900000, 0x7F0000800000, "/lib/libm.so.6")
    write_trace(
        folder / "2-2.hct",
        libm + [thread_start(1, tid=11), malloc(2, 8, 0x2000, caller=0x7F0000800040)],
        caller=True,
    )
    (folder / "3-3.hct").write_bytes(b"HEAPCAST")  # killed before its header was whole


def test_named_modules_are_those_holding_a_caller_or_a_frame_and_files_of_the_image(tmp_path):
    _run_traces(tmp_path)
    # THEN the idle module, the vDSO and the tracer (not the image's file) are left out
    assert named_modules(tmp_path) == ["/lib/libc.so.6", "/lib/libm.so.6", "/usr/bin/prog"]


def test_a_trace_without_callers_names_no_module(tmp_path):
    write_trace(tmp_path / "1-1.hct", [thread_start(1, tid=10), malloc(2, 24, 0x1000)])
    assert named_modules(tmp_path) == []


def test_modules_are_copied_at_the_paths_the_traces_name_symlinks_followed(tmp_path):
    # GIVEN an image whose libc.so.6 is a link to the real file, one module deleted since
    image = StandInContainer(
        {"/usr/bin/prog": b"prog bytes", "/lib/libc-2.36.so": b"libc bytes"},
        links={"/lib/libc.so.6": "libc-2.36.so"},
    )
    sysroot = tmp_path / SYSROOT_DIR
    # WHEN the run's modules are copied
    got = copy_modules(image, ["/lib/libc.so.6", "/usr/bin/prog", "/gone.so"], sysroot, Absent)
    # THEN each is at its traced path, with the bytes of the file the link names
    assert (sysroot / "lib/libc.so.6").read_bytes() == b"libc bytes"
    assert (sysroot / "usr/bin/prog").read_bytes() == b"prog bytes"
    assert module_file("/lib/libc.so.6", sysroot) == str(sysroot / "lib/libc.so.6")
    assert got.modules == ("/lib/libc.so.6", "/usr/bin/prog") and got.missing == ("/gone.so",)
    assert got.bytes == len(b"prog bytes") + len(b"libc bytes") and got.debug_files == ()
    assert sorted(str(p.relative_to(sysroot)) for p in sysroot.rglob("*") if p.is_file()) == [
        "lib/libc.so.6",
        "usr/bin/prog",
    ]


def test_a_path_climbing_out_of_the_sysroot_stays_inside_it(tmp_path):
    image = StandInContainer({"/etc/x.so": b"x"})
    got = copy_modules(image, ["/usr/../../etc/x.so"], tmp_path / "sysroot", Absent)
    assert got.modules == ("/usr/../../etc/x.so",)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == [tmp_path / "sysroot/etc/x.so"]


def test_a_link_loop_counts_as_missing(tmp_path):
    image = StandInContainer({}, links={"/a.so": "/b.so", "/b.so": "/a.so"})
    got = copy_modules(image, ["/a.so"], tmp_path / "sysroot", Absent)
    assert got.missing == ("/a.so",) and not (tmp_path / "sysroot").exists()


def test_a_modules_separate_debug_file_comes_with_it(tmp_path):
    # GIVEN an image holding a real ELF module with a build id, and its separate debug file
    host_true = Path(shutil.which("true") or "/bin/true").resolve()
    build = build_id(host_true)
    assert build, f"{host_true} has no GNU build id"
    dbg = debug_file(build)
    assert dbg == f"/usr/lib/debug/.build-id/{build[:2]}/{build[2:]}.debug"
    image = StandInContainer({"/usr/bin/true": host_true.read_bytes(), dbg: b"debug bytes"})
    got = copy_modules(image, ["/usr/bin/true"], tmp_path, Absent)
    # THEN it is copied beside the module's copy, where Debian keeps it
    assert got.debug_files == (dbg,)
    assert (tmp_path / dbg.lstrip("/")).read_bytes() == b"debug bytes"
    assert got.bytes == host_true.stat().st_size + len(b"debug bytes")
    # and an image without it asks for it once and copies only the module
    bare = StandInContainer({"/usr/bin/true": host_true.read_bytes()})
    got = copy_modules(bare, ["/usr/bin/true"], tmp_path / "bare", Absent)
    assert got.debug_files == () and bare.asked == ["/usr/bin/true", dbg]


def test_frames_are_named_from_the_sysroot_copy_not_the_host_path(tmp_path):
    # GIVEN a module path that does not exist on this host, whose copy is in the sysroot
    host_lib = Path("/lib/x86_64-linux-gnu/libc.so.6")
    if not host_lib.is_file():
        pytest.fail(f"{host_lib} is needed: the test names a frame in a real libc")
    image = StandInContainer({"/image-only/libc.so.6": host_lib.read_bytes()})
    sysroot = tmp_path / SYSROOT_DIR
    copy_modules(image, ["/image-only/libc.so.6"], sysroot, Absent)
    table = symbol_table(str(host_lib))
    at = int(table.start[table.names.index("malloc")]) + 1  # a return address inside malloc
    # THEN the frame is named through the copy; without the sysroot it stays unnamed
    assert frame_names(["/image-only/libc.so.6"], [at], sysroot) == ["malloc"]
    assert frame_names(["/image-only/libc.so.6"], [at]) == [""]


def test_an_images_files_are_asked_of_the_engine_once(tmp_path, monkeypatch):
    # GIVEN the cache of one image id, filled by a first run
    monkeypatch.setenv("HEAPCAST_SYSROOT_CACHE", str(tmp_path / "cache"))
    cache = image_cache("heapcast/prog:bookworm", "sha256:" + "a" * 64)
    first = StandInContainer({"/usr/bin/prog": b"prog bytes"})
    copy_modules(first, ["/usr/bin/prog"], tmp_path / "run1", Absent, cache)
    # WHEN a second run of that image copies the same module
    second = StandInContainer({"/usr/bin/prog": b"prog bytes"})
    got = copy_modules(second, ["/usr/bin/prog"], tmp_path / "run2", Absent, cache)
    # THEN it comes from the cache: no request to the engine, the same bytes
    assert second.asked == [] and got.modules == ("/usr/bin/prog",) and got.bytes == 10
    assert (tmp_path / "run2/usr/bin/prog").read_bytes() == b"prog bytes"
    # and the image rebuilt (a new id) starts a new cache, the old one gone
    rebuilt = image_cache("heapcast/prog:bookworm", "sha256:" + "b" * 64)
    assert rebuilt != cache and not cache.exists() and rebuilt.parent == cache.parent
