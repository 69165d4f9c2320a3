"""What training hands to registration: the contract between tasks/learning/train.py and tasks/registry/register.py.

Kept free of TensorFlow and MLflow imports so either side (and the flows) can import it cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tasks.learning.evaluate import HELDOUT_WORKLOADS, UNSEEN_PROGRAMS, UNSEEN_RUNS
from tasks.learning.scores import Evaluation, QuestionScores

if TYPE_CHECKING:
    from tasks.core.storage import Root
    from tasks.learning.answers import RunAnswers
    from tasks.learning.questions.network import QuestionNetwork
    from tasks.learning.table.distill import ClassTable, TableAgreement


@dataclass(frozen=True)
class DatasetRef:
    """Which data a model was trained and evaluated on."""

    root: Root  # the data root, resolved where the flow started
    train_runs: tuple[tuple[str, str], ...]  # (workload, run)
    eval_runs: tuple[tuple[str, str], ...]  # runs of the same workloads, never seen in training
    heldout_runs: tuple[tuple[str, str], ...]  # workloads held out entirely (second table)
    train_tokens: int
    eval_tokens: int
    content_hash: str  # hash of the token data actually used (train + eval)
    token_histogram: np.ndarray  # counts per token (64) over the training data
    # Added by training (defaulted, so older constructors still work): runs used for early
    # stopping and the n-gram's order; a run name may repeat a train run when validation is the
    # tail of its threads (see TrainOutcome.notes).
    validation_runs: tuple[tuple[str, str], ...] = ()
    # runs of programs that no training run comes from (the "unseen_programs" table)
    unseen_program_runs: tuple[tuple[str, str], ...] = ()


@dataclass
class TrainOutcome:
    """A trained model with everything registration logs next to it."""

    model: Any  # keras.Model
    config: dict[str, Any]  # the whole training config, model_dump()'ed
    dataset: DatasetRef
    history: dict[str, list[float]]  # per-epoch curves (loss, val_loss, accuracy, ...)
    evaluation: Evaluation
    predictions_per_second: float  # training throughput
    seconds: float
    # int32 [batch, context] token example for the signature; a model with online features
    # takes {"tokens": that, "online": int32 [batch, context, 4]}
    input_example: np.ndarray | dict[str, np.ndarray]
    # Added by training: sentences a reader of the run must see (a validation cut from a train
    # run's thread tails, a resumed training), worth logging as tags or in the description.
    notes: list[str] = field(default_factory=list)
    # where it trained (tasks/learning/nextcall/backend.py): {"backend", "device", "precision", "batch_size"}
    placement: dict[str, str] = field(default_factory=dict)
    # The allocator's questions, predicted causally by the network and the counters on the same
    # positions of the same tables (tasks/learning/questions/reuse.py; metric keys reuse.question_metrics)
    question_scores: tuple[QuestionScores, ...] = ()
    # The layer's table (tasks/learning/table/distill.py), distilled from the questions' network (else
    # from the training runs' statistics), written with the registered version, and its
    # coverage/agreement at each table's frees
    class_table: ClassTable | None = None
    table_agreement: tuple[TableAgreement, ...] = ()
    # the questions' network (tasks/learning/questions/network.py), logged with the version
    question_network: QuestionNetwork | None = None
    # the placement's lifetime table distilled from it at the training allocations (keys,
    # scores: network.distilled_lifetime), logged with the version; None without a network
    lifetime_table: tuple[np.ndarray, np.ndarray] | None = None
    # what the model and the questions' network answered on each evaluation run, logged with
    # the version for whatif to read (tasks/learning/answers.py)
    answers: tuple[RunAnswers, ...] = ()


Runs = tuple[tuple[str, str], ...]  # (workload, run)


@dataclass(frozen=True)
class RegisteredModel:
    """A version in the model registry and the runs it was evaluated on: what registration
    hands to the stages after it (whatif, the reports, the nightly summary). The `whatif` flow
    run on its own builds one from the registry (an alias or a version), once, at its edge."""

    name: str
    version: str
    run_id: str
    eval_runs: Runs  # unseen runs of the trained workloads
    unseen_program_runs: Runs
    heldout_runs: Runs
    # the registry's promotion decision and its reason, when the version was registered tonight
    decision: str | None = None
    reason: str | None = None
    # its run's headline metrics as registration logged them (tasks/registry/headline.py)
    headline: tuple[tuple[str, float], ...] = ()

    @property
    def evaluation_runs(self) -> Runs:
        """Every run of every evaluation table, each once, in table order."""
        return tuple(
            dict.fromkeys((*self.eval_runs, *self.unseen_program_runs, *self.heldout_runs))
        )

    @property
    def runs_by_table(self) -> dict[str, Runs]:
        """The runs of each evaluation table, by its name (tasks.learning.evaluate.TABLES), in
        table order."""
        return {
            UNSEEN_RUNS: self.eval_runs,
            UNSEEN_PROGRAMS: self.unseen_program_runs,
            HELDOUT_WORKLOADS: self.heldout_runs,
        }

    @property
    def uri(self) -> str:
        return f"models:/{self.name}/{self.version}"


@dataclass(frozen=True)
class TrainResult:
    """The `train` flow's result: the trained model's outcome and its registered version."""

    outcome: TrainOutcome
    model: RegisteredModel
