"""tasks.format.symbols: (module, offset) callers named from ELF symbol tables, offline."""

from __future__ import annotations

import subprocess

import numpy as np

from tasks.format import symbols
from tasks.format.symbols import caller_label, resolve, symbol_table
from tests.conftest import need_tool

SOURCE = """
static __attribute__((noinline)) int helper(int x) { return x * 3 + 1; }
int exported(int x) { return helper(x) + 2; }
int main(int argc, char **argv) { (void)argv; return exported(argc); }
"""


def _build(tmp_path, *extra: str):
    src = tmp_path / "prog.c"
    src.write_text(SOURCE)
    exe = tmp_path / "prog"
    cc = need_tool("gcc", "build-essential")
    subprocess.run([cc, "-O1", "-g", "-Wl,--build-id", *extra, "-o", exe, src], check=True)
    return exe


def _nm(exe, name: str) -> int:
    out = subprocess.run(["nm", exe], capture_output=True, text=True, check=True).stdout
    return next(int(line.split()[0], 16) for line in out.splitlines() if line.endswith(f" {name}"))


def test_offsets_resolve_to_the_function_holding_the_return_address(tmp_path):
    exe = _build(tmp_path)
    helper = _nm(exe, "helper")
    # return addresses inside helper: named with their offset in it (the byte before a return
    # address is looked up, so helper + 1 is still helper's)
    names = resolve([str(exe)] * 2, np.array([helper + 3, helper + 1], np.uint64))
    assert names == ["helper+0x3", "helper+0x1"]
    # unknown module, unreadable module: unnamed
    assert resolve(["", str(tmp_path / "missing")], np.array([1, 2], np.uint64)) == ["", ""]


def test_a_stripped_module_is_named_from_its_separate_debug_file(tmp_path, monkeypatch):
    # GIVEN a stripped program whose debug file is installed under .build-id/
    exe = _build(tmp_path)
    helper = _nm(exe, "helper")  # a static function: only in .symtab
    objcopy, strip = need_tool("objcopy", "binutils"), need_tool("strip", "binutils")
    debug = tmp_path / "prog.debug"
    subprocess.run([objcopy, "--only-keep-debug", exe, debug], check=True)
    subprocess.run([strip, exe], check=True)
    assert symbol_table(str(exe)).lookup(np.array([helper + 2], np.uint64)) == [None]
    build_id = (
        subprocess.run(["readelf", "-n", exe], capture_output=True, text=True, check=True)
        .stdout.split("Build ID: ")[1]
        .split()[0]
    )
    root = tmp_path / "debug" / ".build-id"
    (root / build_id[:2]).mkdir(parents=True)
    debug.rename(root / build_id[:2] / f"{build_id[2:]}.debug")
    monkeypatch.setattr(symbols, "DEBUG_ROOT", str(root))
    symbols._load.cache_clear()
    # THEN the static function is named
    assert resolve([str(exe)], np.array([helper + 2], np.uint64)) == ["helper+0x2"]


def test_labels_fall_back_from_function_to_module_offset_to_address():
    assert caller_label("/usr/bin/prog", 0x10, "main+0x10", 0x5555) == "main+0x10 (prog)"
    assert caller_label("/usr/bin/prog", 0x10, "", 0x5555) == "prog+0x10"
    assert caller_label("", 0, "", 0x5555) == "0x5555"
