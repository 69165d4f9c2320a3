"""Fault drill: provoke, for real, every fault a night must survive, several times each, and
check after each attempt that nothing was lost, nothing duplicated, and the champion never got
worse. The faults are provoked the way the tests provoke them (tests/faults.py and the
*_faults / *_killed test modules): a step that raises, a process SIGKILLed at a chosen point,
two processes racing on one store, a night on broken data, a full disk (a small tmpfs).

    .venv/bin/python studies/fault_drill/fault_drill.py                 # 3 attempts of each fault
    .venv/bin/python studies/fault_drill/fault_drill.py --attempts 5 --json /tmp/drill.json

The full-disk drill mounts a tmpfs (root only; the row says "skipped" otherwise). The control
row runs the registration race without the store lock and without settle(): it shows the drill
sees a worse champion when the protection is missing.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tests.conftest  # noqa: E402,F401  (the tests' environment: Prefect home in a temp folder)


@dataclass
class Attempt:
    nothing_lost: bool
    nothing_duplicated: bool
    champion_never_worse: bool | None  # None: no champion involved
    note: str = ""


@dataclass
class Row:
    fault: str
    attempts: list[Attempt] = field(default_factory=list)
    skipped: str | None = None
    seconds: float = 0.0

    def cell(self, name: str) -> str:
        if self.skipped:
            return "skipped"
        values = [getattr(a, name) for a in self.attempts]
        if all(v is None for v in values):
            return "n/a"
        bad = sum(1 for v in values if v is False)
        return "yes" if not bad else f"NO ({bad} of {len(values)})"


def versions_and_champion(store: Path) -> tuple[list, object | None]:
    from mlflow import MlflowClient

    from tasks.registry.champion import current_champion
    from tasks.registry.tracking import TrackingConfig, configure

    configure(TrackingConfig(root=str(store)))
    client = MlflowClient()
    found = sorted(
        client.search_model_versions("name = 'heapcast-next-call'"), key=lambda v: int(v.version)
    )
    return found, current_champion(client, "heapcast-next-call", "champion")


def registry_state(store: Path) -> dict:
    """Per version: its top-1, whether its registration completed, its key; the champion."""
    from mlflow import MlflowClient

    from tasks.registry.register import TAG_KEY, TAG_STATE

    found, holder = versions_and_champion(store)
    client = MlflowClient()
    out = []
    for v in found:
        run = client.get_run(v.run_id)
        out.append(
            {
                "version": str(v.version),
                "top1": float(v.tags.get("heapcast.eval.top1", "nan")),
                "complete": run.data.tags.get(TAG_STATE) == "complete",
                "key": run.data.tags.get(TAG_KEY),
            }
        )
    return {"versions": out, "champion": None if holder is None else str(holder.version)}


def champion_is_best(state: dict) -> bool:
    complete = [v for v in state["versions"] if v["complete"]]
    if not complete:
        return state["champion"] is None
    best = max(v["top1"] for v in complete)
    held = next((v for v in complete if v["version"] == state["champion"]), None)
    return held is not None and held["top1"] == best


# ----------------------------------------------------------------------------- registry


def drill_register_retry(work: Path, n: int) -> list[Attempt]:
    """The Prefect task `register` (its own retries) fails once: right after its model was
    logged, after the alias moved, or before its model existed."""
    import tasks.registry.champion as champion_rules
    from tasks.registry import register as register_module
    from tasks.registry.register import register, register_outcome, registration_key
    from tasks.registry.tracking import TrackingConfig
    from tests.tasks.registry.outcome_factory import make_outcome, tiny_model

    store = work / "store"
    tracking = TrackingConfig(root=str(store))
    model = tiny_model(0)
    register_outcome(make_outcome(model, 0.60, seed=100), tracking)
    steps = itertools.cycle(
        [
            (champion_rules, "record_evaluation", "after log_model"),
            (champion_rules, "log_decision", "after the alias moved"),
            (register_module, "log_keras_model", "before the model"),
        ]
    )
    scores = itertools.cycle([0.70, 0.64, 0.78, 0.75, 0.81])
    out = []
    for i in range(n):
        module, name, where = next(steps)
        outcome = make_outcome(model, next(scores), seed=i)
        original = getattr(module, name)

        def fails_once(*args, _module=module, _name=name, _original=original, **kwargs):
            setattr(_module, _name, _original)
            raise ConnectionError(f"provoked: {_name} failed")

        setattr(module, name, fails_once)
        try:
            result = register.with_options(retry_delay_seconds=0)(outcome, tracking, None)
        finally:
            setattr(module, name, original)
        state = registry_state(store)
        key = registration_key(outcome, tracking.model_name)
        mine = [v for v in state["versions"] if v["key"] == key]
        out.append(
            Attempt(
                nothing_lost=len(mine) == 1
                and mine[0]["complete"]
                and mine[0]["version"] == result.version,
                nothing_duplicated=len(mine) == 1 and len(state["versions"]) == i + 2,
                champion_never_worse=champion_is_best(state),
                note=f"failed {where}",
            )
        )
    return out


def drill_register_killed(work: Path, n: int) -> list[Attempt]:
    """A process registering a model is SIGKILLed once its version exists; then the same model
    is registered again (a retry), or the next night registers another one."""
    from tasks.registry.register import register_outcome
    from tasks.registry.tracking import TrackingConfig
    from tests.tasks.registry.outcome_factory import make_outcome, tiny_model
    from tests.tasks.registry.test_registry_faults import kill_a_registration

    store = work / "store"
    tracking = TrackingConfig(root=str(store))
    register_outcome(make_outcome(tiny_model(0), 0.60, seed=0), tracking)
    scores = itertools.cycle([0.72, 0.66, 0.80, 0.77, 0.84])
    out = []
    for i in range(n):
        seed, top1 = 10 + i, next(scores)
        key = kill_a_registration(work, store, seed=seed, top1=top1)
        if i % 2 == 0:  # the same model again: its version is finished, not duplicated
            register_outcome(make_outcome(tiny_model(seed), top1, seed=seed), tracking)
            expect_killed = 1
            how = "retried"
        else:  # another model: the killed registration's version is removed
            other = make_outcome(tiny_model(100 + i), top1 - 0.03, seed=100 + i)
            register_outcome(other, tracking)
            expect_killed = 0
            how = "next night registered another"
        state = registry_state(store)
        killed = [v for v in state["versions"] if v["key"] == key]
        out.append(
            Attempt(
                nothing_lost=all(v["complete"] for v in state["versions"])
                and len(killed) == expect_killed,
                nothing_duplicated=len({v["key"] for v in state["versions"]})
                == len(state["versions"]),
                champion_never_worse=champion_is_best(state),
                note=how,
            )
        )
    return out


def drill_race(work: Path, n: int, mode: str = "safe") -> list[Attempt]:
    """Two processes register a better (0.85) and a worse (0.80) model at once, into a fresh
    SQLite store per round; the better one first in half the rounds, the worse in the others."""
    from tests.tasks.registry.test_registry_faults import race

    orders = (["better", "worse"] * n)[: max(n, 2)]
    try:
        champions = race(work, orders, mode=mode)
    except AssertionError as err:  # a store without exactly one version per model
        return [Attempt(False, False, False, str(err)[:200]) for _ in orders]
    return [
        Attempt(True, True, top1 == 0.85, f"{first} first: champion {top1}")
        for first, (_, top1) in zip(orders, champions)
    ]


# ----------------------------------------------------------------------------- bad nights


def drill_bad_night(work: Path, n: int, kind: str) -> list[Attempt]:
    """Nights on broken data (every replay failed / an evaluation under min_eval_positions)
    over a root with a champion: nothing registered, the summary says why."""
    from flows.nightly import nightly
    from tasks.nightly.night_summary import ARTIFACT_KEY, NothingTrained
    from tasks.nightly.params import NightlyParams
    from tests.flows.flow_harness import TINY_TRAINING, latest_artifact
    from tests.flows.test_nightly_faults import CATALOG, ONLY_ALPHA, root_with_a_champion

    root = root_with_a_champion(work)
    before = registry_state(Path(root.path))
    out = []
    for i in range(n):
        if kind == "replays":
            params = NightlyParams(
                root=root.url,
                quick=True,
                trace={"catalog": str(CATALOG), "workloads": ["broken"], "runner": "local"},
                train={"overrides": TINY_TRAINING},
            )
            why = "every replay failed"
        else:
            minimum = [50_000, 10_000, 1_000_000][i % 3]
            params = NightlyParams(
                root=root.url,
                trace={"workloads": ["no-such-workload"]},
                train={
                    "overrides": {
                        **TINY_TRAINING,
                        "data": {**ONLY_ALPHA, "min_eval_positions": minimum},
                    }
                },
            )
            why = "min_eval_positions"
        failed_as_it_should = False
        try:
            nightly(params)
        except NothingTrained as err:
            failed_as_it_should = why in str(err)
        page = latest_artifact(ARTIFACT_KEY)
        after = registry_state(Path(root.path))
        out.append(
            Attempt(
                nothing_lost=after["champion"] == before["champion"]
                and failed_as_it_should
                and "Nothing was registered tonight" in page
                and why in page,
                nothing_duplicated=after["versions"] == before["versions"],
                champion_never_worse=after["champion"] == before["champion"],
                note=why,
            )
        )
    return out


# ----------------------------------------------------------------------------- dataset


def drill_killed_conversion(work: Path, n: int, client) -> list[Attempt]:
    from tasks.core.storage import Root
    from tasks.dataset.partitions import convert_run, runs_to_convert, sweep_staging
    from tests.tasks.dataset.test_partition_faults import (
        RUN,
        add_raw,
        events,
        kill_a_conversion,
        reference,
        staged_files,
    )

    out = []
    points = itertools.cycle(["writing", "before-commit", "after-swap"])
    for i in range(n):
        point = next(points)
        d = work / f"attempt-{i}"
        root_dir = d / "root"
        root = Root.from_url(str(root_dir))
        add_raw(root_dir, RUN, 100, 6000 + 1000 * i)
        add_raw(root_dir, RUN, 200, 4000)
        convert_run(root, RUN, client=client)
        old = events(root)
        add_raw(root_dir, RUN, 300, 8000)
        new = reference(d, root_dir, client, point)
        kill_a_conversion(d, root_dir, point)
        seen = events(root)
        one_visible = seen.equals(new if point == "after-swap" else old)
        todo = runs_to_convert(root)
        sweep_staging(root, todo)
        for run in todo:
            convert_run(root, run, client=client)
        final = events(root)
        keys = final.select(["pid", "thread", "seq"]).to_pandas()
        out.append(
            Attempt(
                nothing_lost=one_visible and final.equals(new),
                nothing_duplicated=not keys.duplicated().any() and not staged_files(root_dir),
                champion_never_worse=None,
                note=f"killed {point}",
            )
        )
    return out


def drill_disk_full(work: Path, n: int, client) -> list[Attempt]:
    from tasks.dataset.partitions import DiskFull, convert_run
    from tests.tasks.dataset import test_partition_faults as faults

    out = []
    for i in range(n):
        root_dir = work / f"attempt-{i}" / "root"
        with faults.two_runs_on_a_small_disk(root_dir, client) as (
            root,
            disk,
            before,
            before_other,
        ):
            free = shutil.disk_usage(disk).free
            faults.add_raw(root_dir, faults.RUN, 300, [1_400_000, 2_000_000, 3_000_000][i % 3])
            message = ""
            try:
                convert_run(root, faults.RUN, client=client)
            except DiskFull as err:
                message = str(err)
            named = message.startswith("w/r1:") and "needs about" in message
            needs = message.split("needs about ")[1].split(" under")[0] if named else ""
            out.append(
                Attempt(
                    nothing_lost=named
                    and faults.events(root, runs=["r1"]).equals(before)
                    and faults.events(root, runs=["other"]).equals(before_other),
                    nothing_duplicated=not faults.staged_files(root_dir)
                    and shutil.disk_usage(disk).free == free,
                    champion_never_worse=None,
                    note=f"w/r1 needs about {needs}" if named else f"no DiskFull: {message[:80]}",
                )
            )
    return out


# ----------------------------------------------------------------------------- training


def drill_killed_training(work: Path, n: int) -> list[Attempt]:
    from tasks.core.storage import Root
    from tasks.dataset.synthetic_events import write_synthetic_events
    from tasks.learning.train import train
    from tasks.replay.workloads import load_catalog
    from tests.tasks.learning.nextcall.test_train_killed import Epochs, kill_training, tiny

    root = Root.from_url(str(work / "events"))
    write_synthetic_events(root, {"alpha": 3, "beta": 2}, tokens_per_run=3000)
    out = []
    for i in range(n):
        d = work / f"attempt-{i}"
        d.mkdir()
        cfg = tiny(d)
        batch = i % 4
        kill_training(d, root, cfg, epoch=1, batch=batch)
        epochs = Epochs()
        trained = train.fn(root, cfg, load_catalog(cfg.data.catalog), callbacks=[epochs])
        out.append(
            Attempt(
                nothing_lost=trained.initial_epoch == 1 and epochs.seen == [1, 2],
                nothing_duplicated=len(trained.history["loss"]) == 3,
                champion_never_worse=None,
                note=f"killed at epoch 2, batch {batch + 1}; resumed at epoch "
                f"{trained.initial_epoch + 1}",
            )
        )
    return out


def drill_torn_backup(work: Path, n: int) -> list[Attempt]:
    """The training process is SIGKILLed half-way through writing an epoch's backup."""
    from tasks.core.storage import Root
    from tasks.dataset.synthetic_events import write_synthetic_events
    from tasks.learning.train import train
    from tasks.replay.workloads import load_catalog
    from tests.tasks.learning.nextcall.test_train_killed import Epochs, kill_training, tiny

    root = Root.from_url(str(work / "events"))
    write_synthetic_events(root, {"alpha": 3, "beta": 2}, tokens_per_run=3000)
    out = []
    torn = itertools.cycle(["weights", "metadata"])
    for i in range(n):
        d = work / f"attempt-{i}"
        d.mkdir()
        cfg = tiny(d)
        which = next(torn)
        kill_training(d, root, cfg, epoch=1, batch=0, torn=which)
        epochs = Epochs()
        try:
            trained = train.fn(root, cfg, load_catalog(cfg.data.catalog), callbacks=[epochs])
        except Exception as err:  # what happened before: every later night failed here
            out.append(Attempt(False, True, None, f"{which} torn: {type(err).__name__}"))
            continue
        out.append(
            Attempt(
                nothing_lost=epochs.seen == [0, 1, 2]
                and any(n.startswith("discarded the unreadable") for n in trained.notes),
                nothing_duplicated=len(trained.history["loss"]) == 3,
                champion_never_worse=None,
                note=f"{which} torn; trained again from epoch 1",
            )
        )
    return out


# ----------------------------------------------------------------------------- the drill


def run_row(rows: list[Row], fault: str, work: Path, fn: Callable[[Path], list[Attempt]]):
    row = Row(fault)
    t0 = time.monotonic()
    folder = work / f"{len(rows):02d}"
    folder.mkdir(parents=True)
    try:
        with contextlib.redirect_stdout(sys.stderr):  # Keras' progress lines: not the table's
            row.attempts = fn(folder)
    except SkipDrill as why:
        row.skipped = str(why)
    except Exception as err:  # a drill that crashed is a failed drill, not a silent one
        traceback.print_exc()
        row.attempts = [Attempt(False, False, False, f"drill crashed: {err!r}"[:200])]
    row.seconds = time.monotonic() - t0
    rows.append(row)
    print(f"  {fault}: {row.cell('nothing_lost')} ({row.seconds:.0f} s)", file=sys.stderr)
    return row


class SkipDrill(Exception):
    pass


def table(rows: list[Row]) -> str:
    head = [
        "| fault | attempts | nothing lost | nothing duplicated | champion never worse | seconds |",
        "|---|---:|---|---|---|---:|",
    ]
    lines = [
        f"| {r.fault} | {len(r.attempts) if not r.skipped else 0} | {r.cell('nothing_lost')} | "
        f"{r.cell('nothing_duplicated')} | {r.cell('champion_never_worse')} | {r.seconds:.0f} |"
        for r in rows
    ]
    notes = []
    for r in rows:
        if r.skipped:
            notes.append(f"- {r.fault}: skipped: {r.skipped}")
        else:
            notes.append(f"- {r.fault}: " + "; ".join(a.note for a in r.attempts if a.note))
    return "\n".join(head + lines) + "\n\n" + "\n".join(notes) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attempts", type=int, default=3, help="attempts of each fault (>= 3)")
    ap.add_argument("--json", default=None, help="also write the rows as JSON here")
    ap.add_argument("--no-control", action="store_true", help="skip the unprotected race")
    return ap.parse_args(argv)


def drills(n: int, dask, control: bool) -> list[tuple[str, Callable[[Path], list[Attempt]]]]:
    """Every fault a night must survive, in the order they run: (what, the drill on a folder)."""
    from tests.faults import can_mount_tmpfs

    def disk_full(w: Path) -> list[Attempt]:
        if not can_mount_tmpfs():
            raise SkipDrill("mounting a tmpfs needs root")
        return drill_disk_full(w, n, dask)

    return [
        (
            "register fails once (after log_model / after the alias moved / before the model), Prefect retries",
            lambda w: drill_register_retry(w, n),
        ),
        (
            "registering process SIGKILLed after its version was created",
            lambda w: drill_register_killed(w, n),
        ),
        (
            "two processes register a better and a worse model at once (both orders)",
            lambda w: drill_race(w, 2 * n),
        ),
        (
            "the same race with no store lock, as on a tracking server: settle() alone",
            lambda w: drill_race(w, 2 * n, mode="settle-only"),
        ),
        *(
            [
                (
                    "CONTROL: the same race without the store lock and settle()",
                    lambda w: drill_race(w, 2 * n, mode="unsafe"),
                )
            ]
            if control
            else []
        ),
        ("bad night: every replay failed", lambda w: drill_bad_night(w, n, "replays")),
        (
            "bad night: evaluation below data.min_eval_positions",
            lambda w: drill_bad_night(w, n, "eval"),
        ),
        (
            "conversion SIGKILLed (mid-part / before commit / after swap), next run",
            lambda w: drill_killed_conversion(w, n, dask),
        ),
        ("data root's disk fills during conversion (8 MiB tmpfs)", disk_full),
        ("training SIGKILLed mid-epoch, next run", lambda w: drill_killed_training(w, n)),
        (
            "training SIGKILLed while writing its backup, next run",
            lambda w: drill_torn_backup(w, n),
        ),
    ]


def write_json(rows: list[Row], path: str) -> None:
    Path(path).write_text(
        json.dumps(
            [
                {
                    "fault": r.fault,
                    "skipped": r.skipped,
                    "seconds": r.seconds,
                    "attempts": [a.__dict__ for a in r.attempts],
                }
                for r in rows
            ],
            indent=1,
        )
    )


def passed(rows: list[Row]) -> bool:
    """Nothing lost or duplicated and the champion never worse in every protected row, and the
    control lost at least one round (or the race rows prove nothing)."""
    protected = [r for r in rows if not r.fault.startswith("CONTROL") and not r.skipped]
    ok = all(
        a.nothing_lost and a.nothing_duplicated and a.champion_never_worse is not False
        for r in protected
        for a in r.attempts
    )
    control = [r for r in rows if r.fault.startswith("CONTROL")]
    if control and not any(a.champion_never_worse is False for a in control[0].attempts):
        print("fault drill: the CONTROL race never lost: its schedule no longer provokes the race")
        ok = False
    return ok


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    n = max(3, a.attempts)

    from distributed import Client
    from prefect.testing.utilities import prefect_test_harness

    # as the flow tests run: the embedded store under each root, a one-worker local cluster
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.environ.pop("HEAPCAST_DASK_SCHEDULER", None)
    os.environ["HEAPCAST_DASK_WORKERS"] = "1"
    work = Path(tempfile.mkdtemp(prefix="heapcast-fault-drill-"))
    rows: list[Row] = []
    t0 = time.monotonic()
    print(f"fault drill: {n} attempts of each fault, in {work}", file=sys.stderr)
    with (
        prefect_test_harness(server_startup_timeout=90),
        Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None) as dask,
    ):
        for fault, drill in drills(n, dask, control=not a.no_control):
            run_row(rows, fault, work, drill)
    print()
    print(f"# heapcast fault drill ({n} attempts each, {time.monotonic() - t0:.0f} s)")
    print()
    print(table(rows))
    if a.json:
        write_json(rows, a.json)
    shutil.rmtree(work, ignore_errors=True)
    return 0 if passed(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
