"""Workloads where the allocator matters (issue 22): in the catalog beside the others and out of
the quick subset; their inputs are seeded; their programs are real, built from the sources the
image builds, and print the same output under glibc and under tcmalloc (the allocators stage
compares outputs, so a workload whose output followed the allocator could never be measured)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from tasks.core.config import ConfigError
from tasks.replay.inputs import generate_input
from tasks.replay.runners.base import SANDBOX
from tasks.replay.runners.local_runner import bwrap_argv
from tasks.replay.workloads import IMAGES_DIR, RUNNER_FOLDERS, load_catalog, parse_catalog
from tests.conftest import in_ci, need_tool
from tests.native.tracer_harness import NATIVE
from tests.tasks.replay.replay_checks import run_request

# workload -> its `program`
NEW = {
    "numpy_temporaries": "cpython",
    "numpy_pipeline": "cpython",
    "keras_gru": "tensorflow",
    "keras_video": "tensorflow",
    "larson": "larson",
    "cache_scratch": "cache_scratch",
    "xmalloc_test": "xmalloc_test",
    "mstress": "mstress",
    "kv_service": "kv_service",
}
SRC = IMAGES_DIR / "threads" / "src"
TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")
DEBIAN_PYTHON = Path("/usr/bin/python3.11")
DEBIAN_NUMPY = Path("/usr/lib/python3/dist-packages/numpy")
# the stress programs' small runs: argv after the program (SEED SIZE THREADS)
STRESS = {
    "larson": ["7", "2000", "4"],
    "cache-scratch": ["7", "20000", "4"],
    "xmalloc-test": ["7", "20000", "2"],
    "mstress": ["7", "100", "4"],
}


def _need_file(path: Path, package: str) -> Path:
    if not path.exists():
        msg = f"{path} is missing (scripts/setup.sh installs it: apt-get install {package})"
        if in_ci():
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def _under(preload: Path | None) -> dict[str, str]:
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    if preload is not None:
        env["LD_PRELOAD"] = str(preload)
    return env


def test_new_workloads_have_their_program_two_inputs_and_stay_out_of_the_quick_subset():
    catalog = load_catalog()
    for name, program in NEW.items():
        w = catalog.get(name)
        assert w.program == program, name
        assert len(w.inputs) >= 2 and not any(i.quick for i in w.inputs), name
        assert w.input("medium").size > w.input("small").size, name
    quick = {w.name for w, _ in catalog.select(quick=True)}
    assert not quick & set(NEW)


@pytest.mark.parametrize(
    "name", ["numpy_temporaries", "numpy_pipeline", "keras_gru", "keras_video"]
)
def test_new_generators_write_the_same_bytes_for_the_same_seed(name, tmp_path):
    w = load_catalog().get(name)
    inp = w.input("small")
    files = generate_input(w.generator, inp.seed, inp.size, tmp_path / "a")
    generate_input(w.generator, inp.seed, inp.size, tmp_path / "b")
    generate_input(w.generator, inp.seed + 1, inp.size, tmp_path / "c")
    read = lambda d: [(d / f).read_bytes() for f in files]  # noqa: E731
    assert files and read(tmp_path / "a") == read(tmp_path / "b") != read(tmp_path / "c")
    for f in files:  # what the image's Python will run is Python
        compile((tmp_path / "a" / f).read_text(), f, "exec")


def test_numpy_temporaries_prints_the_same_checksum_under_glibc_and_tcmalloc(tmp_path):
    _need_file(DEBIAN_NUMPY, "python3-numpy")
    _need_file(TCMALLOC, "libtcmalloc-minimal4")
    w = load_catalog().get("numpy_temporaries")
    generate_input(w.generator, 5, 300, tmp_path)  # 300 k elements
    cmd = [str(DEBIAN_PYTHON), "-S", str(tmp_path / "workload.py"), str(DEBIAN_NUMPY)]
    outs = [
        subprocess.run(cmd, env=_under(lib), capture_output=True, text=True, check=True).stdout
        for lib in (None, TCMALLOC)
    ]
    assert re.fullmatch(r"heapcast numpy temporaries done -?\d+(\.\d+)?(e[+-]?\d+)?\n", outs[0])
    assert outs[0] == outs[1]


@pytest.fixture(scope="module")
def heapcast_layer() -> Path:
    subprocess.run(["make", "-s", "-C", str(NATIVE), "layer"], check=True)
    return NATIVE / "build" / "libheapcast_layer.so"


def test_numpy_pipeline_frees_the_readers_chunks_in_the_main_thread_and_prints_one_total(
    heapcast_layer, tmp_path
):
    """The case's point, on the host: every chunk is allocated by the reader thread and freed by
    the main thread, so heapcast's layer guided by the online counter (the freeing thread's own
    calls) keeps none, where the layer keeping every block (pools) reuses nearly all; the output is the same under glibc, tcmalloc and the layer."""
    _need_file(DEBIAN_NUMPY, "python3-numpy")
    _need_file(TCMALLOC, "libtcmalloc-minimal4")
    w = load_catalog().get("numpy_pipeline")
    generate_input(w.generator, 5, 4200, tmp_path)  # 33.6 MB chunks: above 32 MiB
    cmd = [str(DEBIAN_PYTHON), "-S", str(tmp_path / "workload.py"), str(DEBIAN_NUMPY)]
    base = {**w.env}
    outs, hits = [], {}
    for name, lib, policy in [
        ("glibc", None, None),
        ("tcmalloc", TCMALLOC, None),
        ("counter", heapcast_layer, "guided,predictor=online"),
        ("keep", heapcast_layer, "pools"),
    ]:
        env = {**_under(lib), **base}
        stats = tmp_path / f"{name}.stats"
        if policy:
            env["HEAPCAST_LAYER"] = f"policy={policy},proof=0,stats={stats}"
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        outs.append(run.stdout)
        if policy:
            line = dict(f.split("=", 1) for f in stats.read_text().split())
            hits[name] = int(line["hits"])
    assert re.fullmatch(r"heapcast numpy pipeline done 40 \d+\.\d+\n", outs[0]), outs[0]
    assert len(set(outs)) == 1
    # the first two chunks (three where the reader's request beats a free) are new mappings
    assert hits["counter"] == 0 and 30 <= hits["keep"] <= 38, hits


def test_keras_video_prints_the_same_loss_under_glibc_and_tcmalloc(tmp_path):
    # GIVEN seed 003's video case at 3 steps, run as its container runs it (heapcast's own
    # Python environment on the path, numpy's huge pages off)
    _need_file(TCMALLOC, "libtcmalloc-minimal4")
    generate_input("keras_video", 5, 3, tmp_path)
    purelib = sysconfig.get_paths()["purelib"]
    env = {"PYTHONPATH": purelib, "NUMPY_MADVISE_HUGEPAGE": "0", "PYTHONHASHSEED": "0"}
    cmd = [sys.executable, "-S", str(tmp_path / "train.py")]
    # WHEN it trains under glibc and under tcmalloc
    runs = [
        subprocess.run(cmd, env={**_under(lib), **env}, capture_output=True, text=True, check=True)
        for lib in (None, TCMALLOC)
    ]
    # THEN the loss it prints is the same (the allocators stage compares outputs)
    assert re.fullmatch(r"heapcast keras video done 3 \d+\.\d{4}\n", runs[0].stdout)
    assert runs[0].stdout == runs[1].stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """The threads image's programs, built on the host with the image's gcc flags."""
    gcc = need_tool("gcc")
    out = tmp_path_factory.mktemp("threads-bin")
    for prog in [*STRESS, "kvserver", "loadgen"]:
        subprocess.run(
            [gcc, "-O2", "-Wall", "-Werror", "-pthread", "-o", str(out / f"hc-{prog}"),
             str(SRC / f"{prog}.c")],
            check=True,
        )  # fmt: skip
    return out


@pytest.mark.parametrize("prog", list(STRESS))
def test_stress_program_checksum_is_the_same_under_glibc_tcmalloc_and_again(prog, built):
    _need_file(TCMALLOC, "libtcmalloc-minimal4")
    cmd = [str(built / f"hc-{prog}"), *STRESS[prog]]
    outs = [
        subprocess.run(cmd, env=_under(lib), capture_output=True, text=True, check=True).stdout
        for lib in (None, TCMALLOC, None)
    ]
    assert re.fullmatch(rf"{prog} .* checksum=[0-9a-f]{{16}}\n", outs[0]), outs[0]
    assert outs[0] == outs[1] == outs[2]
    # another seed is another run
    other = subprocess.run([cmd[0], "8", *cmd[2:]], capture_output=True, text=True, check=True)
    assert other.stdout != outs[0]


def test_stress_program_refuses_a_bad_argument_saying_which(built):
    p = subprocess.run([str(built / "hc-larson"), "7", "many", "4"], capture_output=True, text=True)
    assert p.returncode == 2 and "bad OPS many" in p.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_once(built: Path, tmp_path: Path, preload: Path | None) -> list[str]:
    """hc-kvserver under a small fixed load, both writing one standard output as in the
    workload's container: its lines."""
    ready = tmp_path / "kv.ready"
    ready.unlink(missing_ok=True)
    port = str(_free_port())
    with open(tmp_path / "stdout", "w") as out:
        server = subprocess.Popen(
            [str(built / "hc-kvserver"), port, str(ready)], env=_under(preload), stdout=out
        )
        try:
            while not ready.exists() and server.poll() is None:
                time.sleep(0.02)
            subprocess.run(
                [str(built / "hc-loadgen"), port, "7", "2", "4"],
                env=_under(preload),
                stdout=out,
                check=True,
            )
            server.wait(timeout=120)
        finally:
            server.kill()
            server.wait()
    assert server.returncode == 0
    return (tmp_path / "stdout").read_text().splitlines()


def test_kv_service_output_is_the_same_under_glibc_and_tcmalloc(built, tmp_path):
    _need_file(TCMALLOC, "libtcmalloc-minimal4")
    glibc = _serve_once(built, tmp_path, None)
    tcmalloc = _serve_once(built, tmp_path, TCMALLOC)
    # the load generator's totals first (printed before it asks for the shutdown), then the
    # server's: one order, so the allocators stage can compare the output's hash
    assert len(glibc) == 2
    assert re.fullmatch(
        r"hc-loadgen clients=4 sessions=2 requests=1600 reply_bytes=\d+ checksum=[0-9a-f]{16}",
        glibc[0],
    )
    # 4 clients x 2 sessions, and the shutdown's connection
    assert glibc[1].startswith("hc-kvserver connections=9 requests=1600 keys=")
    assert glibc == tcmalloc


def test_a_mount_binds_its_host_folder_read_only_in_the_sandbox(tmp_path):
    w = load_catalog().get("keras_gru")
    ((host, target),) = w.host_mounts()
    assert (host / "tensorflow").is_dir() and target == f"{SANDBOX}/pylib"
    request = run_request(w, tmp_path, tracer=None)
    argv = bwrap_argv(request, {})
    i = argv.index(str(host))
    assert argv[i - 1 : i + 2] == ["--ro-bind", str(host), target]


def test_a_missing_mount_source_names_the_workload_and_what_the_folder_is(tmp_path):
    catalog = parse_catalog(
        {
            "workloads": [
                {
                    "name": "trainer",
                    "image": "tensorflow",
                    "command": ["/usr/bin/python3.11"],
                    "time_limit_s": 60,
                    "mounts": [
                        {
                            "source": str(tmp_path / "no-venv"),
                            "target": "/heapcast/pylib",
                            "why": "the project's virtual environment",
                        }
                    ],
                    "inputs": [{"name": "small", "seed": 1, "size": 1}],
                }
            ]
        },
        "test",
    )
    with pytest.raises(
        FileNotFoundError, match=r"workload 'trainer'.*no-venv.*virtual environment"
    ):
        catalog.get("trainer").host_mounts()


def test_runner_folders_named_in_the_catalog_are_the_sandbox_layouts():
    from tasks.replay.runners import base

    folders = {
        Path(getattr(base, n)).relative_to(SANDBOX).parts[0]
        for n in dir(base)
        if n.startswith("SANDBOX_") and n != "SANDBOX_PATHS"
    }
    assert folders == set(RUNNER_FOLDERS)


def test_a_mount_target_twice_is_an_error_naming_the_field():
    item = {
        "name": "trainer",
        "image": "tensorflow",
        "command": ["/usr/bin/python3.11"],
        "time_limit_s": 60,
        "mounts": [
            {"source": "a", "target": "/heapcast/x"},
            {"source": "b", "target": "/heapcast/x"},
        ],
        "inputs": [{"name": "small", "seed": 1, "size": 1}],
    }
    with pytest.raises(ConfigError, match=r"workload 'trainer': field 'mounts'.*named twice"):
        parse_catalog({"workloads": [item]}, "test")
