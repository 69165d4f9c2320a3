"""Promotion: the alias `champion` moves to a new model version only when it wins on the same data.

Every registered version carries, as model-version tags, the evaluation it was scored on
(`heapcast.eval.content_hash`) and its scores there (`heapcast.eval.top1`, `.top5`,
`.log_loss`). `decide` compares a candidate with the champion on the candidate's evaluation,
re-evaluating a champion scored on another content hash (`evaluate_model(model,
champion_config) -> Evaluation`; without an evaluator the candidate is registered, not
promoted). The candidate wins when better by more than `min_improvement`; a tie keeps the
champion. `log_decision` logs the decision on the candidate's run (`promotion/`,
`heapcast.promotion`). Two registrations at once: a SQLite store serializes decide + apply
(tracking.store_lock); on any store `settle` leaves the alias on the best version promoted on
that evaluation (`heapcast.promoted_on`). The rule in full: docs/pipeline.md#the-promotion-rule.

MLflow is imported lazily (flows import this at start-up); the Keras model only when a champion
has to be re-evaluated.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tasks.learning.scores import MODEL, OVERALL, Evaluation
from tasks.registry import headline

UNSEEN = "unseen_runs"
HIGHER_IS_BETTER = {"top1": True, "top5": True, "log_loss": False}
TAG_HASH = "heapcast.eval.content_hash"
TAG_SCORE = "heapcast.eval.{metric}"
TAG_RUN = "heapcast.run_id"
TAG_RUN_HASH = "heapcast.content_hash"  # on a training run: the data it was evaluated on
# The content hash on which a version won the alias (set just before the alias moves to it).
TAG_PROMOTED_ON = "heapcast.promoted_on"

# evaluate_model(model, champion_config) -> Evaluation: today's evaluation of a loaded model.
# champion_config is the champion's own training config (config.json of its run; None when
# absent), so a model trained with another mode/context is scored the way it was built. A callable
# taking only the model is accepted too.
EvaluateModel = Callable[..., Evaluation]


@dataclass(frozen=True)
class PromotionDecision:
    """What was compared, and what came of it."""

    promoted: bool
    decision: str  # "first" | "promoted" | "kept" | "not_comparable"
    reason: str
    metric: str
    candidate_version: str
    candidate_score: float
    previous_champion_version: str | None
    champion_score: float | None  # the champion's score on the candidate's evaluation
    champion_reevaluated: bool
    champion_evaluation: Evaluation | None = None  # set when the champion was re-evaluated

    @property
    def champion_version(self) -> str | None:
        """The version holding the alias after the decision."""
        return self.candidate_version if self.promoted else self.previous_champion_version


def score_of(evaluation: Evaluation, metric: str) -> float:
    """The model's score over all workloads on the unseen-runs table."""
    if metric not in HIGHER_IS_BETTER:
        raise ValueError(f"promotion metric {metric!r}: expected one of {sorted(HIGHER_IS_BETTER)}")
    return float(getattr(evaluation.get(MODEL, OVERALL, UNSEEN), metric))


def beats(candidate: float, champion: float, metric: str, min_improvement: float = 0.0) -> bool:
    """True when `candidate` is better than `champion` by more than `min_improvement`."""
    if math.isnan(candidate):
        return False
    if math.isnan(champion):
        return True
    gain = candidate - champion if HIGHER_IS_BETTER[metric] else champion - candidate
    return gain > min_improvement


def version_tags(evaluation: Evaluation, content_hash: str) -> dict[str, str]:
    """The model-version tags that say on what data a version was scored, and how well."""
    tags = {TAG_HASH: content_hash}
    for m in HIGHER_IS_BETTER:
        tags[TAG_SCORE.format(metric=m)] = repr(score_of(evaluation, m))
    return tags


def record_evaluation(
    client, name: str, version: str, evaluation: Evaluation, content_hash: str
) -> None:
    for k, v in version_tags(evaluation, content_hash).items():
        client.set_model_version_tag(name, version, k, v)


def current_champion(client, name: str, alias: str):
    """The ModelVersion holding `alias`, or None (no alias yet, or no such model)."""
    # deferred: imported on first use, for start-up time
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException as err:
        if err.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
            return None
        raise


def load_version(name: str, version: str):
    """A registered version as a Keras model, in any process.

    Keras rebuilds heapcast's custom layers (NGramFeatures, OnlineOrders) only once the module
    that registers them was imported. In heapcast's environment the start-up hook
    (heapcast_keras.py) does that for any `mlflow.keras.load_model`; this imports it first as
    well, for a Python started without site hooks. Deferred, as mlflow: start-up time."""
    # deferred: imported on first use, for start-up time
    import mlflow.keras

    import tasks.learning.nextcall.model  # noqa: F401  (registers the custom layers)

    return mlflow.keras.load_model(f"models:/{name}/{version}")


def champion_config(client, version) -> dict | None:
    """The training config logged (config.json) on the run that produced a model version."""

    run_id = getattr(version, "run_id", None)
    if not run_id:
        return None
    try:
        with tempfile.TemporaryDirectory(prefix="heapcast-champion-") as tmp:
            path = client.download_artifacts(run_id, "config.json", tmp)
            with open(path) as f:
                return json.load(f)
    except Exception:  # a version registered by hand, or its run's artifacts gone
        return None


def score_from_run(client, version, metric: str, content_hash: str) -> float | None:
    """The version's score read from its run's metrics, for a version without score tags (made
    by hand, or before they existed): only when the run says it was scored on `content_hash`.
    Its headline name first, then the name a run logged before the headline had
    (tasks/registry/headline.py); None when neither is there."""
    run_id = getattr(version, "run_id", None)
    if not run_id:
        return None
    run = client.get_run(run_id)
    if run.data.tags.get(TAG_RUN_HASH) != content_hash:
        return None
    return headline.figure(run.data.metrics, UNSEEN, metric, MODEL)


def call_evaluator(evaluate_model: EvaluateModel, model, config: dict | None) -> Evaluation:
    """evaluate_model(model, config), or evaluate_model(model) for a one-argument callable."""

    try:
        params = [
            p
            for p in inspect.signature(evaluate_model).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
        ]
    except (TypeError, ValueError):
        params = []
    if len(params) == 1 and params[0].kind != params[0].VAR_POSITIONAL:
        return evaluate_model(model)
    return evaluate_model(model, config)


def decide(
    client,
    name: str,
    candidate_version: str,
    candidate_evaluation: Evaluation,
    content_hash: str,
    *,
    metric: str = "top1",
    min_improvement: float = 0.0,
    alias: str = "champion",
    evaluate_model: EvaluateModel | None = None,
    load_model: Callable[[str, str], Any] = load_version,
) -> PromotionDecision:
    """Compare the candidate with the current champion on the candidate's evaluation."""
    cand = score_of(candidate_evaluation, metric)
    base = dict(metric=metric, candidate_version=str(candidate_version), candidate_score=cand)
    champ = current_champion(client, name, alias)
    if champ is None or str(champ.version) == str(candidate_version):
        return PromotionDecision(
            True,
            "first",
            f"no {alias} yet: the first version takes the alias",
            previous_champion_version=None,
            champion_score=None,
            champion_reevaluated=False,
            **base,
        )
    champ_version = str(champ.version)
    champ_hash = champ.tags.get(TAG_HASH)
    champ_eval: Evaluation | None = None
    reevaluated = False
    stored = champ.tags.get(TAG_SCORE.format(metric=metric))
    from_run = None if stored is not None else score_from_run(client, champ, metric, content_hash)
    if champ_hash == content_hash and stored is not None:
        champ_score = float(stored)
    elif from_run is not None:
        champ_score = from_run
    elif evaluate_model is None:
        return PromotionDecision(
            False,
            "not_comparable",
            f"{alias} v{champ_version} was scored on data {champ_hash or '(unknown)'}, the candidate on "
            f"{content_hash}, and no evaluator was given to re-score it: candidate not promoted",
            previous_champion_version=champ_version,
            champion_score=None,
            champion_reevaluated=False,
            **base,
        )
    else:
        champ_eval = call_evaluator(
            evaluate_model, load_model(name, champ_version), champion_config(client, champ)
        )
        champ_score = score_of(champ_eval, metric)
        reevaluated = True
        record_evaluation(client, name, champ_version, champ_eval, content_hash)
    won = beats(cand, champ_score, metric, min_improvement)
    sign = ">" if won else "<="
    better = "higher" if HIGHER_IS_BETTER[metric] else "lower"
    reason = (
        f"candidate v{candidate_version} {metric}={cand:.6f}; {alias} v{champ_version} "
        f"{metric}={champ_score:.6f}{' (re-evaluated)' if reevaluated else ''}; "
        f"gain {sign} min_improvement={min_improvement} ({better} is better)"
    )
    return PromotionDecision(
        won,
        "promoted" if won else "kept",
        reason,
        previous_champion_version=champ_version,
        champion_score=champ_score,
        champion_reevaluated=reevaluated,
        champion_evaluation=champ_eval,
        **base,
    )


def apply(
    client,
    name: str,
    decision: PromotionDecision,
    alias: str = "champion",
    content_hash: str | None = None,
) -> None:
    """Move the alias when the decision says so (the version first tagged with the content
    hash it won on, which `settle` reads)."""
    if decision.promoted:
        if content_hash is not None:
            client.set_model_version_tag(
                name, decision.candidate_version, TAG_PROMOTED_ON, content_hash
            )
        client.set_registered_model_alias(name, alias, decision.candidate_version)


def settle(
    client, name: str, decision: PromotionDecision, content_hash: str, alias: str = "champion"
) -> PromotionDecision:
    """After `apply` promoted the candidate: leave the alias on the best version promoted on the
    same evaluation, whatever registration ran at the same time.

    Without a lock (a tracking server), two registrations may both read the old champion and
    both move the alias; the last writer wins, maybe the worse. Each one settles after writing,
    and each wrote its scores and its `heapcast.promoted_on` tag before its alias, so whichever
    settles last sees both and moves the alias to the better. Within one evaluation promotions
    only ever improve the score, so the best promoted version is the one a serial order would
    have left there. A holder scored on another evaluation (promoted on other data since) is
    not comparable and is left alone. Returns the decision as it ended: not promoted, with the
    holder as champion, when the alias rests on another version.
    """
    if not decision.promoted:
        return decision
    metric = decision.metric
    key = TAG_SCORE.format(metric=metric)

    def score(v) -> float | None:
        if v is None or v.tags.get(TAG_HASH) != content_hash or key not in v.tags:
            return None
        return float(v.tags[key])

    holder = current_champion(client, name, alias)
    if holder is not None and score(holder) is None:
        best = None  # the alias went on to another evaluation: not comparable, leave it
    else:
        best = (score(holder), str(holder.version)) if holder is not None else None
        found = client.search_model_versions(
            f"name = '{name}' and tags.`{TAG_PROMOTED_ON}` = '{content_hash}'"
        )
        for v in sorted(found, key=lambda v: int(v.version)):
            s = score(v)
            if s is not None and (best is None or beats(s, best[0], metric)):
                best = (s, str(v.version))
        if best is not None and (holder is None or best[1] != str(holder.version)):
            client.set_registered_model_alias(name, alias, best[1])
    final = best[1] if best is not None else (str(holder.version) if holder else None)
    if final == decision.candidate_version:
        return decision
    return dataclasses.replace(
        decision,
        promoted=False,
        decision="kept",
        previous_champion_version=final,
        champion_score=best[0] if best is not None else None,
        reason=(
            f"{decision.reason}; then {alias} v{final} was found to hold or deserve the alias "
            "(a registration that ran at the same time): the alias rests there"
        ),
    )


DECISION_FIELDS = (
    "promoted",
    "decision",
    "reason",
    "metric",
    "candidate_version",
    "candidate_score",
    "previous_champion_version",
    "champion_score",
    "champion_reevaluated",
)


def decision_json(decision: PromotionDecision) -> str:
    """The decision as JSON (a run tag: a retried registration reads it back, never re-decides)."""
    return json.dumps({f: getattr(decision, f) for f in DECISION_FIELDS})


def decision_from_json(text: str) -> PromotionDecision:
    return PromotionDecision(**{f: v for f, v in json.loads(text).items() if f in DECISION_FIELDS})


def decision_params(decision: PromotionDecision) -> dict[str, str]:
    return {
        "promotion.decision": decision.decision,
        "promotion.metric": decision.metric,
        "promotion.candidate_version": decision.candidate_version,
        "promotion.previous_champion_version": str(decision.previous_champion_version),
        "promotion.champion_reevaluated": str(decision.champion_reevaluated).lower(),
        "promotion.reason": decision.reason[:6000],
    }


def decision_metrics(decision: PromotionDecision) -> dict[str, float]:
    m = {
        f"promotion/candidate.{decision.metric}": decision.candidate_score,
        "promotion/promoted": 1.0 if decision.promoted else 0.0,
    }
    if decision.champion_score is not None:
        m[f"promotion/champion.{decision.metric}"] = decision.champion_score
    return m


def log_decision(client, run_id: str, decision: PromotionDecision) -> None:
    """Params, metrics and tags of the decision on the candidate's run."""

    # deferred: imported on first use, for start-up time
    from mlflow.entities import Metric, Param, RunTag

    now = int(time.time() * 1000)
    tags = {
        "heapcast.promotion": decision.decision,
        "heapcast.promoted": str(decision.promoted).lower(),
        "heapcast.champion_version": str(decision.champion_version),
        "heapcast.promotion_summary": json.dumps(
            {
                "decision": decision.decision,
                "metric": decision.metric,
                "candidate": decision.candidate_score,
                "champion": decision.champion_score,
                "champion_version": decision.previous_champion_version,
                "reevaluated": decision.champion_reevaluated,
            }
        ),
    }
    client.log_batch(
        run_id,
        metrics=[Metric(k, float(v), now, 0) for k, v in decision_metrics(decision).items()],
        params=[Param(k, v) for k, v in decision_params(decision).items()],
        tags=[RunTag(k, v) for k, v in tags.items()],
    )
