"""fork and exec: every process image writes its own file; nothing is lost or duplicated."""

from __future__ import annotations

import pytest

from tasks.format.trace_reader import Op

M, F, START = int(Op.MALLOC), int(Op.FREE), int(Op.THREAD_START)


def op_sizes(trace) -> list[tuple[int, int]]:
    return list(zip(trace.op.tolist(), trace.size.tolist()))


def _parent_and_child_pid(run, files: int):
    """The run exited 0, quietly, and left `files` traces: the parent's trace and the child's
    pid (the program prints it second)."""
    assert run.proc.returncode == 0, run.proc.stderr
    assert run.proc.stderr == ""
    child_pid = int(run.proc.stdout.split()[1])
    assert len(run.traces) == files
    return next(t for t in run.traces if t.header.pid != child_pid), child_pid


@pytest.mark.parametrize("how", ["exit", "_exit"])
def test_fork_child_writes_its_own_file(program, run_traced, assert_frees_paired, how):
    # GIVEN a parent holding 3 unflushed malloc(111) records when it forks
    exe = program("fork")

    # WHEN the child mallocs/frees 222 twice and leaves with exit() or _exit()
    run = run_traced([exe, how])

    # THEN there are two files: the parent's and the child's, whose ppid is the parent
    parent, child_pid = _parent_and_child_pid(run, files=2)
    child = next(t for t in run.traces if t.header.pid == child_pid)
    assert child.header.ppid == parent.header.pid
    assert child.header.cmdline == parent.header.cmdline == (str(exe), how)

    # AND the child's file has only the child's calls (the inherited buffer was discarded),
    # with its own thread 0 whose tid is the child's pid
    assert op_sizes(child) == [(START, 0), (M, 222), (M, 222), (F, 0), (F, 0)]
    assert child.arg[0] == child_pid
    assert set(child.thread.tolist()) == {0}
    # AND the parent's file has each parent call exactly once (then stdio's buffer for printf)
    assert op_sizes(parent) == [
        (START, 0),
        (M, 111),
        (M, 111),
        (M, 111),
        (M, 333),
        (F, 0),
        (F, 0),
        (F, 0),
        (F, 0),
        (M, 4096),
    ]
    assert parent.arg[0] == parent.header.pid
    for t in (parent, child):
        assert_frees_paired(t)


@pytest.mark.parametrize(
    "how", ["execve", "execv", "execvp", "execvpe", "execl", "execlp", "execle"]
)
def test_fork_then_exec_traces_each_image(program, run_traced, how):
    # GIVEN a forked child with an unflushed malloc(222) record
    exe = program("forkexec")

    # WHEN the child execs this program again (which mallocs and frees 444, exits 5)
    run = run_traced([exe, how])

    # THEN three files: parent, the child before exec (buffer flushed by the exec hook),
    # and the exec'd image (same pid, its own file)
    parent, child_pid = _parent_and_child_pid(run, files=3)
    pre_exec = next(
        t for t in run.traces if t.header.pid == child_pid and t.header.cmdline[-1] == how
    )
    post_exec = run.by_cmd("exec-child")
    assert op_sizes(parent) == [(START, 0), (M, 111), (M, 333), (F, 0), (F, 0), (M, 4096)]
    assert op_sizes(pre_exec) == [(START, 0), (M, 222)]
    assert op_sizes(post_exec) == [(START, 0), (M, 444), (F, 0)]
    assert pre_exec.header.ppid == post_exec.header.ppid == parent.header.pid
    assert post_exec.header.pid == child_pid
    assert post_exec.header.start_realtime_ns > pre_exec.header.start_realtime_ns


def test_exec_without_fork_flushes_before_the_image_is_replaced(program, run_traced):
    # GIVEN a process with one unflushed malloc(555) record
    exe = program("forkexec")

    # WHEN it execs itself directly
    run = run_traced([exe, "self"])

    # THEN the old image's record is in its file and the new image has its own file, same pid
    assert run.proc.returncode == 5, run.proc.stderr
    before, after = run.traces
    assert before.header.cmdline == (str(exe), "self")
    assert after.header.cmdline == (str(exe), "exec-child")
    assert before.header.pid == after.header.pid
    assert op_sizes(before) == [(START, 0), (M, 555)]
    assert op_sizes(after) == [(START, 0), (M, 444), (F, 0)]
