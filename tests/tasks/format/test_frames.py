"""tasks.format.frames: a frame is named from the module's copy under a container run's sysroot,
and a stripped module's static functions from the separate debug file that came with it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np

from tasks.format.frames import frame_names
from tasks.format.symbols import symbol_table
from tests.conftest import need_tool

SOURCE = """
static __attribute__((noinline)) int hidden_helper(int x) { return x * 7 + 1; }
int main(int argc, char **argv) { return hidden_helper(argc) == 8 ? 0 : 1; }
"""


def build_id(path: Path) -> str:
    out = subprocess.run(["readelf", "-n", str(path)], capture_output=True, text=True, check=True)
    return next(line.split()[-1] for line in out.stdout.splitlines() if "Build ID" in line)


def test_a_stripped_modules_static_function_is_named_from_the_sysroots_debug_file(tmp_path):
    for tool in ("gcc", "objcopy", "strip", "readelf"):
        need_tool(tool)
    # GIVEN a program with a static function, its debug file split off, the program stripped
    src = tmp_path / "prog.c"
    src.write_text(SOURCE)
    built = tmp_path / "prog"
    subprocess.run(["gcc", "-O2", "-Wl,--build-id", "-o", str(built), str(src)], check=True)
    offset = next(
        int(table.start[k]) + 1
        for table in [symbol_table(str(built))]
        for k in range(len(table.names))
        if table.names[k] == "hidden_helper"
    )
    debug = tmp_path / "prog.debug"
    subprocess.run(["objcopy", "--only-keep-debug", str(built), str(debug)], check=True)
    subprocess.run(["strip", "--strip-all", str(built)], check=True)
    bid = build_id(built)
    # AND both brought home as a replay does: the module at its image path, the debug file
    # under the sysroot's /usr/lib/debug/.build-id
    sysroot = tmp_path / "sysroot"
    (sysroot / "opt/app").mkdir(parents=True)
    shutil.copy(built, sysroot / "opt/app/prog")
    dbg_dir = sysroot / "usr/lib/debug/.build-id" / bid[:2]
    dbg_dir.mkdir(parents=True)
    shutil.copy(debug, dbg_dir / f"{bid[2:]}.debug")
    offsets = np.array([offset], np.uint64)
    # WHEN the frame is named with the sysroot THEN the static function has its name
    assert frame_names(["/opt/app/prog"], offsets, sysroot) == ["hidden_helper"]
    # AND without the debug file only the module's own (stripped) tables are read: no name
    shutil.rmtree(sysroot / "usr")
    (sysroot / "opt/app/prog").touch()  # a new mtime: the module's tables are read again
    assert frame_names(["/opt/app/prog"], offsets, sysroot) == [""]
