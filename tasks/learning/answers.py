"""What a version's networks answered on its evaluation runs, kept for the stages after training.

The evaluation keeps, per evaluation run (`RunAnswers`), the next-call model's top-5 at each
scored position (tasks.learning.nextcall.model.predict_positions) and the questions' network's reuse
answer at each free (question_network.soon_of); the registry logs them with the version
(tasks/registry/answer_artifacts.py) and whatif reads them back instead of computing them again.

An answer is only reused on exactly the calls it was made on: each carries the digest of what
it answered (`tokens_digest` for `top`, `rows_digest` for `soon`), and a reader holding
different calls computes its own. The answers are causal, so reading them changes no decision:
whatif's tests hold the two paths equal row for row. Why:
docs/learning-questions.md#the-logged-answers.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa

from tasks.dataset.token_runs import TokenRun

FORMAT = 1  # the file's layout; a file of another format is refused
ROW_KEY = ("pid", "thread", "seq")  # what names an events row within its run


def tokens_digest(run: TokenRun) -> str:
    """The digest of a token run's calls: its tokens and its thread boundaries."""
    h = hashlib.blake2b(digest_size=16)
    h.update(np.ascontiguousarray(run.tokens, np.uint8).tobytes())
    h.update(np.ascontiguousarray(run.offsets, "<i8").tobytes())
    return h.hexdigest()


def rows_digest(table: pa.Table) -> str:
    """The digest of an events table's rows, in their order: each row's (pid, thread, seq)."""
    h = hashlib.blake2b(digest_size=16)
    for name in ROW_KEY:
        h.update(np.ascontiguousarray(table.column(name).to_numpy(), "<u8").tobytes())
    return h.hexdigest()


class AnswersError(ValueError):
    """A kept answers file that cannot be read: corrupt, or of another format."""


@dataclass(frozen=True)
class RunAnswers:
    """One evaluation run's answers, each with the digest of the calls it was made on."""

    workload: str
    run: str
    tokens_digest: str = ""
    top: np.ndarray | None = None  # uint8 [scored positions, TOP_K]: the next-call model's top-5
    rows_digest: str = ""
    soon: np.ndarray | None = None  # float64 per events row: P(reuse soon) at a free, else NaN

    @property
    def key(self) -> tuple[str, str]:
        return (self.workload, self.run)

    def top_for(self, run: TokenRun) -> np.ndarray | None:
        """The model's top-5 if it was made on exactly `run`'s calls, else None."""
        ok = self.top is not None and self.tokens_digest == tokens_digest(run)
        return self.top if ok else None

    def soon_for(self, table: pa.Table) -> np.ndarray | None:
        """The network's reuse answers if they were made on exactly `table`'s rows, else None."""
        ok = self.soon is not None and self.rows_digest == rows_digest(table)
        return self.soon if ok else None

    def with_answers(self, other: RunAnswers) -> RunAnswers:
        """These answers with `other`'s (the same run) filled in where these have none."""
        if other.key != self.key:
            raise ValueError(f"answers of {other.key} merged into {self.key}")
        out = self
        if self.top is None and other.top is not None:
            out = replace(out, tokens_digest=other.tokens_digest, top=other.top)
        if self.soon is None and other.soon is not None:
            out = replace(out, rows_digest=other.rows_digest, soon=other.soon)
        return out

    def to_bytes(self) -> bytes:
        """The answers as one compressed .npz (no pickled objects)."""
        head = {
            "format": FORMAT,
            "workload": self.workload,
            "run": self.run,
            "tokens_digest": self.tokens_digest,
            "rows_digest": self.rows_digest,
        }
        arrays = {"head": np.frombuffer(json.dumps(head).encode(), np.uint8)}
        if self.top is not None:
            arrays["top"] = np.asarray(self.top, np.uint8)
        if self.soon is not None:
            arrays["soon"] = np.asarray(self.soon, np.float64)  # exact: whatif keeps at >= 1/2
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> RunAnswers:
        """The answers a file holds; AnswersError naming `where` when it cannot be read."""
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                head = json.loads(z["head"].tobytes().decode())
                top = z["top"] if "top" in z.files else None
                soon = z["soon"] if "soon" in z.files else None
        except Exception as err:  # noqa: BLE001 - any unreadable file is the same failure
            raise AnswersError(
                f"{where}: not an answers file ({type(err).__name__}: {err})"
            ) from err
        if not isinstance(head, dict) or head.get("format") != FORMAT:
            got = head.get("format") if isinstance(head, dict) else head
            raise AnswersError(f"{where}: answers of format {got!r}, this heapcast reads {FORMAT}")
        if top is not None and (top.ndim != 2 or top.dtype != np.uint8):
            raise AnswersError(f"{where}: `top` is {top.dtype} {top.shape}, not uint8 [n, k]")
        return cls(
            str(head["workload"]),
            str(head["run"]),
            str(head.get("tokens_digest", "")),
            top,
            str(head.get("rows_digest", "")),
            soon,
        )


def merged(*groups: tuple[RunAnswers, ...] | list[RunAnswers]) -> tuple[RunAnswers, ...]:
    """One RunAnswers per run from several stages' answers (the questions', the model's)."""
    out: dict[tuple[str, str], RunAnswers] = {}
    for group in groups:
        for a in group:
            out[a.key] = out[a.key].with_answers(a) if a.key in out else a
    return tuple(out[k] for k in sorted(out))
