"""The evaluation's answers (tasks/learning/answers.py), logged with a registered version and read
back by whatif: `answers/<workload>/<run>.npz` on the version's MLflow run."""

from __future__ import annotations

import tempfile
from pathlib import Path

from tasks.learning.answers import AnswersError, RunAnswers
from tasks.learning.outcome import TrainOutcome

ANSWERS_ARTIFACT = "answers"


def answers_path(workload: str, run: str) -> str:
    """The artifact path of one run's answers on the version's run."""
    return f"{ANSWERS_ARTIFACT}/{workload}/{run}.npz"


def log_answers(outcome: TrainOutcome) -> int:
    """Inside the version's active MLflow run: every evaluation run's answers, in one upload.
    Returns how many runs were logged."""
    if not outcome.answers:
        return 0
    import mlflow  # deferred: start-up time

    with tempfile.TemporaryDirectory(prefix="heapcast-answers-") as tmp:
        for a in outcome.answers:
            path = Path(tmp) / answers_path(a.workload, a.run)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(a.to_bytes())
        mlflow.log_artifacts(str(Path(tmp) / ANSWERS_ARTIFACT), ANSWERS_ARTIFACT)
    return len(outcome.answers)


def fetch_answers(run_id: str, workload: str, run: str) -> tuple[RunAnswers | None, str]:
    """(the answers the version's run logged for workload/run, "") or (None, why not): none
    logged (a version from before answers were kept, a run it did not evaluate), or a file that
    cannot be read. The tracking URI is the one configured (tasks.registry.tracking.configure)."""
    import mlflow  # deferred: start-up time

    where = f"run {run_id}: {answers_path(workload, run)}"
    with tempfile.TemporaryDirectory(prefix="heapcast-answers-") as tmp:
        try:
            path = mlflow.artifacts.download_artifacts(
                run_id=run_id, artifact_path=answers_path(workload, run), dst_path=tmp
            )
        except Exception as err:  # noqa: BLE001 - absent or unreachable: the caller recomputes
            return None, f"{where}: not logged ({type(err).__name__})"
        try:
            answers = RunAnswers.from_bytes(Path(path).read_bytes(), where)
        except AnswersError as err:
            return None, str(err)
    if answers.key != (workload, run):
        return None, f"{where}: holds the answers of {answers.workload}/{answers.run}"
    return answers, ""
