"""Faults a night's registration must survive, each provoked for real against a SQLite store.

GIVEN a real MLflow store in a temporary folder and tiny real Keras models
WHEN  a registration fails right after its model was logged and is retried (the Prefect task's
      own retries), fails before its model, or its process is SIGKILLed after its version was
      created; or two processes register a better and a worse model at the same time
THEN  each trained model has exactly one version, a registration that never finished leaves
      no version behind, and the alias ends on the better model whichever finishes last.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tasks.registry.champion as champion_rules
from tasks.registry import register as register_module
from tasks.registry.register import (
    TAG_DECISION,
    TAG_KEY,
    TAG_STATE,
    RegistrationRefused,
    register,
    register_outcome,
    registration_key,
)
from tasks.registry.tracking import TrackingConfig, configure
from tests.faults import kill_at_marker, run_child
from tests.tasks.registry.outcome_factory import make_evaluation, make_outcome, tiny_model

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow

NAME = "heapcast-next-call"
HASH = "c0ffee" * 6


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def client_for(tracking: TrackingConfig):
    from mlflow import MlflowClient

    configure(tracking)
    return MlflowClient()


def versions(client) -> list[str]:
    return sorted(
        (str(v.version) for v in client.search_model_versions(f"name = '{NAME}'")), key=int
    )


def champion(client) -> str:
    return str(client.get_model_version_by_alias(NAME, "champion").version)


def runs_of(client, experiment_id: str, key: str) -> list:
    return client.search_runs([experiment_id], f"tags.`{TAG_KEY}` = '{key}'")


# ----------------------------------------------------------------------------- retries


def test_a_retried_register_after_its_model_was_logged_makes_one_version(
    prefect_harness, tmp_path, model, monkeypatch
):
    # GIVEN a champion (0.80) and a better candidate (0.85) whose registration fails once
    # right after its model was logged and registered as version 2
    tracking = TrackingConfig(root=str(tmp_path))
    register_outcome(make_outcome(model, 0.80, seed=0), tracking)
    candidate = make_outcome(model, 0.85, seed=1)
    original = champion_rules.record_evaluation
    seen: list[str] = []

    def fails_once(client, name, version, *args, **kwargs):
        seen.append(str(version))
        if len(seen) == 1:
            raise ConnectionError("the tracking store went away")
        return original(client, name, version, *args, **kwargs)

    monkeypatch.setattr(champion_rules, "record_evaluation", fails_once)
    # WHEN the Prefect task runs with its own retries
    result = register.with_options(retry_delay_seconds=0)(candidate, tracking, None)
    # THEN the retry finished version 2 instead of logging a version 3
    assert seen == ["2", "2"]
    client = client_for(tracking)
    assert versions(client) == ["1", "2"]
    assert (result.version, result.decision) == ("2", "promoted")
    assert champion(client) == "2"
    experiment_id = client.get_run(result.run_id).info.experiment_id
    (run,) = runs_of(client, experiment_id, registration_key(candidate, NAME))
    assert run.info.run_id == result.run_id and run.info.status == "FINISHED"
    assert run.data.tags[TAG_STATE] == "complete"
    # the metrics were logged once: each curve has one point per epoch
    assert len(client.get_metric_history(result.run_id, "train/val_loss")) == 3
    # AND registering the same outcome again changes nothing
    again = register_outcome(candidate, tracking)
    assert (again.run_id, again.model_version, again.decision) == (result.run_id, "2", "promoted")
    assert versions(client) == ["1", "2"]


def test_a_retry_after_the_alias_moved_does_not_decide_again(tmp_path, model, monkeypatch):
    # GIVEN a registration that moved the alias and then failed while logging its decision
    tracking = TrackingConfig(root=str(tmp_path))
    register_outcome(make_outcome(model, 0.80, seed=0), tracking)
    candidate = make_outcome(model, 0.90, seed=1)
    original_log, original_decide = champion_rules.log_decision, champion_rules.decide
    decided = []

    def fails_once(*args, **kwargs):
        monkeypatch.setattr(champion_rules, "log_decision", original_log)
        raise TimeoutError("log_batch timed out")

    def counted(*args, **kwargs):
        decided.append(args[2])
        return original_decide(*args, **kwargs)

    monkeypatch.setattr(champion_rules, "log_decision", fails_once)
    monkeypatch.setattr(champion_rules, "decide", counted)
    with pytest.raises(TimeoutError):
        register_outcome(candidate, tracking)
    # WHEN it is retried
    result = register_outcome(candidate, tracking)
    # THEN the decision made before the failure stands (not re-decided as a "first" champion)
    assert decided == ["2"]
    assert (result.model_version, result.decision, result.champion_version) == (
        "2",
        "promoted",
        "2",
    )
    client = client_for(tracking)
    assert versions(client) == ["1", "2"] and champion(client) == "2"
    assert client.get_run(result.run_id).data.params["promotion.decision"] == "promoted"


def test_a_registration_that_died_before_its_version_registers_once(tmp_path, model, monkeypatch):
    # GIVEN a registration whose model upload fails (before any version exists)
    tracking = TrackingConfig(root=str(tmp_path))
    outcome = make_outcome(model, 0.80)
    original = register_module.log_keras_model

    def fails_once(*args, **kwargs):
        monkeypatch.setattr(register_module, "log_keras_model", original)
        raise OSError("artifact store unreachable")

    monkeypatch.setattr(register_module, "log_keras_model", fails_once)
    with pytest.raises(OSError, match="unreachable"):
        register_outcome(outcome, tracking)
    # WHEN it is registered again
    result = register_outcome(outcome, tracking)
    # THEN one version; the dead run is closed and says why
    client = client_for(tracking)
    assert versions(client) == ["1"] and champion(client) == "1" and result.decision == "first"
    runs = runs_of(client, result.experiment_id, registration_key(outcome, NAME))
    states = sorted((r.data.tags[TAG_STATE], r.info.status) for r in runs)
    assert states == [("abandoned", "FAILED"), ("complete", "FINISHED")]


def test_an_outcome_scored_on_too_few_positions_is_refused(tmp_path, model):
    # GIVEN an outcome evaluated on 1,000 positions where its config asks for 5,000
    outcome = make_outcome(model, 0.99)
    outcome.config["data"]["min_eval_positions"] = 5000
    # WHEN it is registered THEN nothing is: not even the store is touched
    with pytest.raises(RegistrationRefused, match="1,000 positions, fewer than .*=5,000"):
        register_outcome(outcome, TrackingConfig(root=str(tmp_path)))
    assert not (tmp_path / "mlflow").exists()


# ----------------------------------------------------------------------------- killed


CHILD_REGISTERS = """
    from tests.tasks.registry.outcome_factory import make_outcome, tiny_model
    import tasks.registry.champion as champion_rules
    from tasks.registry.register import register_outcome, registration_key
    from tasks.registry.tracking import TrackingConfig

    outcome = make_outcome(tiny_model({seed}), {top1}, seed={seed})
    open({keyfile!r}, "w").write(registration_key(outcome, "heapcast-next-call"))

    def killed_here(*args, **kwargs):  # the first step after the version exists
        pause_here({marker!r})

    champion_rules.record_evaluation = killed_here
    register_outcome(outcome, TrackingConfig(root={root!r}))
"""


def kill_a_registration(tmp_path: Path, root: Path, seed: int, top1: float) -> str:
    """A child registers (tiny_model(seed), top1) and is SIGKILLed once its version exists;
    returns the outcome's registration key as the child computed it."""
    marker, keyfile = tmp_path / f"killed-{seed}", tmp_path / f"key-{seed}"
    code = CHILD_REGISTERS.format(
        seed=seed, top1=top1, keyfile=str(keyfile), marker=str(marker), root=str(root)
    )
    kill_at_marker(code, marker)
    return keyfile.read_text()


def test_a_killed_registration_leaves_only_finished_versions(tmp_path):
    tracking = TrackingConfig(root=str(tmp_path / "root"))
    register_outcome(make_outcome(tiny_model(0), 0.80, seed=0), tracking)  # v1, champion

    # WHEN a process registering a better model (0.85) is SIGKILLed after creating version 2
    key = kill_a_registration(tmp_path, tmp_path / "root", seed=1, top1=0.85)
    client = client_for(tracking)
    assert versions(client) == ["1", "2"] and champion(client) == "1"
    # AND the same outcome is registered again (the night's retry)
    retry = make_outcome(tiny_model(1), 0.85, seed=1)
    assert registration_key(retry, NAME) == key  # the same trained model, the same key
    result = register_outcome(retry, tracking)
    # THEN version 2 was finished, not duplicated, and took the alias
    assert (result.model_version, result.decision) == ("2", "promoted")
    assert versions(client) == ["1", "2"] and champion(client) == "2"
    (run,) = runs_of(client, result.experiment_id, key)
    assert run.info.status == "FINISHED" and run.data.tags[TAG_STATE] == "complete"

    # WHEN another registration (0.90) is killed after creating version 3, and the next night
    # registers another model (0.70)
    dead_key = kill_a_registration(tmp_path, tmp_path / "root", seed=3, top1=0.90)
    assert versions(client) == ["1", "2", "3"]
    result = register_outcome(make_outcome(tiny_model(4), 0.70, seed=4), tracking)
    # THEN the killed registration's version is gone (never evaluated against the champion),
    # its run says so, and the registry holds exactly the versions that finished registering
    assert versions(client) == ["1", "2", "4"] and result.model_version == "4"
    assert champion(client) == "2" and result.decision == "kept"
    (dead,) = runs_of(client, result.experiment_id, dead_key)
    assert dead.info.status == "KILLED" and dead.data.tags[TAG_STATE] == "abandoned"
    assert "removed v3" in dead.data.tags["heapcast.abandoned"]
    for v in versions(client):
        run = client.get_run(client.get_model_version(NAME, v).run_id)
        assert run.data.tags[TAG_STATE] == "complete" and TAG_DECISION in run.data.tags


# ----------------------------------------------------------------------------- concurrency


def test_settle_puts_the_alias_on_the_better_of_two_racing_promotions(tmp_path):
    """The race itself, interleaved by hand (a tracking server has no lock): both candidates
    read the same champion, both win, and the worse one writes the alias last."""
    client = client_for(TrackingConfig(root=str(tmp_path)))
    client.create_registered_model(NAME)
    for top1 in (0.70, 0.85, 0.80):
        v = client.create_model_version(NAME, source=str(tmp_path), run_id=None)
        champion_rules.record_evaluation(client, NAME, v.version, make_evaluation(top1), HASH)
    client.set_registered_model_alias(NAME, "champion", "1")
    better = champion_rules.decide(client, NAME, "2", make_evaluation(0.85), HASH)
    worse = champion_rules.decide(client, NAME, "3", make_evaluation(0.80), HASH)
    assert better.promoted and worse.promoted  # both compared with v1

    champion_rules.apply(client, NAME, better, content_hash=HASH)
    assert champion_rules.settle(client, NAME, better, HASH) == better
    champion_rules.apply(client, NAME, worse, content_hash=HASH)  # the worse writes last
    assert champion(client) == "3"
    settled = champion_rules.settle(client, NAME, worse, HASH)
    assert champion(client) == "2"
    assert (settled.promoted, settled.champion_version) == (False, "2")
    assert "ran at the same time" in settled.reason


CHILD_RACES = """
    import contextlib
    import json
    from pathlib import Path
    import tasks.registry.champion as champion_rules
    import tasks.registry.register as reg
    from tasks.registry.tracking import TrackingConfig
    from tests.tasks.registry.outcome_factory import make_outcome, tiny_model

    ME, TOP1, SEED = {me!r}, {top1}, {seed}
    # [[store root, sync folder, who goes first, mode], ...]; mode: "safe" (the code as it is),
    # "settle-only" (no store lock, as on a tracking server), "unsafe" (neither lock nor
    # settle(): the control, where the race is lost)
    ROUNDS = json.loads({rounds!r})
    outcome = make_outcome(tiny_model(SEED), TOP1, seed=SEED)
    state = {{}}
    # a guard against a broken schedule, never a window the test waits out
    STUCK_S = 300.0

    def locked():
        # With the store lock (mode "safe") the second cannot read the champion while the first
        # holds the lock: it says when it stands at the lock instead, and the first goes on.
        return state["mode"] == "safe"

    def wait(*paths):
        t = 0.0
        while not any(p.exists() for p in paths):
            if t > STUCK_S:
                raise SystemExit(f"{{ME}}: none of {{paths}} came within {{STUCK_S}} s")
            time.sleep(0.02)
            t += 0.02

    def second_blocked():
        # the second waiting at the lock the first holds: it cannot read or decide meanwhile
        return [state["sync"] / "second-at-lock"] if locked() else []

    # The schedule that makes the race real: the second registration asks for the promotion
    # lock only once the first has read the champion; the first, having read it, waits for the
    # second to read it too (or to stand blocked at the lock), and waits again before moving the
    # alias until the second has decided (or is blocked); the second moves the alias only after
    # the first did. Without the lock and settle(), both decide against the same champion and
    # the second writes last.
    original_lock, original_read = reg.store_lock, champion_rules.current_champion
    original_apply, original_settle = champion_rules.apply, champion_rules.settle

    def store_lock(tracking):
        if state["role"] == "second":
            wait(state["sync"] / "first-read")
            if locked():
                (state["sync"] / "second-at-lock").touch()
        if not locked():  # no lock, as on a tracking server
            return contextlib.nullcontext(False)
        return original_lock(tracking)

    def settle(client, name, decision, *args, **kwargs):
        if state["mode"] == "unsafe":  # the control: no settle() either
            return decision
        return original_settle(client, name, decision, *args, **kwargs)

    def current_champion(*args, **kwargs):
        holder = original_read(*args, **kwargs)
        if state["role"] == "first" and not state["read"]:
            state["read"] = True
            (state["sync"] / "first-read").touch()
            wait(state["sync"] / "second-read", *second_blocked())
        elif state["role"] == "second":
            (state["sync"] / "second-read").touch()
        return holder

    def apply(*args, **kwargs):
        if state["role"] == "second":
            (state["sync"] / "second-decided").touch()
            wait(state["sync"] / "first-applied")
        else:
            wait(state["sync"] / "second-decided", *second_blocked())
        original_apply(*args, **kwargs)
        if state["role"] == "first":
            (state["sync"] / "first-applied").touch()

    reg.store_lock = store_lock
    champion_rules.current_champion = current_champion
    champion_rules.apply = apply
    champion_rules.settle = settle
    for root, sync, first, mode in ROUNDS:
        state.update(
            role="first" if first == ME else "second", read=False, sync=Path(sync), mode=mode
        )
        reg.register_outcome(outcome, TrackingConfig(root=root))
"""


def race(tmp_path: Path, rounds: list[tuple[str, str]]) -> list[tuple[str, float]]:
    """Two real processes register a better (0.85) and a worse (0.80) model at once into a
    fresh store per round, `rounds[i]` = (the one first, mode: see CHILD_RACES); per round,
    (champion, its top-1)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    plan = []
    for i, (first, mode) in enumerate(rounds):
        sync = tmp_path / f"sync-{i}"
        sync.mkdir()
        plan.append([str(tmp_path / f"store-{i}"), str(sync), first, mode])
    from tests.faults import start_child

    children = []
    for me, top1, seed in (("better", 0.85, 1), ("worse", 0.80, 2)):
        code = CHILD_RACES.format(me=me, top1=top1, seed=seed, rounds=json.dumps(plan))
        log = tmp_path / f"{me}.log"
        children.append((start_child(code, log), log))
    for proc, log in children:
        rc = proc.wait()
        proc._heapcast_log.close()
        assert rc == 0, log.read_text()[-4000:]
    out = []
    for store, _, _, _ in plan:
        client = client_for(TrackingConfig(root=store))
        assert versions(client) == ["1", "2"]  # both registered, once each
        holder = client.get_model_version_by_alias(NAME, "champion")
        out.append((str(holder.version), float(holder.tags["heapcast.eval.top1"])))
    return out


# the races: a round with the better one first and one with the worse, with the code as it is;
# then the better first with no store lock (a tracking server), and with neither lock nor
# settle() (the control). One pair of processes runs them all, a fresh store each round. The
# schedule is forced by signals (CHILD_RACES), so a round interleaves the same way every time:
# one round per order shows what three did.
RACES = [("better", "safe"), ("worse", "safe")] + [
    ("better", "settle-only"),
    ("better", "unsafe"),
]


@pytest.fixture(scope="module")
def raced(tmp_path_factory) -> dict[str, list[tuple[str, float]]]:
    """Each mode's rounds' (champion, its top-1), in RACES' order."""
    champions = race(tmp_path_factory.mktemp("races"), RACES)
    out: dict[str, list[tuple[str, float]]] = {}
    for (_, mode), holder in zip(RACES, champions):
        out.setdefault(mode, []).append(holder)
    return out


def test_two_processes_registering_at_once_leave_the_alias_on_the_better(raced):
    # GIVEN two real processes, one registering a better and one a worse model, racing on the
    # same fresh SQLite store, a round with the better one first and one with the worse
    # WHEN they register at once (see CHILD_RACES for the schedule)
    # THEN every round ends with the alias on the better model, whichever wrote last
    assert [top1 for _, top1 in raced["safe"]] == [0.85] * 2, raced


def test_the_schedule_loses_the_race_without_the_protections(raced):
    # GIVEN the same schedule, the better model first, with no store lock (a tracking server)
    # WHEN  settle() runs as it does / is taken away too (the control)
    # THEN settle alone still leaves the better model; the control ends on the worse one, so the
    # race the tests above win is a real one
    assert [top1 for _, top1 in raced["settle-only"]] == [0.85], raced
    assert [top1 for _, top1 in raced["unsafe"]] == [0.80], raced


def test_run_child_reports_a_failing_child(tmp_path):
    with pytest.raises(AssertionError, match="ZeroDivisionError"):
        run_child("1 / 0", tmp_path / "child.log")
