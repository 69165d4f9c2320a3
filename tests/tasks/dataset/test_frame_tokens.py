"""Frame tokens (tasks/dataset/frame_tokens.py): a stack's frames as sub-word ids that mean the
same in every program, and each event's row of them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tasks.dataset.events_reader import StackFrames
from tasks.dataset.events_schema import STACKS_SCHEMA
from tasks.dataset.frame_tokens import (
    FRAME_PIECES,
    FRAME_VOCABULARY,
    NO_MODULE,
    frame_words,
    stack_tokens,
    subwords,
    token_id,
)
from tasks.dataset.token_runs import event_stack_rows


def stacks_table(stacks: dict[int, list[tuple[str | None, int, str]]]) -> pa.Table:
    """A stacks table (STACKS_SCHEMA) of {stack id: [(module, offset, function), innermost
    first]}."""
    rows = [(s, d, *f) for s, frames in sorted(stacks.items()) for d, f in enumerate(frames)]
    return pa.Table.from_pylist(
        [
            {"stack": s, "depth": d, "module": m, "offset": o, "function": fn}
            for s, d, m, o, fn in rows
        ],
        schema=STACKS_SCHEMA,
    )


def test_names_split_as_a_language_model_reads_them():
    assert subwords("PyUnicode_New") == ["py", "unicode", "new"]
    assert subwords("Perl_newSV") == ["perl", "new", "sv"]
    assert subwords("xmalloc") == ["x", "malloc"]
    assert subwords("g_malloc") == ["g", "malloc"]
    assert subwords("xmlStrdup") == ["xml", "str", "dup"]
    assert subwords("sqlite3PcacheSetPageSize")[:3] == ["sqlite", "3", "p"]
    # demangled C++: no template arguments nor parameter lists, `::` a boundary
    assert subwords("std::vector<int, std::allocator<int> >::push_back(int const&)") == [
        "std", "vector", "push", "back",
    ]  # fmt: skip
    assert subwords("operator new(unsigned long)") == ["operator", "new"]
    # a word is not cut where what is left is one letter ("parsed" is not parse + d)
    assert subwords("parsed") == ["parsed"]


def test_the_same_sub_word_is_the_same_id_in_every_program():
    # GIVEN allocation wrappers of five programs
    names = ["PyUnicode_New", "Perl_newSV", "g_new0", "xmlNewNode", "operator new(unsigned long)"]
    ids = [{token_id(w) for w in subwords(n)} for n in names]
    # THEN they share `new`, whose id is a pure function of the word, inside the vocabulary
    assert all(token_id("new") in s for s in ids)
    assert token_id("new") == token_id("new") and 1 <= token_id("new") < FRAME_VOCABULARY
    assert {token_id(w) for w in subwords("xmalloc")} & {token_id(w) for w in subwords("g_malloc")}


def test_a_frame_without_a_name_is_its_module_and_the_page_of_its_offset():
    words = frame_words("", "/lib/x86_64-linux-gnu/libc.so.6", 0x12345)
    assert words == ["libc", "libc.so.6@12"]
    # the same page of the same module is the same token; another page is another
    assert frame_words("", "/lib/x86_64-linux-gnu/libc.so.6", 0x12FFF)[-1] == words[-1]
    assert frame_words("", "/lib/x86_64-linux-gnu/libc.so.6", 0x13000)[-1] != words[-1]
    assert frame_words("", "", 0x7F0012345678) == [NO_MODULE]  # JIT code: no module
    # a long name keeps its last pieces (the function's own name)
    assert len(frame_words("a_b_c_d_e_f_g_new", "/bin/x", 0)) == FRAME_PIECES


def test_each_event_reads_its_stacks_first_frames_padded():
    # GIVEN two stacks, one of three frames (one unnamed) and one of one frame
    frames = StackFrames.of_table(
        stacks_table(
            {
                11: [("/bin/p", 0x10, "xmalloc"), ("/bin/p", 0x2000, ""), ("/bin/p", 0x30, "main")],
                22: [("/lib/libc.so.6", 0x40, "g_malloc")],
            }
        )
    )
    tokens = stack_tokens(frames, depth=2)
    assert tokens.shape == (3, 2, FRAME_PIECES)
    assert (tokens[0] == 0).all()  # row 0: no stack
    # WHEN events name stack 22, none, 11 and an id the table lacks
    stack = pa.array([22, None, 11, 99], pa.uint64())
    rows = event_stack_rows(frames, stack)
    assert rows[1] == 0 and rows[3] == 0
    got = tokens[rows]
    # THEN stack 11's first two frames, innermost first, each its ids then padding
    want_first = [token_id("x"), token_id("malloc"), 0, 0, 0]
    np.testing.assert_array_equal(got[2, 0], want_first)
    assert got[2, 1, 0] == token_id("p") and got[2, 1, 1] == token_id("p@2")
    # and stack 22's one frame, its second all padding
    np.testing.assert_array_equal(got[0, 0, :2], [token_id("g"), token_id("malloc")])
    assert (got[0, 1] == 0).all() and (got[1] == 0).all() and (got[3] == 0).all()


def test_a_run_without_stacks_is_padding_only():
    frames = StackFrames.of_table(STACKS_SCHEMA.empty_table())
    tokens = stack_tokens(frames, depth=8)
    assert tokens.shape == (1, 8, FRAME_PIECES) and not tokens.any()
    assert (event_stack_rows(frames, pa.array([None, None], pa.uint64())) == 0).all()
