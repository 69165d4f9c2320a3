"""Named frames: `Frames` (function, module, offset: what the dataset's stacks table, the
report and the exports name a frame by), and the function holding each (module, offset),
demangled.

The symbol tables are read by tasks.format.symbols (pyelftools: `.symtab`, `.dynsym`, and a
stripped module's separate debug file when installed). A replay in a container ran the image's
own files, not this host's: its modules are looked up under the run's `sysroot` (a folder that
holds copies of them at their paths, made by the replay) before this host's path. C++ names are
demangled with binutils' c++filt, once per distinct name. A frame without a symbol is "".
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tasks.format.symbols import DEBUG_ROOT, by_module, lookup


@dataclass(frozen=True)
class Frames:
    """Distinct frames: a function name (demangled; "" when the module has no symbol for it),
    the module's path ("" when no module holds the address) and the offset in the module's
    own ELF addresses (the return address minus the load bias; the raw address without a
    module)."""

    function: tuple[str, ...]
    module: tuple[str, ...]
    offset: np.ndarray  # uint64

    def __len__(self) -> int:
        return len(self.function)

    def label(self, i: int) -> str:
        """How pages and folded stacks name frame i: its function, else `module+0xoffset`,
        else the raw address."""
        if self.function[i]:
            return self.function[i]
        if self.module[i]:
            return f"{os.path.basename(self.module[i])}+0x{int(self.offset[i]):x}"
        return f"0x{int(self.offset[i]):x}"


def module_file(module: str, sysroot: Path | None = None) -> str:
    """Where a module's file is read: its copy under `sysroot` when there is one, else the
    path itself."""
    if sysroot is not None and module.startswith("/"):
        copy = Path(sysroot) / module.lstrip("/")
        if copy.is_file():
            return str(copy)
    return module


def demangle(names: Sequence[str]) -> list[str]:
    """C++ (Itanium ABI) names demangled, others as they are; one c++filt process for all."""
    todo = sorted({n for n in names if n.startswith("_Z")})
    if not todo or shutil.which("c++filt") is None:
        return list(names)
    out = subprocess.run(
        ["c++filt"], input="\n".join(todo) + "\n", capture_output=True, text=True, check=False
    )
    lines = out.stdout.splitlines()
    plain = dict(zip(todo, lines)) if out.returncode == 0 and len(lines) == len(todo) else {}
    return [plain.get(n, n) for n in names]


def frame_names(
    modules: Sequence[str], offsets: np.ndarray, sysroot: Path | None = None
) -> list[str]:
    """The demangled function holding each frame (`offsets[i]` in `modules[i]`, a return
    address: the symbol holding offset - 1 is named), "" where none can be named. One symbol
    table lookup per module, vectorised over its frames."""
    # a container's separate debug files came home with its modules (the replay's sysroot)
    debug_root = str(Path(sysroot) / DEBUG_ROOT.lstrip("/")) if sysroot is not None else None
    hits = lookup(modules, offsets, lambda m: module_file(m, sysroot), debug_root)
    raw = ["" if hit is None else hit[0] for hit in hits]
    return demangle(raw)


def frame_lines(
    modules: Sequence[str], offsets: np.ndarray, sysroot: Path | None = None
) -> list[tuple[str, int]]:
    """(source file, line) of each frame's call (the instruction before its return address) from
    the module's DWARF line table, by binutils' addr2line (one process a module, which also finds
    an installed separate debug file); ("", 0) where the module has no line table or addr2line
    is missing. A loop over distinct frames."""
    offsets = np.asarray(offsets, dtype=np.uint64)
    out: list[tuple[str, int]] = [("", 0)] * len(modules)
    tool = shutil.which("addr2line")
    if tool is None:
        return out
    for m, idx in by_module(modules).items():
        idx = [i for i in idx if offsets[i] > 0]
        path = module_file(m, sysroot)
        if not idx or not os.path.isfile(path):
            continue
        query = "".join(f"0x{int(offsets[i]) - 1:x}\n" for i in idx)
        run = subprocess.run(
            [tool, "-e", path], input=query, capture_output=True, text=True, check=False
        )
        lines = run.stdout.splitlines()
        if run.returncode != 0 or len(lines) != len(idx):
            continue
        for i, text in zip(idx, lines):
            where = text.split(" (discriminator")[0]
            file, _, line = where.rpartition(":")
            if file and file != "??" and line.isdigit() and int(line) > 0:
                out[i] = (file, int(line))
    return out
