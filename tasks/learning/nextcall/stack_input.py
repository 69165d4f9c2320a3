"""Each call's stack as the next-call network reads it (model.frame_depth): the calls' rows into
one table of frame tokens, so that a batch gathers its frames (tasks/learning/nextcall/token_data.py)
and no [calls, depth, FRAME_PIECES] array of a whole run exists. No Keras here.

Row i is call i's stack: the input at position i, beside token i. The network predicts call i+1
from positions <= i, so the stack of the call it predicts is never an input.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tasks.dataset.frame_tokens import FRAME_PIECES, stack_tokens
from tasks.dataset.token_runs import TokenRun


class StacksMissing(ValueError):
    """A network that reads the stack asked for a run whose stacks were not read."""


@dataclass(frozen=True)
class StackInput:
    """Frame tokens of a run's calls (or of runs concatenated, as concat_runs joins them)."""

    rows: np.ndarray  # int32 [n]: each call's row of `tokens` (0: no stack)
    tokens: np.ndarray  # int32 [stacks + 1, depth, FRAME_PIECES]; row 0 padding

    @property
    def depth(self) -> int:
        return int(self.tokens.shape[1])

    def frames(self, idx: np.ndarray) -> np.ndarray:
        """int32 [*idx.shape, depth, FRAME_PIECES]: the frame tokens of the calls `idx`."""
        return self.tokens[self.rows[idx]]

    def padded(self, pad: int) -> StackInput:
        """The same with `pad` calls without a stack after the last, so that a chunk near the
        end gathers without a bounds check."""
        return StackInput(np.concatenate([self.rows, np.zeros(pad, np.int32)]), self.tokens)


def stack_input(runs: list[TokenRun], depth: int) -> StackInput:
    """The runs' calls, concatenated in order, with the first `depth` frames of their stacks
    (TokenRun.stacks); StacksMissing naming the run whose stacks were not read."""
    rows, tables = [], [np.zeros((1, depth, FRAME_PIECES), np.int32)]
    base = 0  # rows before this run's in the joined table, less the shared padding row
    for run in runs:
        calls = run.stacks
        if calls is None:
            raise StacksMissing(
                f"{run.name}: the network reads each call's stack (model.frame_depth) but the "
                "run's stacks were not read with its tokens: read the split with "
                "data.call_stacks: true (a TrainConfig with model.frame_depth sets it)"
            )
        table = stack_tokens(calls.frames, depth)[1:]
        rows.append(np.where(calls.rows > 0, calls.rows + base, 0).astype(np.int32))
        tables.append(table)
        base += len(table)
    joined = np.concatenate(rows) if rows else np.zeros(0, np.int32)
    return StackInput(joined, np.concatenate(tables))
