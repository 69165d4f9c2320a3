"""The GPU's training against this machine's CPU, on one training bundle (scripts/gpu_check.sh).

    python studies/gpu_training/gpu_training.py REFERENCE_DIR DEVICE_DIR [-o studies/gpu_training/gpu_training.md]

REFERENCE_DIR: the bundle trained here (scripts/gpu_check.sh reference: TensorFlow on the CPU, the
config's batch). DEVICE_DIR: what the device call brought back (device.txt, batch/ and gpu_batch/,
each with result.json). Writes a table: where each trained, positions trained per second and its
ratio to the CPU's, epochs, seconds, and the unseen-runs table's top-1, top-5 and log-loss, and
the issue's goals (>= 30x at the config's batch, >= 100x at the GPU's, top-1 within 0.005).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent


def _row(label: str, r: dict, ref: dict) -> str:
    p, o = r["placement"], r["unseen_runs"].get("all", {})
    ref_o = ref["unseen_runs"].get("all", {})
    ratio = r["positions_per_second"] / ref["positions_per_second"]
    return (
        f"| {label} | {p['backend']} | {p['device']} | {p['precision']} | {p['batch_size']} | "
        f"{r['positions_per_second']:,.0f} | {ratio:.1f}x | {r['epochs']} | "
        f"{r['train_seconds']:.0f} | {o.get('top1', float('nan')):.4f} "
        f"({o.get('top1', float('nan')) - ref_o.get('top1', float('nan')):+.4f}) | "
        f"{o.get('top5', float('nan')):.4f} | {o.get('log_loss', float('nan')):.4f} |"
    )


def compare(reference: Path, device: Path) -> tuple[str, dict]:
    ref = json.loads((reference / "result.json").read_text())
    runs = {"CPU (reference)": ref}
    for name, label in (("batch", "GPU, the config's batch"), ("gpu_batch", "GPU, its batch")):
        f = device / name / "result.json"
        if f.exists():
            runs[label] = json.loads(f.read_text())
    lines = [
        "# The network trained on a GPU against this machine's CPU, one bundle",
        "",
        "`scripts/gpu_check.sh` (prepare, reference, the device call, compare). Bundle: "
        f"`{ref['source']}`, config model {ref['config']['model']['kind']} "
        f"{ref['config']['model']['units']}, context {ref['config']['context']}.",
        "",
        "| where | backend | device | precision | batch | positions/s | vs CPU | epochs | "
        "train s | unseen top-1 (vs CPU) | top-5 | log-loss |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [_row(label, r, ref) for label, r in runs.items()]
    dev = device / "device.txt"
    if dev.exists():
        lines += ["", "Device:", "", "```", dev.read_text().strip(), "```"]
    goals = {}
    top1 = ref["unseen_runs"].get("all", {}).get("top1", float("nan"))
    for label, key, want in (
        ("GPU, the config's batch", "speedup_batch", 30),
        ("GPU, its batch", "speedup_gpu_batch", 100),
    ):
        if label in runs:
            r = runs[label]
            goals[key] = r["positions_per_second"] / ref["positions_per_second"]
            goals[key + "_met"] = goals[key] >= want
            goals[key + "_top1_delta"] = r["unseen_runs"]["all"]["top1"] - top1
    lines += ["", "Goals: " + json.dumps(goals)]
    return "\n".join(lines) + "\n", goals


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("reference", type=Path)
    p.add_argument("device", type=Path)
    p.add_argument("-o", "--output", type=Path, default=RESULTS / "gpu_training.md")
    a = p.parse_args()
    text, _ = compare(a.reference, a.device)
    a.output.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
