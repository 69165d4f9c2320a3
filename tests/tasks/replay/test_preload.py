"""Loading verified positively (tasks.replay.runners.preload): real programs run on this host
under each allocator with the probe; a static program, a program that clears its environment
before exec'ing its worker, a refused library, a knob changed on the way and a glibc knob the
program sets again itself by mallopt are "not applied"."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from tasks.replay.runners.preload import PreloadSpec, build_probe, run_preloaded, verify

LIB = "/usr/lib/x86_64-linux-gnu"
JEMALLOC = f"{LIB}/libjemalloc.so.2"
TCMALLOC = f"{LIB}/libtcmalloc_minimal.so.4"
# enough CPU (> MIN_CPU_S) for the CPU share to count
WORK = [sys.executable, "-c", "s = [str(i) * 3 for i in range(300000)]; print(len(s))"]


@pytest.fixture(scope="module")
def libs():
    missing = [p for p in (JEMALLOC, TCMALLOC) if not os.path.exists(p)]
    if missing:
        pytest.fail(f"allocators missing: {missing} (scripts/setup.sh installs them)")


@pytest.fixture(scope="module")
def static_program(tmp_path_factory):
    out = tmp_path_factory.mktemp("static") / "static_alloc"
    src = b'#include <stdio.h>\n#include <stdlib.h>\nint main(void){long t=0;for(int i=0;i<100000;i++){char*p=malloc(64+i%512);t+=(long)(p!=0);free(p);}printf("%ld\\n",t);return 0;}\n'
    subprocess.run(["gcc", "-O2", "-static", "-o", str(out), "-x", "c", "-"], input=src, check=True)
    return out


@pytest.mark.parametrize(
    "spec",
    [
        PreloadSpec("glibc"),
        PreloadSpec("glibc-tuned", env=(("GLIBC_TUNABLES", "glibc.malloc.arena_max=2"),)),
        PreloadSpec(
            "jemalloc-bg",
            JEMALLOC,
            env=(("MALLOC_CONF", "background_thread:true,dirty_decay_ms:5000"),),
        ),
        PreloadSpec("tcmalloc-rr", TCMALLOC, env=(("TCMALLOC_RELEASE_RATE", "3"),)),
    ],
    ids=lambda s: s.name,
)
def test_a_real_program_under_each_candidate_is_applied(libs, spec, tmp_path):
    r = run_preloaded(WORK, spec, tmp_path / "run")
    assert r.exit_code == 0 and r.usage is not None and r.stdout_bytes == len("300000\n")
    v = r.verification
    assert v.applied, v.reason
    assert v.processes >= 1 and v.cpu_share is not None and v.cpu_share > 0.5
    want = os.path.basename(spec.library) if spec.library else "libc.so"
    assert all(os.path.basename(m).startswith(want) for m in v.mallocs)


def test_a_static_program_is_not_applied(libs, static_program, tmp_path):
    for spec in (PreloadSpec("glibc"), PreloadSpec("jemalloc", JEMALLOC)):
        r = run_preloaded([str(static_program)], spec, tmp_path / spec.name)
        assert r.exit_code == 0
        assert not r.verification.applied
        assert "statically linked" in r.verification.reason


def test_a_child_started_with_a_cleared_environment_is_not_applied(libs, tmp_path):
    # GIVEN a shell that exec's `env -i` for its worker: the shell and env load jemalloc, the
    # worker (all the CPU time) runs glibc's malloc
    argv = ["/bin/sh", "-c", "exec /usr/bin/env -i " + " ".join(f"'{a}'" for a in WORK)]
    r = run_preloaded(argv, PreloadSpec("jemalloc", JEMALLOC), tmp_path / "run")
    assert r.exit_code == 0
    v = r.verification
    assert not v.applied and v.processes >= 1
    assert "CPU time ran in processes that loaded it" in v.reason


def test_a_program_of_many_short_processes_counts_their_loading_as_theirs(tmp_path):
    # GIVEN a shell running 300 short processes (git --version: each mostly the loader's work,
    # exec and relocation, before the probe starts), every one loading the probe
    git = shutil.which("git")
    assert git, "git is on every machine that cloned this repository"
    loop = f"i=0; while [ $i -lt 300 ]; do {git} --version >/dev/null; i=$((i+1)); done"
    r = run_preloaded(["/bin/sh", "-c", loop], PreloadSpec("glibc"), tmp_path / "run")
    assert r.exit_code == 0
    v = r.verification
    # THEN it is applied: counted from the probe's start alone, their CPU was 26% of the tree's
    # and glibc itself was refused; with their loading, 80%
    assert v.applied, v.reason
    assert v.processes == 301 and v.cpu_share > 0.6


def test_a_knob_changed_on_the_way_is_not_applied(libs, tmp_path):
    spec = PreloadSpec("jemalloc-bg", JEMALLOC, env=(("MALLOC_CONF", "background_thread:true"),))
    inner = " ".join(f"'{a}'" for a in WORK)
    argv = ["/bin/sh", "-c", f"MALLOC_CONF=narenas:2 exec {inner}"]
    r = run_preloaded(argv, spec, tmp_path / "run")
    assert not r.verification.applied
    assert "MALLOC_CONF='narenas:2'" in r.verification.reason


def test_a_refused_library_is_not_applied(tmp_path):
    r = run_preloaded(["/bin/true"], PreloadSpec("broken", "/etc/hostname"), tmp_path / "run")
    assert r.exit_code == 0
    assert r.verification.reason.startswith("LD_PRELOAD refused: ")


def test_verify_reads_the_allocator_s_own_answer():
    spec = PreloadSpec("je", JEMALLOC, env=(("MALLOC_CONF", "dirty_decay_ms:5000"),))
    line = (
        f"start\tpid=1\tppid=0\tsecure=0\texe=/bin/x\tmalloc={JEMALLOC}"
        "\tenv.MALLOC_CONF=dirty_decay_ms:5000\tjemalloc.opt.dirty_decay_ms=10000\n"
    )
    v = verify(spec, line, None)
    assert not v.applied and "opt.dirty_decay_ms is 10000, not 5000" in v.reason
    setuid = line.replace("secure=0", "secure=1")
    assert "setuid" in verify(spec, setuid, None).reason
    glibc = line.replace(JEMALLOC, "/lib/x86_64-linux-gnu/libc.so.6")
    assert "not libjemalloc.so.2" in verify(spec, glibc, None).reason


# tests/native/programs/threshold.c (tests/conftest.py's `program` compiles it): with "mallopt"
# it fixes M_MMAP_THRESHOLD at 128 KiB itself, as TensorFlow's generator dataset does, then
# prints where a 200 kB block came from
FIXED = PreloadSpec(
    "glibc-fixed",
    env=(("GLIBC_TUNABLES", "glibc.malloc.arena_max=2:glibc.malloc.mmap_threshold=4194304"),),
)


@pytest.fixture(scope="module")
def threshold_program(program):
    return str(program("threshold"))


def test_a_glibc_knob_the_program_sets_again_by_mallopt_is_not_applied(threshold_program, tmp_path):
    # WHEN the program fixes the mmap threshold itself under a candidate that tunes it
    r = run_preloaded([threshold_program, "mallopt"], FIXED, tmp_path / "mallopt")
    # THEN the run is not measured under glibc-fixed's name, and the reason names the call
    assert r.exit_code == 0
    assert not r.verification.applied
    assert re.fullmatch(
        rf"pid \d+ \({re.escape(threshold_program)}\) set M_MMAP_THRESHOLD to 131072 itself "
        r"\(mallopt\), so glibc.malloc.mmap_threshold=4194304 was not in force",
        r.verification.reason,
    ), r.verification.reason
    # the same program leaving the threshold alone is applied, and so is plain glibc under it
    assert run_preloaded([threshold_program], FIXED, tmp_path / "alone").verification.applied
    plain = run_preloaded([threshold_program, "mallopt"], PreloadSpec("glibc"), tmp_path / "plain")
    assert plain.verification.applied


def test_the_probe_passes_the_program_s_mallopt_on_to_glibc(threshold_program, tmp_path):
    # GIVEN the probe preloaded, as in every measured run
    env = {"LD_PRELOAD": str(build_probe()), "HEAPCAST_PROBE_OUT": str(tmp_path / "probe")}
    out = {
        arg: subprocess.run(
            [threshold_program, *arg], env=env, capture_output=True, text=True, check=True
        ).stdout
        for arg in ((), ("mallopt",))
    }
    # THEN glibc still follows its dynamic threshold, or keeps the one the program fixed
    assert out == {(): "heap\n", ("mallopt",): "mmap\n"}
    lines = (tmp_path / "probe").read_text().splitlines()
    assert [ln.split("\t")[0] for ln in lines] == ["start", "exit", "start", "mallopt", "exit"]
    assert lines[3].endswith("\tmallopt.mmap_threshold=131072")


def test_a_mallopt_made_before_the_probe_started_is_on_its_start_line(tmp_path):
    # GIVEN a program linked with a library whose constructor, run before the probe's, caps
    # the arenas by mallopt
    lib = tmp_path / "libearly.so"
    src = "#include <malloc.h>\n__attribute__((constructor)) static void early(void) { mallopt(M_ARENA_MAX, 2); }\n"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", str(lib), "-x", "c", "-"], input=src.encode(), check=True
    )
    prog = tmp_path / "early"
    subprocess.run(
        ["gcc", "-o", str(prog), "-x", "c", "-", "-Wl,--no-as-needed", f"-L{tmp_path}", "-learly",
         f"-Wl,-rpath,{tmp_path}"],
        input=b"int main(void) { return 0; }\n",
        check=True,
    )  # fmt: skip
    # WHEN it runs under MALLOC_ARENA_MAX=4
    r = run_preloaded(
        [str(prog)], PreloadSpec("arena4", env=(("MALLOC_ARENA_MAX", "4"),)), tmp_path / "run"
    )
    # THEN the call is seen, and the knob was not in force
    assert not r.verification.applied
    assert "set M_ARENA_MAX to 2 itself (mallopt), so MALLOC_ARENA_MAX=4" in r.verification.reason


def test_a_mallopt_to_the_knob_s_own_value_keeps_it_applied():
    # GIVEN a tunable written in hex, and a program that sets the same threshold again
    spec = PreloadSpec("hex", env=(("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=0x400000"),))
    start = (
        "start\tpid=7\tppid=1\tsecure=0\texe=/bin/x\tmalloc=/lib/x86_64-linux-gnu/libc.so.6"
        "\tenv.GLIBC_TUNABLES=glibc.malloc.mmap_threshold=0x400000\n"
    )
    same = start + "mallopt\tpid=7\tmallopt.mmap_threshold=4194304\n"
    assert verify(spec, same, None).applied
    # a call on another knob than the one measured leaves it applied too
    other = start + "mallopt\tpid=7\tmallopt.arena_max=1\n"
    assert verify(spec, other, None).applied
    moved = start + "mallopt\tpid=7\tmallopt.mmap_threshold=131072\n"
    assert "set M_MMAP_THRESHOLD to 131072" in verify(spec, moved, None).reason


def test_a_call_repeated_with_the_same_value_writes_one_line(tmp_path):
    prog = tmp_path / "repeat"
    src = (
        "#include <malloc.h>\nint main(void) { for (int i = 0; i < 1000; i++) "
        "mallopt(M_MMAP_THRESHOLD, 131072); mallopt(M_MMAP_THRESHOLD, 262144); return 0; }\n"
    )
    subprocess.run(["gcc", "-o", str(prog), "-x", "c", "-"], input=src.encode(), check=True)
    out = tmp_path / "probe"
    env = {"LD_PRELOAD": str(build_probe()), "HEAPCAST_PROBE_OUT": str(out)}
    subprocess.run([str(prog)], env=env, check=True)
    calls = [ln for ln in out.read_text().splitlines() if ln.startswith("mallopt")]
    assert [c.split("\t")[-1] for c in calls] == [
        "mallopt.mmap_threshold=131072",
        "mallopt.mmap_threshold=262144",
    ]
