"""Frame tokens: a call's stack as a language model reads it, for the networks (issue 65).

Each frame of a stack becomes up to FRAME_PIECES sub-word tokens of its function's name: the
name without C++ template arguments and parameter lists, split on `_`, `::`, `.` and every
other non-alphanumeric, on camelCase and digit boundaries, lower-cased, and each word split
further on the pieces a language model's vocabulary holds whole (STEMS: `xmalloc` -> `x`
`malloc`, `strdup` -> `str` `dup`). Each sub-word is hashed (crc32) into FRAME_VOCABULARY ids,
so the same word is the same id in every program and run: `PyUnicode_New`, `Perl_newSV` and
`g_new0` share `new`; `xmalloc`, `g_malloc` and `PyMem_Malloc` share `malloc`. Where no symbol
names the frame: its module's basename words and a bucket of its offset (a 4 KiB page of the
module's code), which mean something only within that module; a frame in no module (JIT code)
is one NO_MODULE token. Id 0 is padding: a frame past the stack's outermost, a piece past a
name's last, a call without a stack.

    stack_tokens(frames, depth)     int32 [len(frames) + 1, depth, FRAME_PIECES]: row k + 1 the
                                    first `depth` frames of stack k, innermost first; row 0
                                    the padding of a call without a stack
    (each event's row of stack_tokens: token_runs.event_stack_rows, read with the tokens)
    RunStacks                       a run's frames and their tokens (the questions' network)

Loops run over distinct names and frames only; per event it is one numpy lookup.
"""

from __future__ import annotations

import posixpath
import re
import zlib
from dataclasses import dataclass

import numpy as np

from tasks.core.storage import Root
from tasks.dataset.events_reader import StackFrames, read_stack_frames
from tasks.dataset.token_runs import RunsRead

FRAME_PIECES = 5  # sub-word tokens a frame: a name's last ones (its own name, not its namespace)
# hashed ids 1..FRAME_VOCABULARY - 1; 0: padding. Large beside the few thousand words of a
# training set, so that a new program's words seldom land on a trained word's id.
FRAME_VOCABULARY = 32768
OFFSET_PAGE_BITS = 12  # an unnamed frame's offset bucket: the 4 KiB page of code it is in
NO_MODULE = "<no module>"

# Pieces a language model's vocabulary holds whole, that C names glue to a prefix without a
# boundary (`xmalloc`, `safesysmalloc`, `newsv`): a word is cut greedily, longest piece first,
# at each of these it contains; what lies between is a piece of its own.
_STEM_WORDS = """
alloc malloc calloc realloc free new del delete dup str string buf buffer mem copy init
create make list array vec vector hash dict map table node tree insert append push grow
resize extend concat format read write open close parse load get set safe sys obj object
type name file path char byte bytes long float tuple unicode text line token expr sym
pool arena cache block page chunk stack frame func call eval exec compile lex emit build
lib add sv av hv parser execute address size sizes
"""
STEMS = tuple(sorted(set(_STEM_WORDS.split())))
_STEM_LENGTHS = sorted({len(s) for s in STEMS}, reverse=True)
_STEM_SET = frozenset(STEMS)
# camelCase and digit boundaries: "XMLParser" -> XML Parser, "newSV" -> new SV, "utf8" -> utf 8
_WORDS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
_TEMPLATE = re.compile(r"<[^<>]*>")
_SO = re.compile(r"\.so(\.[0-9]+)*$")


def _cut(word: str) -> list[str]:
    """A lower-case word cut at the STEMS it holds, longest first, left to right."""
    if word.isdigit() or len(word) <= 3:
        return [word]
    out: list[str] = []
    rest = ""
    i = 0
    while i < len(word):
        hit = next((n for n in _STEM_LENGTHS if word[i : i + n] in _STEM_SET), 0)
        if hit:
            if rest:
                out.append(rest)
                rest = ""
            out.append(word[i : i + hit])
            i += hit
        else:
            rest += word[i]
            i += 1
    if len(rest) == 1 and out:  # "parsed": parse + d is no better than the word
        return [word]
    return out + ([rest] if rest else [])


def subwords(name: str) -> list[str]:
    """The sub-words of a function's name (demangled C++ too), in order, lower-case."""
    name = name.split(" [clone", 1)[0]
    while True:  # nested template arguments, innermost first
        shorter = _TEMPLATE.sub("", name)
        if shorter == name:
            break
        name = shorter
    name = name.replace("(anonymous namespace)", "anonymous").split("(", 1)[0]
    out: list[str] = []
    for part in re.split(r"[^0-9A-Za-z]+", name):
        for word in _WORDS.findall(part):
            out += _cut(word.lower())
    return out


def module_words(path: str) -> list[str]:
    """The sub-words of a module's file name, without its `.so.N` suffix
    (`/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0` -> lib python 3 11)."""
    return subwords(_SO.sub("", posixpath.basename(path)))


def token_id(word: str) -> int:
    """A sub-word's id, 1..FRAME_VOCABULARY-1: the same in every program, run and process."""
    return zlib.crc32(word.encode()) % (FRAME_VOCABULARY - 1) + 1


def frame_words(function: str, module: str, offset: int) -> list[str]:
    """A frame's FRAME_PIECES words at most: its name's last sub-words; without a name, its
    module's words and its offset's page; in no module, NO_MODULE."""
    if function:
        words = subwords(function)
        if words:
            return words[-FRAME_PIECES:]
    if not module:
        return [NO_MODULE]
    base = module_words(module)[: FRAME_PIECES - 1]
    page = f"{posixpath.basename(module)}@{int(offset) >> OFFSET_PAGE_BITS:x}"
    return base + [page]


def frame_token_ids(frames: StackFrames) -> np.ndarray:
    """int32 [len(frames.frames), FRAME_PIECES]: each distinct frame's token ids, 0-padded."""
    f = frames.frames
    out = np.zeros((len(f.function), FRAME_PIECES), np.int32)
    ids: dict[str, int] = {}
    for k, (fn, mod, off) in enumerate(zip(f.function, f.module, f.offset, strict=True)):
        words = frame_words(fn, mod, int(off))  # a loop over distinct frames
        out[k, : len(words)] = [ids.setdefault(w, token_id(w)) for w in words]
    return out


def stack_tokens(frames: StackFrames, depth: int) -> np.ndarray:
    """int32 [len(frames) + 1, depth, FRAME_PIECES]: row k + 1 the token ids of stack k's first
    `depth` frames, innermost first (0 past its outermost); row 0 all padding."""
    out = np.zeros((len(frames) + 1, depth, FRAME_PIECES), np.int32)
    if not len(frames):
        return out
    per_frame = frame_token_ids(frames)
    m = frames.matrix(frames.ids, depth)  # rows of frames.frames, -1 past the outermost
    out[1:] = np.where((m >= 0)[..., None], per_frame[np.maximum(m, 0)], 0)
    return out


FRAME_DEPTH = 8  # frames of a call's stack the questions' network reads by default


@dataclass(frozen=True)
class RunStacks:
    """A run's call stacks as the questions' network reads them: the frames, and each distinct
    stack's first `depth` frames as tokens (stack_tokens), made where the run is read."""

    frames: StackFrames
    tokens: np.ndarray  # int32 [len(frames) + 1, depth, FRAME_PIECES]

    @classmethod
    def of(cls, frames: StackFrames, depth: int) -> RunStacks:
        return cls(frames, stack_tokens(frames, depth))


def read_run_stacks(root: Root, runs: list[tuple[str, str]], depth: int) -> RunsRead[RunStacks]:
    """The call stacks of each (workload, run) of `runs` (read_stack_frames), with the tokens of
    each stack's first `depth` frames, each run read when asked: what the questions' counters and
    network read beside a run's events."""
    return RunsRead(runs, lambda w, r: RunStacks.of(read_stack_frames(root, w, r), depth))
