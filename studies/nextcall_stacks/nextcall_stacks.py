"""The next-call network with and without each call's stack (issue 65, "the network reads the
stack": next call on the held-out programs, the network's top-1 at least 0.01 above the online
counter's), side by side in one run.

One split of the data root (tasks/learning/split.py, the named programs and workloads held out),
one config (--config, with the budget below the same for both arms), one seed; two networks
(tasks/learning/nextcall/model.py build_hybrid): `stacks` reads the first --depth frames of each
call's stack (model.frame_depth; tasks/dataset/frame_tokens.py, tasks/learning/stack_encoder.py),
`no stacks` is the config's network as it is (frame_depth 0). Each is scored as the night scores
it (tasks/learning/nextcall/training.py evaluate_model): the baselines, the online counter
(ngram_online), the network (model) and its hedge with the counter (model_hedged), on the
unseen runs, the programs never trained on and the held-out workloads.

Usage (the figures of studies/nextcall_stacks/README.md):

    .venv/bin/python studies/nextcall_stacks/nextcall_stacks.py --root data \\
        --heldout-programs git,perl --heldout-workloads numpy_stack
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tasks.core.storage import Root  # noqa: E402
from tasks.learning.evaluate import TABLES  # noqa: E402
from tasks.learning.scores import HEDGED_NEXT, MODEL, ONLINE_COUNTER, OVERALL  # noqa: E402
from tasks.learning.split import load_split  # noqa: E402
from tasks.learning.train_config import TrainConfig, load_train_config, merged_settings  # noqa: E402

RESULTS = Path(__file__).resolve().parent
ARMS = ("no_stacks", "stacks")
SHOWN = ("majority", "ngram", ONLINE_COUNTER, MODEL, HEDGED_NEXT)
GOAL = 0.01  # the margin of the network's top-1 over the online counter's


def arm_configs(a: argparse.Namespace) -> dict[str, TrainConfig]:
    """{arm: config}: --config with the study's split and budget, the stack's depth in `stacks`."""
    base = load_train_config(a.config).model_dump(mode="json")
    budget = {
        "data": {
            "heldout_programs": a.heldout_programs.split(","),
            "heldout_workloads": [w for w in a.heldout_workloads.split(",") if w],
            "max_train_tokens": a.train_tokens,
            "max_validation_tokens": a.validation_tokens,
            "max_eval_tokens": a.eval_tokens,
        },
        "epochs": a.epochs,
        "seed": a.seed,
    }
    return {
        arm: TrainConfig.model_validate(
            merged_settings(base, {**budget, "model": {"frame_depth": depth}})
        )
        for arm, depth in (("no_stacks", 0), ("stacks", a.depth))
    }


def run_arm(cfg: TrainConfig, split) -> dict:
    """Train one arm and score it as the night does: {seconds, epochs, scores}."""
    from tasks.learning.nextcall.fitting import fit_inputs
    from tasks.learning.nextcall.training import evaluate_model, training_inputs

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as ckpt:
        model, facts = fit_inputs(cfg, training_inputs(cfg, split), Path(ckpt), verbose=0)
    trained = time.perf_counter() - t0
    evaluation, _ = evaluate_model(model, cfg, split)
    scores = [
        {k: getattr(s, k) for k in ("predictor", "slice", "table", "positions", "top1", "top5",
                                    "log_loss")}
        for s in evaluation.scores
        if s.predictor in SHOWN
    ]  # fmt: skip
    return {
        "train_seconds": round(trained, 1),
        "epochs_run": len(facts["history"].get("loss", [])),
        "best_val_loss": min(facts["history"].get("val_loss", [float("nan")])),
        "scores": scores,
    }


def study(a: argparse.Namespace) -> dict:
    cfgs = arm_configs(a)
    root = Root.from_url(a.root)
    split = load_split(root, cfgs["stacks"].data)  # with call stacks: its model reads them
    out = {
        "config": a.config,
        "budget": {
            "train_tokens": split.train_tokens,
            "max_train_tokens": a.train_tokens,
            "max_eval_tokens": a.eval_tokens,
            "epochs": a.epochs,
            "seed": a.seed,
            "frame_depth": a.depth,
        },
        "split": {
            "train": [r.name for r in split.train],
            "validation": [r.name for r in split.validation],
            "unseen_runs": [r.name for r in split.evaluation],
            "unseen_programs": [r.name for r in split.unseen_programs],
            "heldout_workloads": [r.name for r in split.heldout],
        },
        "arms": {},
    }
    for arm in ARMS:
        out["arms"][arm] = run_arm(cfgs[arm], split)
        print(f"{arm}: trained in {out['arms'][arm]['train_seconds']} s", file=sys.stderr)
    out["goal"] = goal_rows(out)
    return out


def _index(result: dict) -> dict:
    return {
        (arm, s["table"], s["slice"], s["predictor"]): s
        for arm, got in result["arms"].items()
        for s in got["scores"]
    }


def goal_rows(result: dict) -> list[dict]:
    """Per table (all its programs pooled) and arm: the network's top-1 over the online
    counter's, and whether it clears GOAL."""
    idx = _index(result)
    rows = []
    for table in TABLES:
        for arm in ARMS:
            net, counter = (
                idx.get((arm, table, OVERALL, MODEL)),
                idx.get((arm, table, OVERALL, ONLINE_COUNTER)),
            )
            if net is None or counter is None:
                continue
            margin = net["top1"] - counter["top1"]
            rows.append(
                {"table": table, "arm": arm, "model": net["top1"], "online": counter["top1"],
                 "margin": round(margin, 4), "met": margin >= GOAL}
            )  # fmt: skip
    return rows


def _cell(s: dict | None) -> str:
    return "-" if s is None else f"{s['top1']:.4f} / {s['log_loss']:.3f}"


def markdown(result: dict, command: str) -> str:
    """Per table and program: each baseline's top-1 / log-loss (the same in both arms), the
    network's and the hedge's in each arm; then the goal's verdict per table."""
    idx = _index(result)
    b = result["budget"]
    lines = [
        f"`{command}`",
        "",
        f"Trained on {b['train_tokens']:,} calls ({', '.join(result['split']['train'])}), "
        f"at most {b['epochs']} epochs, seed {b['seed']}; seconds: "
        + ", ".join(f"{arm} {result['arms'][arm]['train_seconds']}" for arm in ARMS)
        + "; epochs run: "
        + ", ".join(f"{arm} {result['arms'][arm]['epochs_run']}" for arm in ARMS)
        + ".",
        "",
    ]
    for table in TABLES:
        slices = sorted({k[2] for k in idx if k[1] == table}, key=lambda s: (s == OVERALL, s))
        if not slices:
            continue
        lines += [
            f"### {table}: top-1 / log-loss",
            "",
            "| program | positions | majority | ngram | online counter | network: no stacks "
            "| network: stacks | hedged: no stacks | hedged: stacks |",
            "|---" * 9 + "|",
        ]
        for sl in slices:
            base = [idx.get(("stacks", table, sl, p)) for p in SHOWN[:3]]
            arms = [idx.get((arm, table, sl, p)) for p in SHOWN[3:] for arm in ARMS]
            n = next(s["positions"] for s in base + arms if s)
            cells = " | ".join(_cell(s) for s in base + arms)
            lines.append(f"| {sl} | {n:,} | {cells} |")
        lines.append("")
    lines += [
        f"### The goal: the network's top-1 at least {GOAL} above the online counter's",
        "",
        "| table | arm | network | online counter | margin | met |",
        "|---|---|---|---|---|---|",
    ]
    for g in result["goal"]:
        lines.append(
            f"| {g['table']} | {g['arm']} | {g['model']:.4f} | {g['online']:.4f} | "
            f"{g['margin']:+.4f} | {'yes' if g['met'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True, help="a data root with call stacks (`make run`: data)")
    ap.add_argument("--config", default="configs/train-quick.yaml")
    ap.add_argument("--heldout-programs", default="git,perl")
    ap.add_argument("--heldout-workloads", default="numpy_stack")
    ap.add_argument("--train-tokens", type=int, default=600_000, help="data.max_train_tokens")
    ap.add_argument("--validation-tokens", type=int, default=100_000)
    ap.add_argument("--eval-tokens", type=int, default=200_000, help="data.max_eval_tokens")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--depth", type=int, default=8, help="model.frame_depth of the stacks arm")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="nextcall_stacks", help="the results' file name")
    return ap.parse_args()


def main() -> None:
    a = parse_args()
    result = study(a)
    args = " ".join(sys.argv[1:]).replace(a.root, "data")
    command = f".venv/bin/python studies/nextcall_stacks/nextcall_stacks.py {args}"
    result["command"] = command
    result["root"] = "data"
    (RESULTS / f"{a.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (RESULTS / f"{a.name}.md").write_text(markdown(result, command))
    print((RESULTS / f"{a.name}.md").read_text())


if __name__ == "__main__":
    main()
