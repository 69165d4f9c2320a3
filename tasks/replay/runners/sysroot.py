"""A container run's modules, copied home so that its frames can be named.

A replay in a container runs the image's programs and libraries, not this host's: the return
addresses in its traces (callers, stack frames) are offsets in the image's files. After the run,
before its container is removed, the docker runner copies the modules the run's traces name in
a caller or a stack frame out of the container into `<trace dir>/sysroot/<path>`: each once per
run, stored at the path the trace names (symlinks in the image followed), with its separate debug
file when the image has one (`/usr/lib/debug/.build-id/<xx>/<rest>.debug`, Debian's -dbgsym
packages). `tasks/format/frames.module_file(module, sysroot)` reads them there; the dataset reads
`sysroot/` beside the traces. Each file of an image is asked of the engine once: later runs of the
same image take it from a cache on this host (`image_cache`; hard links where they can).

Not copied: unnamed mappings and the vDSO (no file), modules under /heapcast/ (the tracer, host
libraries and host mounts: this host's own files, not the image's), modules the image no longer
has (`missing`: a file deleted after it was loaded). The cost on the catalog: docs/tracing.md.
"""

from __future__ import annotations

import io
import os
import posixpath
import shutil
import tarfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from tasks.format.trace_reader import TRACE_SUFFIX, TraceFormatError, read_trace

SYSROOT_DIR = "sysroot"  # in a run's trace folder, beside its traces and manifest
SANDBOX_PREFIX = "/heapcast/"  # the runners' own folders and host mounts (base.py's layout)
DEBUG_BUILD_ID = "/usr/lib/debug/.build-id"
LINK_HOPS = 8  # symlinks followed from a module's path (libfoo.so.1 -> libfoo.so.1.2.3)


@dataclass(frozen=True)
class SysrootCopy:
    """What a run's sysroot received: module paths as the traces name them."""

    modules: tuple[str, ...]  # copied
    debug_files: tuple[str, ...]  # their separate debug files, as paths in the image
    missing: tuple[str, ...]  # named by the traces, absent from the image
    bytes: int  # modules and debug files together
    seconds: float


def image_cache(image: str, image_id: str) -> Path:
    """The folder that keeps image `image`'s files copied so far (its id `image_id`), made
    empty of the files of the image's earlier ids: one id an image is kept. Under
    $HEAPCAST_SYSROOT_CACHE, else $XDG_CACHE_HOME/heapcast/sysroot, else ~/.cache/..."""
    base = os.environ.get("HEAPCAST_SYSROOT_CACHE")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "heapcast", "sysroot")
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in image)
    folder = Path(base) / name
    keep = image_id.removeprefix("sha256:")[:32]
    if folder.is_dir():
        for old in folder.iterdir():  # an image's earlier builds (one or two)
            if old.name != keep:
                shutil.rmtree(old, ignore_errors=True)
    return folder / keep


def image_module(path: str) -> bool:
    """Whether a module path names a file of the image (not the vDSO, an unnamed mapping, a
    relative name, or one of the runner's own files under /heapcast/)."""
    return path.startswith("/") and not path.startswith(SANDBOX_PREFIX)


def named_modules(trace_dir: Path) -> list[str]:
    """The image modules that hold a caller or a stack frame of any trace in `trace_dir`, each
    once, sorted. Traces without a module map (no caller, no stacks) and unreadable ones name
    none. Vectorised per trace: one `locate` over its callers and its stack nodes' frames."""
    names: set[str] = set()
    for path in sorted(Path(trace_dir).glob(f"*{TRACE_SUFFIX}")):  # a loop over processes
        try:
            t = read_trace(path)
        except TraceFormatError:  # the run's manifest lists it as unreadable
            continue
        if t.modules is None or len(t.modules) == 0:
            continue
        parts = [a for a in (t.caller, t.stacks.address if t.stacks else None) if a is not None]
        if not parts:
            continue
        idx, _ = t.modules.locate(np.concatenate(parts))
        used = np.flatnonzero(np.bincount(idx[idx >= 0], minlength=len(t.modules)))
        names.update(t.modules.path[int(i)] for i in used)
    return sorted(p for p in names if image_module(p))


def build_id(path: Path) -> str | None:
    """An ELF file's GNU build id (hex), or None (no note, not ELF)."""
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            for sec in elf.iter_sections():
                if sec.header.sh_type != "SHT_NOTE":
                    continue
                for note in sec.iter_notes():
                    if note["n_type"] == "NT_GNU_BUILD_ID" and note["n_name"] == "GNU":
                        return str(note["n_desc"])
    except (OSError, ELFError, ValueError, KeyError):
        return None
    return None


def debug_file(build: str) -> str:
    """Where Debian keeps the separate debug file of the module with build id `build`."""
    return f"{DEBUG_BUILD_ID}/{build[:2]}/{build[2:]}.debug"


class _Chunks(io.RawIOBase):
    """A readable file over an iterator of byte chunks (the engine's archive stream)."""

    def __init__(self, chunks: Iterator[bytes]):
        self._chunks = chunks
        self._left = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        while not self._left:
            try:
                self._left = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(buf), len(self._left))
        buf[:n] = self._left[:n]
        self._left = self._left[n:]
        return n

    def drain(self) -> None:
        """Read what is left, so the engine's connection can be reused."""
        for _ in self._chunks:
            pass


def archive(container, path: str, not_found: type[Exception], hops: int = LINK_HOPS):
    """(tar stream, stat) of `path` in a container's file system, symlinks followed (the
    engine's stat reports a symlink's target as `linkTarget`; folders above it are resolved by
    the engine); None when it is absent or a link chain runs longer than `hops`."""
    for _ in range(hops + 1):
        try:
            stream, stat = container.get_archive(path)
        except not_found:
            return None
        target = stat.get("linkTarget") or ""
        if not target:
            return stream, stat
        _Chunks(iter(stream)).drain()
        nxt = target if target.startswith("/") else posixpath.join(posixpath.dirname(path), target)
        path = posixpath.normpath(nxt)
    return None


def copy_file(container, path: str, dest: Path, not_found: type[Exception]) -> int | None:
    """Copy the regular file at `path` in the container to `dest`; its size, or None when the
    container has no such file (absent, a folder, a dangling link)."""
    found = archive(container, path, not_found)
    if found is None:
        return None
    stream, _stat = found
    chunks = _Chunks(iter(stream))
    size = None
    try:
        with tarfile.open(fileobj=io.BufferedReader(chunks, 1 << 20), mode="r|") as tar:
            for member in tar:  # the engine's archive of one path: the file is its one member
                if not member.isfile():
                    continue
                src = tar.extractfile(member)
                dest.parent.mkdir(parents=True, exist_ok=True)
                with open(dest, "wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
                size = member.size
                break
    finally:
        chunks.drain()
    return size


def _place(src: Path, dest: Path) -> None:
    """`dest` becomes `src`'s content: a hard link where both are on one file system (the
    files are never written again), else a copy; through a temporary name, so that a reader
    (or a replay running beside this one) never sees half a file."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{threading.get_ident()}.part")
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dest)


class ImageFiles:
    """A container's files, through a cache of what earlier runs of the same image copied.

    An image's files never change (its id is its content's hash), and a workload's inputs run
    the same image, so each file of an image is asked of the engine once: `cache` (a folder for
    this image id; None: no cache) keeps them."""

    def __init__(self, container, not_found: type[Exception], cache: Path | None = None):
        self.container = container
        self.not_found = not_found
        self.cache = cache

    def copy(self, path: str, dest: Path) -> int | None:
        """Copy the file at `path` to `dest`; its size, or None when the image has none."""
        cached = self.cache / path.lstrip("/") if self.cache is not None else None
        if cached is not None and cached.is_file():
            _place(cached, dest)
            return cached.stat().st_size
        size = copy_file(self.container, path, dest, self.not_found)
        if size is not None and cached is not None:
            try:
                _place(dest, cached)
            except OSError:  # a cache that cannot be written only costs the next run time
                pass
        return size


def copy_modules(
    container,
    modules: Iterable[str],
    sysroot: Path,
    not_found: type[Exception],
    cache: Path | None = None,
) -> SysrootCopy:
    """Copy each module (a path in the container) to `sysroot/<path>`, and its separate debug
    file when the image has one; one engine request a file (two for a module with a build id),
    none for a file already in `cache` (this image's, see ImageFiles)."""
    t0 = time.monotonic()
    files = ImageFiles(container, not_found, cache)
    copied: list[str] = []
    debug: list[str] = []
    missing: list[str] = []
    total = 0
    for module in modules:  # a loop over the run's modules (tens), not its events
        norm = posixpath.normpath(module)  # no '..' can climb out of the sysroot
        dest = sysroot / norm.lstrip("/")
        if dest.is_file():  # named twice (two spellings of one path)
            continue
        size = files.copy(norm, dest)
        if size is None:
            missing.append(module)
            continue
        copied.append(module)
        total += size
        build = build_id(dest)
        if build is None or len(build) < 3:
            continue
        dbg = debug_file(build)
        size = files.copy(dbg, sysroot / dbg.lstrip("/"))
        if size is not None:
            debug.append(dbg)
            total += size
    return SysrootCopy(
        modules=tuple(copied),
        debug_files=tuple(debug),
        missing=tuple(missing),
        bytes=total,
        seconds=round(time.monotonic() - t0, 3),
    )
