"""The layer's table (native/TABLE.md, tasks/learning/table/distill.py): what it answers, and its cost.

Part 1, on a data root: the table built from the split's training runs, at every evaluation
free of the three tables: its coverage, its agreement with the per-process class counter, and
the reuse question's top-1 and log-loss of every model-free predictor (question_evaluation).
Part 2, in C: one lookup as the layer makes it against the online counter's question it
replaces (predictor.h: hcp_soon), the minimum over --reps rounds. The details:
docs/speeds-layer.md#the-layer-table-benchmark.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_layer_table.py [--root DIR]         [--config configs/train-quick.yaml] [--reps 5] [--lookups 20000000]

writes benchmarks/results/layer_table.json.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from benchmarks.harness import write_result
from tasks.core.storage import Root
from tasks.learning.questions.evaluation import question_evaluation  # noqa: E402
from tasks.learning.questions.reuse import question_lines
from tasks.learning.split import read_training_data
from tasks.learning.table.layer_file import write_layer_table
from tasks.learning.train_config import load_train_config
from tasks.replay.workloads import load_catalog

REPO = Path(__file__).resolve().parents[1]
PREDICTOR_H = REPO / "native" / "layers" / "predictor.h"
RESULTS = REPO / "benchmarks" / "results" / "layer_table.json"
REFERENCE = "the online counter's question (predictor.h hcp_soon) it replaces"

C_BENCH = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <sys/mman.h>
#include "predictor.h"

static uint8_t table[HCP_TOKENS][HCP_TOKENS];

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    FILE *f = fopen(argv[1], "rb");
    long n = atol(argv[2]);
    unsigned topk = 2, horizon = 4;
    if (!f || fseek(f, 32, SEEK_SET) || fread(table, 1, sizeof table, f) != sizeof table) return 2;
    fclose(f);
    /* a stream of frees of large classes (17..24: the layer's blocks >= 128 KiB), fixed seed */
    unsigned char *cls = malloc(1 << 16);
    unsigned s = 12345;
    for (int i = 0; i < 1 << 16; i++) s = s * 1103515245u + 12345u, cls[i] = 17 + (s >> 16) % 8;
    struct hcp_counter *c = mmap(NULL, sizeof *c, PROT_READ | PROT_WRITE,
                                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    for (int i = 0; i < 1 << 16; i++) hcp_learn(c, cls[i]), hcp_learn(c, HCP_FREE + cls[i]);
    unsigned kept = 0;
    double t0 = now();
    for (long i = 0; i < n; i++) {
        unsigned k = cls[i & 0xffff];
        kept += (unsigned)table[HCP_FREE + k][k] * topk >= 255u;
        __asm__ volatile("" : "+r"(kept));
    }
    double t1 = now();
    long m = n / 16; /* the counter's question is slower: fewer of them */
    for (long i = 0; i < m; i++) {
        unsigned k = cls[i & 0xffff];
        kept += hcp_soon(c, k, topk, horizon);
        __asm__ volatile("" : "+r"(kept));
    }
    double t2 = now();
    printf("%.4f %.4f %u\n", (t1 - t0) * 1e9 / n, (t2 - t1) * 1e9 / m, kept);
    return 0;
}
"""


def c_costs(table_file: Path, lookups: int, reps: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="heapcast-table-bench-") as tmp:
        src, exe = Path(tmp) / "bench.c", Path(tmp) / "bench"
        src.write_text(C_BENCH)
        cmd = ["cc", "-O2", "-I", str(PREDICTOR_H.parent), "-o", str(exe), str(src)]
        subprocess.run(cmd, check=True)
        table_ns, counter_ns = [], []
        for _ in range(reps):
            out = subprocess.run(
                [str(exe), str(table_file), str(lookups)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.split()
            table_ns.append(float(out[0]))
            counter_ns.append(float(out[1]))
    return {
        "table_lookup_ns_min": min(table_ns),
        "counter_soon_ns_min": min(counter_ns),
        "table_lookup_ns": table_ns,
        "counter_soon_ns": counter_ns,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default="/work/main/data")
    ap.add_argument("--config", default=str(REPO / "configs" / "train-quick.yaml"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--lookups", type=int, default=20_000_000)
    args = ap.parse_args()

    cfg = load_train_config(args.config)
    root = Root.from_url(args.root)
    t0 = time.perf_counter()
    data = read_training_data(root, cfg.data, load_catalog(cfg.data.catalog))
    questions = question_evaluation(data.split, data.events)
    seconds = time.perf_counter() - t0
    for line in question_lines(list(questions.scores), questions.agreement):
        print(line)
    with tempfile.TemporaryDirectory(prefix="heapcast-table-") as tmp:
        table_file = write_layer_table(Path(tmp) / "heapcast.hcltab", questions.table, 1)
        costs = c_costs(table_file, args.lookups, args.reps)
    print(
        f"C: table lookup {costs['table_lookup_ns_min']:.2f} ns, the counter's question "
        f"(hcp_soon, topk 2, horizon 4) {costs['counter_soon_ns_min']:.2f} ns "
        f"(min of {args.reps})"
    )
    write_result(
        "layer_table",
        {
            "command": "benchmarks/bench_layer_table.py "
            + " ".join(f"--{k} {v}" for k, v in vars(args).items()),
            "machine": platform.node(),
            "root": args.root,
            "config": args.config,
            "train_runs": sorted({f"{r.workload}/{r.run}" for r in data.split.train}),
            "evaluation_seconds": seconds,
            "agreement": [asdict(a) for a in questions.agreement],
            "reuse": [asdict(s) for s in questions.scores if s.question == "reuse"],
            "covered_classes": np.flatnonzero(questions.table.covered()).tolist(),
            "c": costs,
        },
        reference=REFERENCE,
        out=RESULTS,
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
