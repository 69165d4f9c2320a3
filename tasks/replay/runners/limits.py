"""Memory and pid limits for the local runner: a cgroup of its own per run, else rlimits.

The docker runner gets its limits from the engine; the local runner makes a cgroup per run, under
its own cgroup: v2 (`memory.max`, `memory.swap.max` 0, `pids.max`) or v1 (a hybrid host:
`memory.limit_in_bytes`, `memory.memsw.limit_in_bytes`, `pids.max`), and reads an exceeded limit
from the events files. Where no cgroup can be made (no root, no delegated cgroup) the pid limit
becomes RLIMIT_NPROC over the run user's processes, the memory limit is not enforced, and
`enforcement` says so. The program must be in its cgroup before it can fork: the runner starts it
behind a gate, places the gate's pid with `attach`, then opens the gate. Why cgroups, and the files
read: docs/tracing.md#the-local-runners-limits.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
REMOVE_WAIT_S = 30.0  # for a run's killed processes to leave its cgroup, at most
UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
# How long a stop waits for SIGTERMed processes (the tracer of a program that exits on SIGTERM
# flushes its buffers) before SIGKILL.
TERM_GRACE_S = 2.0


def parse_memory(text: str) -> int:
    """Bytes of a catalog `memory` ("512m", "2g", "65536"): docker's units, powers of 1024."""
    m = re.fullmatch(r"([0-9]+)([kmg]?)", text.strip().lower())
    if m is None:
        raise ValueError(f"bad memory size {text!r}: a number with an optional k, m or g")
    return int(m.group(1)) * UNITS[m.group(2)]


def memory_limit_message(memory: str) -> str:
    # the docker runner's wording, so a failed run reads the same whichever runner ran it
    return f"killed by the memory limit ({memory}); raise `memory` in the catalog"


def pids_limit_message(pids: int) -> str:
    return (
        f"stopped at the pid limit ({pids} processes): a fork was refused; "
        "raise `pids_limit` in the catalog"
    )


@dataclass
class Enforcement:
    """How each limit of one run is enforced, in words (kept in the run's result and log)."""

    memory: str
    pids: str
    time: str = "the runner's timer (SIGTERM, then SIGKILL)"
    unenforced: list[str] = field(default_factory=list)  # what could not be enforced, and why

    def as_dict(self) -> dict[str, str]:
        return {"memory": self.memory, "pids": self.pids, "time": self.time}


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _count(text: str, key: str) -> int:
    """The value of `key N` in a flat-keyed cgroup file (memory.events, pids.events, ...)."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            return int(parts[1])
    return 0


def _own_cgroups() -> dict[str, str]:
    """{controller or "" for v2: this process's cgroup path}, from /proc/self/cgroup."""
    out: dict[str, str] = {}
    for line in _read(Path("/proc/self/cgroup")).splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            out[c] = path
    return out


def _mounts() -> list[tuple[str, Path, str, set[str]]]:
    """(fstype, mount point, mount root, super options) of every cgroup mount."""
    out = []
    for line in _read(Path("/proc/self/mountinfo")).splitlines():
        pre, _, post = line.partition(" - ")
        pre_f, post_f = pre.split(), post.split()
        if len(post_f) < 3 or post_f[0] not in ("cgroup", "cgroup2"):
            continue
        out.append((post_f[0], Path(pre_f[4]), pre_f[3], set(post_f[2].split(","))))
    return out


def _under(mount: Path, mount_root: str, path: str) -> Path | None:
    """Where cgroup `path` (as /proc/self/cgroup names it) is below a mount of its hierarchy."""
    rel = os.path.relpath(path, mount_root)
    if rel.startswith(".."):
        return None
    return (mount / rel).resolve() if rel != "." else mount


class RunLimits:
    """The limits of one run: made before it starts, `attach`ed to its first process, polled
    while it runs (`exceeded`), and `close`d after it (leftover processes killed, cgroup gone)."""

    def __init__(self, memory: str, pids: int, name: str = "run"):
        self.memory = memory
        self.memory_bytes = parse_memory(memory)
        self.pids = pids
        self.tag = f"heapcast-{re.sub(r'[^a-zA-Z0-9_.-]', '_', name)[:60]}-{uuid.uuid4().hex[:8]}"
        self.version = 0  # 2 or 1: a cgroup per run; 0: rlimits
        self.dirs: dict[str, Path] = {}  # v2: {"": dir}; v1: {"memory": dir, "pids": dir}
        self.enforcement = Enforcement(memory="", pids="")
        self._nproc_uid: int | None = None

    # -- setting up --------------------------------------------------------------------------

    def setup(self, run_uid: int | None) -> RunLimits:
        """Make the run's cgroup (v2, else v1), else plan rlimits; `run_uid` is the uid the
        program's processes have on the host (RLIMIT_NPROC counts that uid's processes)."""
        reasons: list[str] = []
        for make in (self._make_v2, self._make_v1):
            try:
                if make():
                    return self
            except OSError as err:
                self._remove_dirs()
                self.version = 0
                reasons.append(f"{make.__name__.removeprefix('_make_')}: {err}")
        why = "; ".join(reasons) or "no cgroup hierarchy with the memory and pids controllers"
        self._nproc_uid = run_uid if run_uid is not None else os.getuid()
        self.enforcement = Enforcement(
            memory=f"NOT ENFORCED ({self.memory} asked): no cgroup could be made ({why})",
            pids=(
                f"RLIMIT_NPROC: {self.pids} more processes of uid {self._nproc_uid} "
                "(no cgroup could be made); a refused fork is not detected"
            ),
        )
        self.enforcement.unenforced.append(
            f"memory limit {self.memory} not enforced: no cgroup could be made ({why})"
        )
        if self._nproc_uid == 0:
            # root is exempt from RLIMIT_NPROC: the limit would be a line in a report, no more
            self.enforcement.pids = (
                f"NOT ENFORCED ({self.pids} asked): no cgroup, and the program's processes are "
                "root on the host, whom RLIMIT_NPROC does not hold"
            )
            self.enforcement.unenforced.append(
                f"pid limit {self.pids} not enforced: no cgroup, and the program's processes "
                "are root on the host, whom RLIMIT_NPROC does not hold"
            )
        return self

    def _make_v2(self) -> bool:
        own = _own_cgroups().get("")
        mount = next((m for m in _mounts() if m[0] == "cgroup2"), None)
        if own is None or mount is None:
            return False
        here = _under(mount[1], mount[2], own)
        if here is None or not {"memory", "pids"} <= set(
            _read(here / "cgroup.controllers").split()
        ):
            return False  # a hybrid host's v2 tree without these controllers: try v1
        parent = self._v2_parent(here)
        if parent is None:
            return False
        d = parent / self.tag
        d.mkdir()
        self.version, self.dirs = 2, {"": d}
        (d / "memory.max").write_text(str(self.memory_bytes))
        with contextlib.suppress(FileNotFoundError):  # no swap accounting: nothing to swap to
            (d / "memory.swap.max").write_text("0")
        (d / "pids.max").write_text(str(self.pids))
        self.enforcement = Enforcement(
            memory=f"cgroup v2 memory.max {self.memory} ({d})",
            pids=f"cgroup v2 pids.max {self.pids} ({d})",
        )
        return True

    @staticmethod
    def _v2_parent(here: Path) -> Path | None:
        """Where a run cgroup with the memory and pids controllers can be made: below our own
        cgroup when its children get them (the root, or a delegated cgroup with no processes
        of its own), else beside it (v2 forbids controllers below a cgroup with processes)."""
        want = {"memory", "pids"}
        if want <= set(_read(here / "cgroup.subtree_control").split()):
            return here
        try:
            (here / "cgroup.subtree_control").write_text("+memory +pids")
            return here
        except OSError:
            pass
        up = here.parent
        if here != up and want <= set(_read(up / "cgroup.subtree_control").split()):
            return up
        return None

    def _make_v1(self) -> bool:
        own = _own_cgroups()
        places: dict[str, Path] = {}
        for fstype, mount, root, opts in _mounts():
            for c in ("memory", "pids"):
                if fstype == "cgroup" and c in opts and c in own:
                    where = _under(mount, root, own[c])
                    if where is not None:
                        places[c] = where
        if set(places) != {"memory", "pids"}:
            return False
        self.version = 1
        for c, where in places.items():
            d = where / self.tag
            d.mkdir()
            self.dirs[c] = d
        mem = self.dirs["memory"]
        (mem / "memory.limit_in_bytes").write_text(str(self.memory_bytes))
        memsw = mem / "memory.memsw.limit_in_bytes"
        if memsw.exists():  # with swap accounting: no swapping past the limit either
            memsw.write_text(str(self.memory_bytes))
        (self.dirs["pids"] / "pids.max").write_text(str(self.pids))
        self.enforcement = Enforcement(
            memory=f"cgroup v1 memory.limit_in_bytes {self.memory} ({mem})",
            pids=f"cgroup v1 pids.max {self.pids} ({self.dirs['pids']})",
        )
        return True

    # -- running -----------------------------------------------------------------------------

    def attach(self, pid: int) -> None:
        """Put the (gated, not yet running) first process of the run under the limits; a limit
        that cannot be set this way is said in `enforcement` (the run goes on without it)."""
        if self.version:
            for d in self.dirs.values():
                (d / "cgroup.procs").write_text(str(pid))
            return
        if self._nproc_uid is not None and self._nproc_uid != 0:
            # RLIMIT_NPROC counts every process of the uid, so the run's allowance goes on top
            # of those the uid already has
            limit = _processes_of(self._nproc_uid) + self.pids
            try:
                resource.prlimit(pid, resource.RLIMIT_NPROC, (limit, limit))
            except OSError as err:  # another uid's process, and no CAP_SYS_RESOURCE
                self.enforcement.pids = (
                    f"NOT ENFORCED ({self.pids} asked): no cgroup, and RLIMIT_NPROC could not "
                    f"be set ({err})"
                )
                self.enforcement.unenforced.append(
                    f"pid limit {self.pids} not enforced: no cgroup, and RLIMIT_NPROC could "
                    f"not be set ({err})"
                )

    def _memory_dir(self) -> Path | None:
        return self.dirs.get("" if self.version == 2 else "memory")

    def _pids_dir(self) -> Path | None:
        return self.dirs.get("" if self.version == 2 else "pids")

    def oom_kills(self) -> int:
        d = self._memory_dir()
        if d is None:
            return 0
        if self.version == 2:
            return _count(_read(d / "memory.events"), "oom_kill")
        return _count(_read(d / "memory.oom_control"), "oom_kill")

    def refused_forks(self) -> int:
        d = self._pids_dir()
        return _count(_read(d / "pids.events"), "max") if d is not None else 0

    def exceeded(self) -> str | None:
        """The failure message when a limit was hit (memory first: an OOM kill is the cause
        of what follows), else None."""
        if self.oom_kills():
            return memory_limit_message(self.memory)
        if self.refused_forks():
            return pids_limit_message(self.pids)
        return None

    def processes(self) -> list[int]:
        d = self._pids_dir()
        if d is None:
            return []
        return [int(p) for p in _read(d / "cgroup.procs").split()]

    def stop(self, grace_s: float = TERM_GRACE_S) -> None:
        """SIGTERM every process of the run, SIGKILL those left after `grace_s`."""
        if not self.version:
            return
        _signal_all(self.processes(), signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.kill()

    def kill(self) -> None:
        """SIGKILL every process of the run until none is left (one may be forking meanwhile)."""
        if not self.version:
            return
        if self.version == 2 and (self.dirs[""] / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                (self.dirs[""] / "cgroup.kill").write_text("1")
        for _ in range(200):
            left = self.processes()
            if not left:
                return
            _signal_all(left, signal.SIGKILL)
            time.sleep(0.02)

    def close(self) -> None:
        """Kill what the run left behind (a daemon it started) and remove its cgroup."""
        self.kill()
        self._remove_dirs()

    def _remove_dirs(self) -> None:
        for d in self.dirs.values():
            # a killed process leaves its cgroup a moment after it dies, and a while after on a
            # machine whose cores are busy: the cgroup is removed as soon as it can be
            deadline = time.monotonic() + REMOVE_WAIT_S
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.02)
        self.dirs = {}


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _processes_of(uid: int) -> int:
    n = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        for line in _read(status).splitlines():
            if line.startswith("Uid:"):
                n += line.split()[1] == str(uid)
                break
    return n
