"""The wide catalog (issue 43): 40 programs and more, each with two inputs or more, a kind for
every workload, a fixed held-out set of programs of several kinds, deterministic generators, and
every program of the grouped `tools` and `langs` images replayed traced in its image."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tasks.core.storage import Root
from tasks.format.trace_reader import Op, read_trace
from tasks.learning.split import plan_split
from tasks.learning.train_config import load_train_config
from tasks.replay import inputs as inputs_module
from tasks.replay.images import build_all
from tasks.replay.inputs import generate_input
from tasks.replay.inputs_programs import WIDE_GENERATORS
from tasks.replay.replays import replay_input
from tasks.replay.runners.base import SANDBOX_BIN, SANDBOX_INPUT, SANDBOX_WORK
from tasks.replay.workloads import Workload, WorkloadInput, load_catalog
from tests.tasks.replay.replay_checks import assert_seeded_flat_input, tracer_path

NEW_IMAGES = ("tools", "langs")


def _new_workloads() -> list[Workload]:
    return [w for w in load_catalog().workloads if w.image in NEW_IMAGES]


def test_catalog_has_40_programs_each_with_two_inputs_and_a_kind():
    catalog = load_catalog()
    programs = set(catalog.programs().values())
    assert len(programs) >= 40, sorted(programs)
    for w in catalog.workloads:
        assert len(w.inputs) >= 2, w.name
        assert w.kind is not None, f"{w.name}: every workload of the shipped catalog has a kind"
    # the kinds the issue asks for are there
    kinds = {w.kind for w in catalog.workloads}
    assert {"compiler", "interpreter", "database", "server", "compression", "text"} <= kinds
    assert {"document", "image", "build", "numeric", "threads"} <= kinds


def test_new_programs_are_grouped_in_two_images_with_small_and_medium_inputs_not_quick():
    new = _new_workloads()
    assert len({w.program or w.name for w in new}) >= 25
    assert {w.image for w in new} == set(NEW_IMAGES)
    for w in new:
        assert [i.name for i in w.inputs] == ["small", "medium"], w.name
        assert w.inputs[0].size < w.inputs[1].size, w.name
        assert not any(i.quick for i in w.inputs), w.name
    seeds = [i.seed for w in new for i in w.inputs]
    assert len(seeds) == len(set(seeds))


def test_quick_night_keeps_its_programs():
    # the quick night replays only `quick: true` inputs: none of the new programs enters it
    quick = load_catalog().select(quick=True)
    assert quick and all(i.quick for _, i in quick)
    assert {w.image for w, _ in quick}.isdisjoint(NEW_IMAGES)


def test_heldout_programs_are_eight_programs_of_five_kinds_in_the_catalog():
    catalog = load_catalog()
    heldout = load_train_config().data.heldout_programs
    kinds = catalog.program_kinds()
    assert len(heldout) == len(set(heldout)) >= 8
    assert set(heldout) <= set(kinds), set(heldout) - set(kinds)
    assert {"perl", "redis", "freeciv"} <= set(heldout)
    assert len(set().union(*(kinds[p] for p in heldout))) >= 5


def test_no_heldout_program_is_trained_under_another_workload_s_name():
    """The split the night plans over the whole catalog (every workload replayed twice) trains
    no workload whose program is held out, and holds out every workload of those programs; and a
    held-out program's executable is run by no workload declared as another program (python3
    under `cpython` and `tensorflow` is one interpreter for two programs, neither held out)."""
    catalog = load_catalog()
    data = load_train_config().data.model_copy(update={"workloads": None})
    programs = catalog.programs()
    plan = plan_split({w: ["r1", "r2"] for w in programs}, data, programs)
    trained = {w for w, parts in plan.items() if parts["train"]}
    held = {w for w, parts in plan.items() if parts["heldout"] or parts["unseen"]}
    assert trained and held
    assert not {programs[w] for w in trained} & set(data.heldout_programs)
    assert {w for w, p in programs.items() if p in data.heldout_programs} <= held
    executables = {w.name: _executable(w) for w in catalog.workloads}
    for p in data.heldout_programs:
        own = {executables[w] for w, q in programs.items() if q == p}
        others = [w for w, q in programs.items() if q != p and executables[w] in own]
        assert not others, f"{others} run {p}'s executable {own} under another program's name"


# the catalog's one generic wrapper: `stdout-to.sh FILE PROGRAM ARGS...` (configs/workloads.yaml)
STDOUT_TO = "{bin}/stdout-to.sh"


def _executable(w: Workload) -> str:
    """The program a workload's command runs (past the stdout wrapper)."""
    return w.command[2] if w.command[0] == STDOUT_TO else w.command[0]


@pytest.mark.parametrize("generator", sorted(WIDE_GENERATORS))
def test_new_generator_same_seed_same_bytes(generator, tmp_path):
    assert_seeded_flat_input(generator, 12, tmp_path)


# ---------------------------------------------------------------- integration

RC_MARK = "heapcast-rc"


def _bundle(image: str, members: list[Workload], monkeypatch) -> Workload:
    """One workload that runs every member's small input in one container of `image`, one
    after the other: each with its own input and work folder (/heapcast/input/<name>,
    /heapcast/work/<name>), its environment and its command as the catalog gives them, its
    output in its work folder, its exit code on a line of the log."""

    def generate(seed: int, size: int, dest: Path) -> list[str]:
        names: list[str] = []
        lines = ["set -u"]
        for w in members:
            inp = w.input("small")
            sub = dest / w.name
            files = generate_input(w.generator, inp.seed, inp.size, sub)
            sub.chmod(0o755)
            names += [f"{w.name}/{f}" for f in files]
            fields = {
                "input": f"{SANDBOX_INPUT}/{w.name}",
                "work": f"{SANDBOX_WORK}/{w.name}",
                "bin": str(SANDBOX_BIN),
                "seed": str(inp.seed),
                "size": str(inp.size),
                "name": inp.name,
            }
            argv = [a.format(**fields) for a in w.command]
            work = shlex.quote(fields["work"])
            env = {"HOME": fields["work"]} | {k: v.format(**fields) for k, v in w.env.items()}
            exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
            lines.append(
                f"mkdir -p {work} && (cd {work} && export {exports} && exec {shlex.join(argv)})"
                f" >{work}/log 2>&1; echo {RC_MARK} {w.name} $?"
            )
        (dest / "run-all.sh").write_text("\n".join(lines) + "\n")
        return ["run-all.sh", *names]

    generator = f"test_bundle_{image}"
    monkeypatch.setitem(inputs_module.GENERATORS, generator, generate)  # the catalog's dict too
    return Workload(
        name=f"bundle_{image}",
        image=image,
        generator=generator,
        command=["/bin/bash", "{input}/run-all.sh"],
        inputs=[WorkloadInput(name="small", seed=0, size=1)],
        time_limit_s=600,
        memory="2g",
    )


@pytest.mark.integration
def test_every_new_program_replays_its_small_input_traced_in_its_image(
    engine, tmp_path, monkeypatch
):
    # GIVEN the two grouped images, built once each
    build_all(list(NEW_IMAGES), host=engine)
    tracer = tracer_path()
    failures: list[str] = []
    for image in NEW_IMAGES:
        members = [w for w in _new_workloads() if w.image == image]
        bundle = _bundle(image, members, monkeypatch)
        # WHEN every program's small input runs in one container of its image, traced with
        # call sites
        root = tmp_path / image
        m = replay_input(
            bundle,
            bundle.inputs[0],
            tracer,
            root=Root.from_url(str(root)),
            runner="docker",
            caller=True,
        )
        assert m.ok and m.image == f"heapcast/{image}:bookworm", m.error
        # THEN each exits with the code the catalog expects ...
        codes = {}
        for line in m.log_tail.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == RC_MARK:
                codes[parts[1]] = int(parts[2])
        # ... and its process (the one whose command line names its input folder) recorded
        # heap calls, each with a call site
        run_dir = root / "raw" / bundle.name / "small"
        traces = [read_trace(run_dir / f) for f in m.files]
        for w in members:
            if codes.get(w.name) != w.expected_exit_code:
                failures.append(
                    f"{w.name}: exit {codes.get(w.name)}, expected {w.expected_exit_code}"
                )
                continue
            mine = [
                t
                for t in traces
                if any(f"{SANDBOX_INPUT}/{w.name}/" in a for a in t.header.cmdline)
            ]
            events = sum(int((t.op != Op.THREAD_START).sum()) for t in mine)
            callers = sum(int((t.caller != 0).sum()) for t in mine if t.caller is not None)
            if not mine or events == 0 or callers == 0:
                failures.append(
                    f"{w.name}: {len(mine)} trace files, {events} records, {callers} call sites"
                )
    assert not failures, failures
