"""Right stacks, or none (issue 64; FORMAT.md, Stacks): a program with a known call tree
(programs/calltree.c, which forks and execs programs/calltree_cxx.cpp) is traced with
HEAPCAST_FRAMES, and each allocation's recorded stack, resolved to function names from the
program's own symbols, is the path it came from: malloc's caller first, then each caller up to
main (or a thread's body), then libc's start frames up to the program's `_start` (a thread's
stack ends in libc, where the thread started). The program is built at -O2 as Debian builds,
without frame pointers and with them; tracing changes neither its output nor its exit code.

Each allocation the program makes on a known path has a size of its own (7000 and up), which
names the path here; the programs' comments draw the same tree."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tasks.format.frames import frame_names
from tasks.format.trace_reader import ALLOCATING_OPS, Op, Trace
from tests.conftest import need_tool
from tests.native.tracer_harness import PROGRAMS, read_traces, tracer_env

FRAMES = 64  # deeper than any path here: each stack is recorded to its outermost frame
VARIANTS = {
    "no frame pointers": ("-O2",),  # Debian's default: -fomit-frame-pointer at -O2
    "frame pointers": ("-O2", "-fno-omit-frame-pointer"),
}
EXIT_CODE = 3  # calltree's; the exec'd calltree_cxx exits 4, which calltree prints
LIBC = "libc.so.6"

NEW = "operator new(unsigned long)"
# size -> the known path, innermost first, up to main: on the main thread of calltree (C)
MAIN_PATHS = {
    7005: ["xmalloc", *["recurse"] * 6, "recursion_case", "main"],
    7020: ["xmalloc", *["recurse"] * 21, "recursion_case", "main"],
    7101: ["xmalloc", "parse_config", "wrapper_case", "main"],
    7102: ["xmalloc", "load_table", "wrapper_case", "main"],
    7103: ["xmalloc", "grow_table", "load_table", "wrapper_case", "main"],
    7104: ["xmalloc", "main"],
    7301: ["xmalloc", "jump_inner", "jump_middle", "jump_outer", "longjmp_case", "main"],
    7302: ["xmalloc", "after_jump", "longjmp_case", "main"],
    7303: ["xmalloc", "jump_inner", "jump_middle", "jump_outer", "longjmp_case", "main"],
    7305: ["xmalloc", "big_inner", "big_frame_case", "main"],  # a frame of 2 MiB
}
# ... in calltree's fork child, and in its child before it execs calltree_cxx
FORK_PATHS = {7601: ["xmalloc", "child_work", "fork_case", "main"]}
PRE_EXEC_PATHS = {7602: ["xmalloc", "pre_exec_work", "exec_case", "main"]}
# ... up to the thread's body (whose caller is libc's thread start)
THREAD_PATHS = {
    7501: ["xmalloc", "a_work", "thread_a"],
    7502: ["xmalloc", "b_deeper", "b_work", "thread_b"],
    7503: ["xmalloc", *["recurse"] * 4, "thread_c"],
}
# ... in the exec'd C++ program: `new` before a throw, during the unwinding, after the catch
_THROWN = [
    "throw_leaf(bool)",
    "throw_middle(bool)",
    "throw_outer(bool)",
    "exception_case()",
    "main",
]
CXX_PATHS = {
    7401: [NEW, *_THROWN],
    7405: [NEW, "Guard::~Guard()", *_THROWN[1:]],
    7403: [NEW, "after_catch()", "exception_case()", "main"],
    7404: [NEW, *_THROWN],
}
CXX_EXCEPTION_PATH = ["__cxa_allocate_exception", *_THROWN]


@dataclass(frozen=True)
class Frame:
    name: str  # the demangled function, without gcc's clone suffix (" [clone .cold]"); "" unnamed
    module: str  # the file name of the module holding the address; "" when none does


@dataclass
class TreeRun:
    exe: Path
    cxx: Path
    plain: subprocess.CompletedProcess  # untraced
    traced: subprocess.CompletedProcess
    traces: list[Trace]

    def trace_with(self, size: int) -> Trace:
        """The one trace that holds an allocation of `size`."""
        hits = [t for t in self.traces if np.isin(t.size[_allocating(t)], size).any()]
        assert len(hits) == 1, f"{len(hits)} traces allocate {size} bytes"
        return hits[0]


def _allocating(trace: Trace) -> np.ndarray:
    return np.isin(trace.op, [int(o) for o in ALLOCATING_OPS])


def _build(compiler: str, src: Path, exe: Path, flags: tuple[str, ...]) -> Path:
    # the program keeps its symbols (the test names frames from them) and its unwind tables
    subprocess.run(
        [compiler, *flags, "-g", "-Wall", "-pthread", "-o", str(exe), str(src)], check=True
    )
    return exe


@pytest.fixture(scope="module", params=list(VARIANTS))
def tree(request, libheapcast, tmp_path_factory) -> TreeRun:
    """calltree built with the variant's flags, run once untraced and once traced."""
    need_tool("g++", "g++")
    work = tmp_path_factory.mktemp("calltree")
    flags = VARIANTS[request.param]
    exe = _build("gcc", PROGRAMS / "calltree.c", work / "calltree", flags)
    cxx = _build("g++", PROGRAMS / "calltree_cxx.cpp", work / "calltree_cxx", flags)
    argv = [str(exe), str(cxx)]
    env = {
        k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("HEAPCAST_")
    }
    plain = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    out = work / "traces"
    out.mkdir()
    traced = subprocess.run(
        argv,
        env=tracer_env(libheapcast, out, HEAPCAST_FRAMES=str(FRAMES)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    return TreeRun(exe, cxx, plain, traced, read_traces(out))


def recorded_stacks(trace: Trace, sizes) -> dict[int, list[list[Frame]]]:
    """size -> the stacks recorded for the allocations of that size, each innermost first."""
    assert trace.header.has_stacks, f"{trace.header.path} has no stacks"
    sel = np.flatnonzero(_allocating(trace) & np.isin(trace.size, list(sizes)))
    frames = trace.stacks.frames(trace.stack[sel])
    idx, offsets = trace.modules.locate(frames.ravel())
    paths = [trace.modules.path[i] if i >= 0 else "" for i in idx.tolist()]
    names = frame_names(paths, offsets)
    flat = [
        Frame(n.split(" [clone ")[0].removesuffix(".cold"), os.path.basename(p)) if a else None
        for n, p, a in zip(names, paths, frames.ravel().tolist())
    ]
    width = frames.shape[1]
    out: dict[int, list[list[Frame]]] = {}
    for row, i in enumerate(sel.tolist()):  # a loop over the few tagged allocations
        stack = [f for f in flat[row * width : (row + 1) * width] if f is not None]
        out.setdefault(int(trace.size[i]), []).append(stack)
    return out


def _names(stack: list[Frame]) -> list[str]:
    return [f.name for f in stack]


def assert_start_frames(stack: list[Frame], exe: Path, what: str) -> None:
    """What follows main: libc's frames that start the program, then the program's _start."""
    assert len(stack) >= 2, f"{what}: the stack stops at main: {stack}"
    assert all(f.module == LIBC for f in stack[:-1]), (
        f"{what}: not libc's between main and _start: {stack}"
    )
    assert stack[-1] == Frame("_start", exe.name), f"{what}: does not end at _start: {stack}"


def assert_path(stacks: list[list[Frame]], path: list[str], exe: Path, what: str) -> None:
    """Each stack is `path`, then libc's start frames and `_start` of `exe`."""
    assert stacks, f"{what}: no allocation recorded"
    for stack in stacks:
        assert _names(stack[: len(path)]) == path, f"{what}: recorded {stack}"
        assert_start_frames(stack[len(path) :], exe, what)


def test_tracing_changes_neither_the_output_nor_the_exit_code(tree):
    assert tree.plain.returncode == EXIT_CODE, tree.plain.stderr
    assert tree.traced.returncode == EXIT_CODE, tree.traced.stderr
    assert tree.traced.stdout == tree.plain.stdout
    assert "exec child exited 4" in tree.plain.stdout and "caught 7402" in tree.plain.stdout
    assert tree.traced.stderr == tree.plain.stderr == ""


def test_each_allocation_on_the_main_thread_records_its_path(tree):
    # GIVEN recursion 5 and 20 deep, one wrapper from four paths, and a longjmp out of three
    # frames followed by allocations on another path and on the same path again
    trace = tree.trace_with(7005)
    stacks = recorded_stacks(trace, MAIN_PATHS)
    # THEN each allocation's stack is its path, then the program's start
    for size, path in MAIN_PATHS.items():
        assert_path(stacks.get(size, []), path, tree.exe, f"size {size}")


def test_every_stack_begins_at_the_caller_and_frees_have_none(tree):
    for trace in tree.traces:
        alloc = _allocating(trace)
        first = trace.stacks.frames(trace.stack[alloc], max_depth=1)[:, 0]
        assert (first == trace.caller[alloc]).all(), trace.header.path
        assert (trace.stack[~alloc & (trace.op != Op.THREAD_START)] == 0).all()  # frees: none


def test_a_signal_handler_s_stack_steps_through_the_signal_frame(tree):
    trace = tree.trace_with(7201)
    stacks = recorded_stacks(trace, [7201, 7202, 7203, 7204])
    # GIVEN a handler run by a timer over a loop, twice, over two loops whose frames are at the
    # same address (so the handler's frames are too): the handler's frames, at most the signal
    # trampoline (libc), then the interrupted function and its callers
    for size, interrupted in ((7201, "spin_until_alarm"), (7203, "spin_again")):
        (timer,) = stacks[size]
        assert _names(timer[:2]) == ["xmalloc", "on_alarm"], timer
        rest = timer[2:]
        if rest and rest[0].module == LIBC:
            rest = rest[1:]
        assert _names(rest[:3]) == [interrupted, "signal_case", "main"], f"size {size}: {timer}"
        assert_start_frames(rest[3:], tree.exe, f"size {size}")
    # AND handlers run by raise(), on the thread's stack and on an alternate signal stack:
    # libc's frames between the handler and raise's caller
    for size, handler, caller in (
        (7202, "on_usr1", "raise_case"),
        (7204, "on_usr2", "altstack_case"),
    ):
        (raised,) = stacks[size]
        assert _names(raised[:2]) == ["xmalloc", handler], raised
        k = 2
        while k < len(raised) and raised[k].module == LIBC:
            k += 1
        assert k > 2, raised
        assert _names(raised[k : k + 2]) == [caller, "main"], f"size {size}: {raised}"
        assert_start_frames(raised[k + 2 :], tree.exe, f"size {size}")


def test_each_thread_records_its_own_path_up_to_its_start(tree):
    trace = tree.trace_with(7501)
    stacks = recorded_stacks(trace, THREAD_PATHS)
    for size, path in THREAD_PATHS.items():
        (stack,) = stacks[size]
        assert _names(stack[: len(path)]) == path, f"size {size}: {stack}"
        start = stack[len(path) :]
        assert start and all(f.module == LIBC for f in start), f"size {size}: {stack}"
    # AND the threads' allocations were made on three threads besides the main one
    sel = _allocating(trace) & np.isin(trace.size, list(THREAD_PATHS))
    assert len(set(trace.thread[sel].tolist()) - {0}) == 3


def test_a_fork_child_and_an_exec_d_program_record_their_paths(tree):
    parent = tree.trace_with(7005)
    child = tree.trace_with(7601)
    pre_exec = tree.trace_with(7602)
    assert child.header.ppid == pre_exec.header.ppid == parent.header.pid
    # GIVEN a fork child allocating on its own path
    assert_path(recorded_stacks(child, FORK_PATHS)[7601], FORK_PATHS[7601], tree.exe, "fork child")
    # AND a fork child allocating before it execs
    assert_path(
        recorded_stacks(pre_exec, PRE_EXEC_PATHS)[7602],
        PRE_EXEC_PATHS[7602],
        tree.exe,
        "child before exec",
    )


def test_cxx_new_and_an_exception_thrown_through_traced_frames(tree):
    # GIVEN the exec'd C++ program: new on a path, a throw through it, a destructor allocating
    # during the unwinding, and allocations after the catch (on another path and the same one)
    trace = tree.trace_with(7403)
    assert trace.header.cmdline == (str(tree.cxx),)
    stacks = recorded_stacks(trace, CXX_PATHS)
    assert len(stacks[7401]) == 2  # before the throw, and again after the catch
    for size, path in CXX_PATHS.items():
        assert_path(stacks.get(size, []), path, tree.cxx, f"size {size}")
    # AND the exception object's own allocation, made by libstdc++ at the throw
    alloc = np.flatnonzero(_allocating(trace))
    sizes = {int(trace.size[i]) for i in alloc}
    by_size = recorded_stacks(trace, sizes)
    thrown = [
        s for stacks in by_size.values() for s in stacks if s and s[0].name == CXX_EXCEPTION_PATH[0]
    ]
    assert len(thrown) == 1, "one exception was thrown"
    assert_path(thrown, CXX_EXCEPTION_PATH, tree.cxx, "__cxa_allocate_exception")


def test_a_frame_without_unwind_information_ends_the_walk(tree):
    trace = tree.trace_with(7801)
    stacks = recorded_stacks(trace, [7801, 7802])
    # GIVEN a hand-written function without CFI calling malloc: its frame is recorded and the
    # frames after it, if any, are its true callers (a walk that cannot step through ends)
    (nocfi,) = stacks[7801]
    truth = ["nocfi_alloc", "nocfi_case", "main"]
    assert nocfi and _names(nocfi[:3]) == truth[: len(nocfi[:3])], nocfi
    if len(nocfi) > 3:
        assert_start_frames(nocfi[3:], tree.exe, "size 7801")
    # AND code copied into an executable page (no module): frame 0 is in no module, then only
    # its true callers
    (jit,) = stacks[7802]
    assert jit and jit[0].module == "", jit
    truth = ["jit_case", "main"]
    assert _names(jit[1:3]) == truth[: len(jit[1:3])], jit
    if len(jit) > 3:
        assert_start_frames(jit[3:], tree.exe, "size 7802")


def test_frames_n_keeps_the_innermost_n(tree, libheapcast, tmp_path):
    # GIVEN the program traced with HEAPCAST_FRAMES=8
    out = tmp_path / "traces"
    out.mkdir()
    run = subprocess.run(
        [str(tree.exe)],
        env=tracer_env(libheapcast, out, HEAPCAST_FRAMES="8"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == EXIT_CODE, run.stderr
    (trace,) = [t for t in read_traces(out) if (t.size == 7020).any()]
    # THEN the 21-deep recursion's stack is its innermost 8 frames
    (stack,) = recorded_stacks(trace, [7020])[7020]
    assert _names(stack) == MAIN_PATHS[7020][:8]
