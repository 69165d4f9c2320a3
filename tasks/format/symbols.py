"""Caller names from the modules' own ELF symbol tables (pyelftools; no network, no debuginfod).

A caller recorded with its module map (native/FORMAT.md, Modules) is a module path and an offset
in the module's own ELF addresses (`caller - load bias`), which the symbol values of `.symtab`
and `.dynsym` are in. A return address points just after its call instruction, so the symbol
looked up is the one holding `offset - 1`. The module must be readable here, at the path the
trace gives (a stripped module's separate debug file is used when installed); one missing, not
ELF, or without a symbol for an address leaves that caller unnamed (module + offset). Names are
as the symbol tables hold them (C++ names stay mangled). The limits: docs/report.md#caller-names.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import NoteSection, SymbolTableSection


@dataclass(frozen=True)
class SymbolTable:
    """Function symbols of one module, sorted by address."""

    start: np.ndarray  # uint64, symbol values
    size: np.ndarray  # uint64, 0 when the table gives none
    names: tuple[str, ...]

    def lookup(self, offsets: np.ndarray) -> list[tuple[str, int] | None]:
        """(name, offset within the symbol) of the symbol holding each `offset - 1` (offsets
        are return addresses), or None."""
        offsets = np.asarray(offsets, dtype=np.uint64)
        if len(self.start) == 0 or len(offsets) == 0:
            return [None] * len(offsets)
        at = np.where(offsets > 0, offsets - np.uint64(1), offsets)
        j = np.searchsorted(self.start, at, side="right").astype(np.int64) - 1
        jc = np.maximum(j, 0)
        inside = (j >= 0) & ((self.size[jc] == 0) | (at < self.start[jc] + self.size[jc]))
        return [
            (self.names[int(k)], int(o) - int(self.start[k])) if ok else None
            for k, o, ok in zip(jc, offsets, inside)
        ]


_EMPTY = SymbolTable(np.zeros(0, np.uint64), np.zeros(0, np.uint64), ())


DEBUG_ROOT = "/usr/lib/debug/.build-id"  # separate debug files (Debian's *-dbgsym packages)


# Elf64_Sym, little-endian: read a whole symbol table with numpy, not a Python object a symbol
_SYM64 = np.dtype(
    [
        ("name", "<u4"),
        ("info", "u1"),
        ("other", "u1"),
        ("shndx", "<u2"),
        ("value", "<u8"),
        ("size", "<u8"),
    ]
)
_FUNC_TYPES = (2, 10)  # STT_FUNC, STT_GNU_IFUNC


def _function_symbols(elf: ELFFile, sec: SymbolTableSection) -> tuple[np.ndarray, list[str]]:
    """The defined function symbols of one symbol table: their entries and names."""
    if elf.elfclass == 64 and elf.little_endian:
        syms = np.frombuffer(sec.data(), _SYM64)
        keep = (
            np.isin(syms["info"] & 0xF, _FUNC_TYPES) & (syms["shndx"] != 0) & (syms["value"] != 0)
        )
        syms = syms[keep]
        strtab = elf.get_section(sec["sh_link"]).data()
        nul = np.flatnonzero(np.frombuffer(strtab, np.uint8) == 0)
        start = syms["name"].astype(np.int64)
        end = nul[np.minimum(np.searchsorted(nul, start), len(nul) - 1)] if len(nul) else start
        names = [
            strtab[a:b].decode("utf-8", "replace") for a, b in zip(start.tolist(), end.tolist())
        ]
        return syms, names
    # other ELF classes: pyelftools a symbol at a time
    rows, names = [], []
    for sym in sec.iter_symbols():
        e = sym.entry
        if e.st_info.type not in ("STT_FUNC", "STT_GNU_IFUNC") or e.st_shndx == "SHN_UNDEF":
            continue
        rows.append((0, 2, 0, 1, e.st_value, e.st_size))
        names.append(sym.name)
    syms = np.array(rows, _SYM64) if rows else np.zeros(0, _SYM64)
    keep = syms["value"] != 0
    return syms[keep], [n for n, k in zip(names, keep) if k]


def _read_symbols(path: str, best: dict[int, tuple[int, str]]) -> str | None:
    """Adds the function symbols of `path` to `best` (value -> (size, name)); returns the file's
    GNU build id (hex) when it has one."""

    build_id = None
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            for sec in elf.iter_sections():
                if isinstance(sec, NoteSection):
                    for note in sec.iter_notes():
                        if note["n_type"] == "NT_GNU_BUILD_ID" and note["n_name"] == "GNU":
                            build_id = str(note["n_desc"])
                if not isinstance(sec, SymbolTableSection):
                    continue
                syms, names = _function_symbols(elf, sec)
                # a loop over function symbols (tens of thousands at most), not events
                for value, size, name in zip(syms["value"].tolist(), syms["size"].tolist(), names):
                    if not name:
                        continue
                    old = best.get(value)
                    # prefer a sized symbol, then a global name over a local alias
                    if old is None or (old[0] == 0 and size) or old[1].startswith("_"):
                        # a symbol version (`memcpy@@GLIBC_2.14`, in .symtab) is not the name
                        best[value] = (size, name.split("@", 1)[0])
    except (OSError, ELFError, ValueError, KeyError):
        return None
    return build_id


@lru_cache(maxsize=256)
def _load(path: str, mtime_ns: int, debug_roots: tuple[str, ...]) -> SymbolTable:
    best: dict[int, tuple[int, str]] = {}  # value -> (size, name): one name per address
    build_id = _read_symbols(path, best)
    # a stripped module's static functions are in its separate debug file, when installed: the
    # first of the roots that has the file of its build id (an exact match of the module's bytes)
    if build_id and len(build_id) > 2:
        for root in debug_roots:
            debug = os.path.join(root, build_id[:2], build_id[2:] + ".debug")
            if os.path.isfile(debug):
                _read_symbols(debug, best)
                break
    if not best:
        return _EMPTY
    values = np.array(sorted(best), dtype=np.uint64)
    return SymbolTable(
        values,
        np.array([best[int(v)][0] for v in values], dtype=np.uint64),
        tuple(best[int(v)][1] for v in values),
    )


def symbol_table(path: str, debug_root: str | None = None) -> SymbolTable:
    """The function symbols of the ELF file at `path` (cached; empty when it cannot be read);
    a separate debug file is looked for under `debug_root` (a container run's copies), then
    this host's DEBUG_ROOT."""
    if not path or not path.startswith("/"):
        return _EMPTY
    try:
        st = os.stat(path)
    except OSError:
        return _EMPTY
    roots = (debug_root, DEBUG_ROOT) if debug_root else (DEBUG_ROOT,)
    return _load(path, st.st_mtime_ns, roots)


def by_module(modules: Sequence[str]) -> dict[str, list[int]]:
    """The rows of each named module ("" left out): the loop over distinct callers or frames
    that lets each module's table be read once and looked up vectorised."""
    rows: dict[str, list[int]] = {}
    for i, m in enumerate(modules):
        if m:
            rows.setdefault(m, []).append(i)
    return rows


def lookup(
    modules: Sequence[str],
    offsets: np.ndarray,
    file_of: Callable[[str], str] = str,
    debug_root: str | None = None,
) -> list[tuple[str, int] | None]:
    """(name, offset within the symbol) of the function holding each (module, return address
    offset), or None; the module read from `file_of(module)` (a container run's copy)."""
    offsets = np.asarray(offsets, dtype=np.uint64)
    out: list[tuple[str, int] | None] = [None] * len(modules)
    for m, idx in by_module(modules).items():
        for i, hit in zip(idx, symbol_table(file_of(m), debug_root).lookup(offsets[idx])):
            out[i] = hit
    return out


def resolve(modules: list[str], offsets: np.ndarray) -> list[str]:
    """The function name of each (module, offset) caller, with the offset inside the function
    when it is not 0 (`name+0x1f`), or "" where it cannot be named. One table lookup per
    module, vectorised over its callers."""
    return [
        "" if hit is None else f"{hit[0]}+0x{hit[1]:x}" if hit[1] else hit[0]
        for hit in lookup(modules, offsets)
    ]


def caller_label(module: str, offset: int, function: str, caller: int) -> str:
    """How the report names a caller: `function (module file)`, else `module file+0xoffset`,
    else the raw return address (a trace without a module map)."""
    if function:
        return f"{function} ({os.path.basename(module)})"
    if module:
        return f"{os.path.basename(module)}+0x{offset:x}"
    return f"0x{caller:x}"
