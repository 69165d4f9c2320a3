"""The local runner's memory and pid limits, on real programs compiled here.

`hog` allocates (and touches) 1 KiB blocks up to a cap, then exits 0; `forker` forks children
that wait, then reaps them and exits 0. Over a limit the run must fail naming the limit and keep
what the tracer flushed (both make tens of thousands of heap calls first, so buffers were
written); under the limits the same programs succeed. Without the limits both would end well,
so these tests fail when a limit is not enforced."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tasks.core.storage import Root
from tasks.format.trace_reader import read_trace
from tasks.replay.manifest import MANIFEST_NAME, RunManifest
from tasks.replay.replays import ReplayFailed, replay_input
from tasks.replay.runners import limits as limits_mod
from tasks.replay.runners.base import RunRequest
from tasks.replay.runners.limits import RunLimits
from tasks.replay.runners.local_runner import LocalRunner, bwrap_works
from tasks.replay.workloads import Workload
from tests.conftest import need_tool
from tests.tasks.replay.replay_checks import reachable_by_nobody, run_request, tracer_path

HOG_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
    long cap_mb = atol(argv[1]);
    /* churn first: 40,000 heap calls, so the tracer has written whole buffers to the trace
       (through a volatile pointer: a compiler may drop a malloc whose block is never used) */
    for (int i = 0; i < 20000; i++) { void *volatile q = malloc(64); free(q); }
    for (long kb = 1; kb <= cap_mb * 1024; kb++) {
        char *p = malloc(1024);
        if (!p) { perror("malloc"); return 2; }
        memset(p, 1, 1024); /* touched: counted by the memory cgroup */
        if (kb % (16 * 1024) == 0) { printf("hog: %ld MiB\n", kb / 1024); fflush(stdout); }
    }
    printf("hog: reached %ld MiB\n", cap_mb);
    return 0;
}
"""

FORKER_C = r"""
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
/* forker N retry|exit: fork N children that wait; a refused fork is retried (as a build tool
   might, forever: only the runner can stop it) or ends the program with 1 */
int main(int argc, char **argv) {
    int n = atoi(argv[1]), retry = strcmp(argv[2], "retry") == 0;
    pid_t kids[4096];
    for (int i = 0; i < 20000; i++) { void *volatile q = malloc(64); free(q); }
    for (int i = 0; i < n; i++) {
        pid_t pid;
        while ((pid = fork()) < 0) {
            fprintf(stderr, "forker: fork %d refused: %s\n", i, strerror(errno));
            if (!retry) return 1;
            usleep(20000);
        }
        if (pid == 0) { pause(); _exit(0); }
        kids[i] = pid;
    }
    printf("forker: %d children\n", n);
    for (int i = 0; i < n; i++) kill(kids[i], SIGTERM);
    for (int i = 0; i < n; i++) waitpid(kids[i], NULL, 0);
    return 0;
}
"""


class ProgramsWorkload(Workload):
    """A catalog workload whose {bin} is the folder of the programs compiled here."""

    programs_dir: str

    @property
    def bin_dir(self) -> Path:
        return Path(self.programs_dir)


@pytest.fixture(scope="module")
def programs(tmp_path_factory) -> Path:
    gcc = need_tool("gcc", "gcc libc6-dev")
    out = tmp_path_factory.mktemp("limit-programs")
    for name, source in (("hog", HOG_C), ("forker", FORKER_C)):
        src = out / f"{name}.c"
        src.write_text(source)
        subprocess.run([gcc, "-O1", "-Wall", "-o", str(out / name), str(src)], check=True)
    # the programs run as nobody (bound into the sandbox, or straight from here)
    reachable_by_nobody(out)
    return out


@pytest.fixture(scope="module")
def tracer() -> Path:
    return tracer_path()


@pytest.fixture(scope="module")
def cgroups() -> None:
    """Skip where this host lets no cgroup be made (no root, no delegation): the fallback test
    below covers that case, and the limits are then reported as not enforced."""
    probe = RunLimits("64m", 16, name="probe").setup(None)
    try:
        if not probe.version:
            pytest.skip(
                "no cgroup with memory and pids can be made here: " + probe.enforcement.memory
            )
    finally:
        probe.close()


def workload(programs: Path, name: str, command: list[str], **limits) -> ProgramsWorkload:
    return ProgramsWorkload(
        name=name,
        image="cpython",  # any image of the catalog: the local runner only uses its name
        command=command,
        inputs=[{"name": "small", "seed": 1, "size": 1}],
        time_limit_s=60,  # far beyond these programs' needs: hitting it is a failure here
        programs_dir=str(programs),
        **limits,
    )


def replay(w: Workload, root: Path) -> RunManifest:
    return replay_input(
        w, w.input("small"), tracer_path(), root=Root.from_url(str(root)), runner="local"
    )


def failed_replay(w: Workload, root: Path, match: str) -> RunManifest:
    with pytest.raises(ReplayFailed, match=match) as err:
        replay(w, root)
    m = err.value.manifest
    # the manifest published with the partial trace is the one that says why
    run_dir = root / "raw" / w.name / "small"
    assert RunManifest.from_json((run_dir / MANIFEST_NAME).read_bytes()) == m
    assert not m.ok and not m.timed_out
    assert m.files and m.events >= 8192  # whole buffers the tracer flushed before the stop
    return m


def run_cgroups_left() -> dict[str, str]:
    """The cgroups of this module's runs (its programs `hog` and `forker`) still on the host,
    each with the processes in it (what kept it); another test's runs beside these (the suite
    over several cores) have cgroups of their own names."""
    tree = Path(limits_mod.CGROUP_ROOT)

    def procs(d: Path) -> str:
        pids = (d / "cgroup.procs").read_text().split() if (d / "cgroup.procs").exists() else []
        seen = []
        for pid in pids:
            cmd = Path(f"/proc/{pid}/cmdline")
            args = cmd.read_bytes().replace(b"\0", b" ").decode()[:200] if cmd.exists() else "?"
            seen.append(f"{pid}: {args}")
        return "; ".join(seen)

    return {
        str(p): procs(p)
        for pattern in ("heapcast-hog-*", "heapcast-forker-*")
        for p in tree.rglob(pattern)
        if p.is_dir()
    }


def test_memory_over_the_limit_is_killed_named_and_keeps_its_trace(
    programs, tracer, cgroups, tmp_path
):
    # GIVEN a program that would touch 1 GiB, and a 64 MiB memory limit
    w = workload(programs, "hog", ["{bin}/hog", "1024"], memory="64m")
    # WHEN it is replayed THEN it is killed and the run fails naming the limit, docker's words
    m = failed_replay(w, tmp_path, r"killed by the memory limit \(64m\); raise `memory`")
    assert "reached" not in m.log_tail
    # AND the next run goes on: the same program under the limit succeeds in the same root
    ok = replay(workload(programs, "hog", ["{bin}/hog", "16"], memory="64m"), tmp_path / "next")
    assert ok.ok and ok.error is None and "hog: reached 16 MiB" in ok.log_tail
    left = run_cgroups_left()
    assert not left, left


def test_forks_over_the_pid_limit_are_stopped_named_and_keep_the_trace(
    programs, tracer, cgroups, tmp_path
):
    # GIVEN a program that forks 64 children, retrying a refused fork forever, and 16 pids
    w = workload(programs, "forker", ["{bin}/forker", "64", "retry"], pids_limit=16)
    # WHEN it is replayed THEN the runner stops it at the first refused fork, naming the limit
    m = failed_replay(w, tmp_path, r"pid limit \(16 processes\).*raise `pids_limit`")
    assert "fork" in m.log_tail and "forker: 64 children" not in m.log_tail
    # AND its children went with it: nothing of the run is left on the host
    left = run_cgroups_left()
    assert not left, left
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert f"{programs}/forker" not in ps and "/heapcast/bin/forker" not in ps


def test_runs_under_the_limits_are_unaffected(programs, tracer, cgroups, tmp_path):
    # GIVEN the same programs well under the same limits
    hog = workload(programs, "hog", ["{bin}/hog", "16"], memory="64m")
    forker = workload(programs, "forker", ["{bin}/forker", "6", "exit"], pids_limit=16)
    # WHEN they are replayed THEN both succeed as without limits, their traces complete
    for w, done in ((hog, "hog: reached 16 MiB"), (forker, "forker: 6 children")):
        m = replay(w, tmp_path)
        assert m.ok and m.exit_code == 0 and m.error is None and done in m.log_tail


def test_the_result_says_how_each_limit_is_enforced(programs, tracer, cgroups, tmp_path):
    w = workload(programs, "hog", ["{bin}/hog", "1"], memory="64m", pids_limit=20)
    res = LocalRunner().run(_request(w, tmp_path))
    assert res.exit_code == 0 and res.warnings == []
    assert res.limits["memory"].startswith("cgroup v") and "64m" in res.limits["memory"]
    assert res.limits["pids"].startswith("cgroup v") and "pids.max 20" in res.limits["pids"]


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
def test_without_a_cgroup_the_result_and_log_say_which_limits_are_not_enforced(
    programs, tracer, tmp_path, monkeypatch, sandbox
):
    if sandbox == "bwrap" and not bwrap_works():
        pytest.skip("bubblewrap cannot create its namespaces here")
    # GIVEN a host where no cgroup can be made
    monkeypatch.setattr(RunLimits, "_make_v2", lambda self: False)
    monkeypatch.setattr(RunLimits, "_make_v1", lambda self: False)
    # WHEN a program forks more children than the pid limit, ending at a refused fork
    w = workload(programs, "forker", ["{bin}/forker", "64", "exit"], memory="64m", pids_limit=16)
    res = LocalRunner(sandbox=sandbox).run(_request(w, tmp_path))
    # THEN the memory limit is reported as not enforced, in the result and in the run's log
    assert any("memory limit 64m not enforced" in n for n in res.warnings)
    assert res.limits["memory"].startswith("NOT ENFORCED")
    assert "heapcast local runner: memory limit 64m not enforced" in res.log_tail
    # AND the pid limit is RLIMIT_NPROC, which refuses the fork (nothing detects it: the
    # program's own failure is all there is to see), or, where that cannot hold (the run's
    # processes are root, or another uid without CAP_SYS_RESOURCE), is said not to be enforced
    if res.limits["pids"].startswith("RLIMIT_NPROC"):
        assert res.exit_code == 1 and "refused" in res.log_tail and res.error is None
    else:
        assert res.limits["pids"].startswith("NOT ENFORCED")
        assert any("pid limit 16 not enforced" in n for n in res.warnings)
        assert "heapcast local runner: pid limit 16 not enforced" in res.log_tail
        assert res.exit_code == 0 and "forker: 64 children" in res.log_tail


def test_unsandboxed_runs_get_the_limits_and_the_gate_is_not_traced(
    programs, tracer, cgroups, tmp_path
):
    # GIVEN the program straight on the host, behind the runner's gate shell
    small = workload(programs, "hog", ["{bin}/hog", "4"], memory="64m")
    res = LocalRunner(sandbox="none").run(_request(small, tmp_path / "small"))
    # THEN it runs with exactly its environment, and the only traced process is the program
    assert res.exit_code == 0 and res.error is None and res.limits["memory"].startswith("cgroup")
    traces = list((tmp_path / "small" / "trace").glob("*.hct"))
    assert len(traces) == 1
    assert read_trace(traces[0]).header.cmdline[0] == f"{programs}/hog"
    # AND over the limit it is killed and named as in the sandbox
    big = workload(programs, "hog", ["{bin}/hog", "1024"], memory="64m")
    res = LocalRunner(sandbox="none").run(_request(big, tmp_path / "big"))
    assert res.error == "killed by the memory limit (64m); raise `memory` in the catalog"
    assert res.exit_code == 137 and list((tmp_path / "big" / "trace").glob("*.hct"))


def _request(w: Workload, tmp_path: Path) -> RunRequest:
    tmp_path.mkdir(exist_ok=True)
    reachable_by_nobody(tmp_path)
    return run_request(w, tmp_path, tracer_path())
