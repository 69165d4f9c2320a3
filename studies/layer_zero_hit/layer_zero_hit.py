"""What a layer costs where it does nothing: instructions (valgrind's callgrind) of programs
outside the catalog, each alone and under each layer, two builds of the layers side by side.

Issue 65's goal: a layer costs at most +3% instructions on a program where it keeps or places
nothing. Per program: the program over glibc alone, under the cache layer (policy=guided and
policy=off, the loading cost alone) against glibc, and over jemalloc alone, under the placement
layer (in front of jemalloc, as `heapcast layer --policy place` runs it) against jemalloc. Each
layer's stats line gives its hits (the cache layer's hits, placement's allocations placed long),
and every run's stdout must equal the program's alone (a layer never changes the output).

    make -C native layer place          (the new build: native/build)
    (the old build: the same at BASE, its two .so files copied into OLD)
    .venv/bin/python studies/layer_zero_hit/layer_zero_hit.py --before OLD --after native/build

Programs: hunspell (en_US) listing the misspelt words of the GPL-3 text repeated --repeat times,
cppcheck on native/policy, and the start-up alone (each program on no input). Writes
studies/layer_zero_hit/layer_zero_hit.json and layer_zero_hit.md.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(PROJECT))

from benchmarks.harness import write_result  # noqa: E402

HERE = Path(__file__).resolve().parent
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
TEXT = Path("/usr/share/common-licenses/GPL-3")
LAYER, PLACE = "libheapcast_layer.so", "libheapcast_place.so"
GOAL = 1.03
COLLECTED = re.compile(r"Collected : (\d+)")


def programs(tmp: Path, repeat: int) -> dict[str, list[str]]:
    """name -> argv: the runs, each well under a minute under callgrind."""
    text = tmp / "text.txt"
    text.write_text(TEXT.read_text() * repeat)
    empty = tmp / "empty.txt"
    empty.write_text("")
    return {
        "hunspell": ["hunspell", "-l", "-d", "en_US", str(text)],
        "cppcheck": ["cppcheck", "--quiet", "native/policy"],
        "hunspell start-up": ["hunspell", "-l", "-d", "en_US", str(empty)],
        "cppcheck start-up": ["cppcheck", "--version"],
    }


def arms(lib: Path, stats: Path) -> dict[str, dict[str, str]]:
    """arm -> the environment it adds (the references have none of the layer's)."""
    return {
        "guided": {
            "LD_PRELOAD": str(lib / LAYER),
            "HEAPCAST_LAYER": f"policy=guided,stats={stats}",
        },
        "off": {"LD_PRELOAD": str(lib / LAYER), "HEAPCAST_LAYER": f"policy=off,stats={stats}"},
        "place": {
            "LD_PRELOAD": f"{lib / PLACE}:{JEMALLOC}",
            "HEAPCAST_PLACE": f"stats={stats}",
        },
    }


REFERENCE = {"guided": "glibc", "off": "glibc", "place": "jemalloc"}


def clean_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HEAPCAST_", "MALLOC_"))}
    env.pop("LD_PRELOAD", None)
    env.update(extra)
    return env


def run(argv: list[str], extra: dict[str, str]) -> tuple[int, bytes]:
    """(instructions, stdout) of argv under callgrind with `extra` in its environment."""
    env = clean_env(extra)
    got = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
        env=env,
        capture_output=True,
        cwd=PROJECT,
        check=False,
    )
    found = COLLECTED.search(got.stderr.decode(errors="replace"))
    if found is None:
        raise SystemExit(f"no instruction count from {argv}: {got.stderr[-2000:]!r}")
    return int(found.group(1)), got.stdout


def hits(stats: Path, arm: str) -> int:
    """The layer's hits over the run's processes: the cache layer's hits, placement's `long`."""
    key = "long" if arm == "place" else "hits"
    text = stats.read_text() if stats.exists() else ""
    found = re.findall(rf"\b{key}=(\d+)", text)
    if not found:
        raise SystemExit(f"{arm}: no stats line ({key}=) in {text!r}")
    return sum(int(x) for x in found)


def stats_line(stats: Path) -> str:
    """The run's stats lines without their pids: what the layer did, to compare two builds."""
    text = stats.read_text() if stats.exists() else ""
    return re.sub(r"pid=\d+ ", "", text).strip()


# Under callgrind the process holds valgrind's own memory too: /proc/self/statm says hundreds of
# MB there, so the placement layer's decisions on the resident set (min_mb's floor; learn_mb,
# where the build has it) would not be those of a native run. So each program first runs
# natively under the build (its stats line kept as `native`); where it placed nothing there, the
# callgrind run is held under the floor too, and, where the native run never began to learn
# (`waiting=1`), under learn_mb: both at 1048576 MB, never reached. (Before this, cppcheck's
# callgrind runs placed 27,534 allocations long, none of which a native run places: it stays
# at 13 MB.)
NEVER_MB = 1048576


def native_place(argv: list[str], extra: dict[str, str], stats: Path) -> str:
    """The placement arm's stats line from a native run (no callgrind)."""
    stats.unlink(missing_ok=True)
    subprocess.run(argv, env=clean_env(extra), capture_output=True, cwd=PROJECT, check=False)
    return stats_line(stats)


def held_as_native(extra: dict[str, str], native: str) -> dict[str, str]:
    """The placement arm's environment for callgrind, held where the native run stayed."""
    if sum(int(x) for x in re.findall(r"\blong=(\d+)", native)) > 0:
        return extra  # it placed natively: not a zero-hit run, the floor is valgrind's
    held = f"min_mb={NEVER_MB}"
    if re.search(r"\bwaiting=1\b", native):
        held += f",learn_mb={NEVER_MB}"
    return {**extra, "HEAPCAST_PLACE": f"{held},{extra['HEAPCAST_PLACE']}"}


# Placement's counters that do not hang on the blocks' addresses: its sample table is indexed
# by address, so `dropped`, `freed_short`, `evicted_long` and what the sites learn from them move
# when any library's size moves the heap (the same build, another library preloaded beside it,
# changes them: README.md). The cache layer's counters are compared whole.
PLACE_STABLE = ("mode", "sampled", "sites_seen", "table", "held_small", "depth", "waiting")


def comparable(stats: str, arm: str) -> str:
    if arm != "place":
        return stats
    pairs = re.findall(r"(\w+)=(\S+)", stats)
    return " ".join(f"{k}={v}" for k, v in pairs if k in PLACE_STABLE)


def measure(builds: dict[str, Path], repeat: int) -> dict:
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="zero-hit-") as d:
        tmp = Path(d)
        # each build's libraries copied to a folder whose name is as long as the other's: the
        # two builds' runs see environments of one size, so their counters can be compared
        copies = {}
        for i, (build, lib) in enumerate(builds.items()):
            copies[build] = tmp / f"build-{i}"
            copies[build].mkdir()
            for so in (LAYER, PLACE):
                shutil.copy2(lib / so, copies[build] / so)
        builds = copies
        for name, argv in programs(tmp, repeat).items():
            glibc, want = run(argv, {})
            jem, jem_out = run(argv, {"LD_PRELOAD": JEMALLOC})
            row = {"glibc": glibc, "jemalloc": jem, "jemalloc_output_same": jem_out == want}
            for build, lib in builds.items():
                for arm, extra in arms(lib, tmp / "stats").items():
                    native = None
                    if arm == "place":
                        native = native_place(argv, extra, tmp / "stats")
                        extra = held_as_native(extra, native)
                    (tmp / "stats").unlink(missing_ok=True)
                    n, stdout = run(argv, extra)
                    ref = row[REFERENCE[arm]]
                    row[f"{build} {arm}"] = {
                        "instructions": n,
                        "ratio": round(n / ref, 4),
                        "extra_per_mille": round(1000 * (n - ref) / ref, 1),
                        "hits": hits(tmp / "stats", arm),
                        "output_same": stdout == want,
                        "stats": stats_line(tmp / "stats"),
                    }
                    if native is not None:
                        row[f"{build} {arm}"]["native"] = native
                        row[f"{build} {arm}"]["setting"] = extra["HEAPCAST_PLACE"].replace(
                            str(tmp / "stats"), "FILE"
                        )
            if len(builds) == 2:  # the two builds decided alike: the same counters
                row["same_counters"] = {
                    arm: comparable(row[f"before {arm}"]["stats"], arm)
                    == comparable(row[f"after {arm}"]["stats"], arm)
                    for arm in REFERENCE
                }
            out[name] = row
            print(name, row, flush=True)
    return out


def table(results: dict, builds: list[str]) -> str:
    lines = [
        "| program | reference Ir | "
        + " | ".join(f"{b} {a}" for b in builds for a in ("guided", "off", "place"))
        + " |",
        "|---|---|" + "---|" * (3 * len(builds)),
    ]
    for name, row in results.items():
        cells = []
        for b in builds:
            for a in ("guided", "off", "place"):
                r = row[f"{b} {a}"]
                same = "" if r["output_same"] else " OUTPUT DIFFERS"
                cells.append(f"{(r['ratio'] - 1) * 100:+.2f}% ({r['hits']} hits){same}")
        lines.append(
            f"| {name} | glibc {row['glibc']:,}, jemalloc {row['jemalloc']:,} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, help="folder with the old build's two .so files")
    ap.add_argument("--after", type=Path, default=PROJECT / "native" / "build")
    ap.add_argument("--repeat", type=int, default=5, help="copies of GPL-3 hunspell checks")
    ap.add_argument("--out", type=Path, default=HERE / "layer_zero_hit.json")
    args = ap.parse_args()
    for tool in ("valgrind", "hunspell", "cppcheck"):
        if shutil.which(tool) is None:
            raise SystemExit(
                f"{tool} is missing: apt-get install valgrind hunspell hunspell-en-us cppcheck"
            )
    builds = {"after": args.after.resolve()}
    if args.before:
        builds = {"before": args.before.resolve(), **builds}
    results = measure(builds, args.repeat)
    worst = {
        b: max(
            row[f"{b} {a}"]["ratio"] for row in results.values() for a in ("guided", "off", "place")
        )
        for b in builds
    }
    summary = {
        "programs": results,
        "worst_ratio": worst,
        "goal_ratio": GOAL,
        "outputs_same": all(
            v["output_same"]
            for row in results.values()
            for v in row.values()
            if isinstance(v, dict) and "output_same" in v
        ),
        "same_counters": all(
            all(row["same_counters"].values()) for row in results.values() if "same_counters" in row
        ),
    }
    write_result(
        "layer_zero_hit",
        summary,
        reference="each program alone: over glibc (cache layer), over jemalloc (placement layer)",
        out=args.out,
    )
    md = args.out.with_suffix(".md")
    md.write_text(
        "# Instructions at zero hits (callgrind), layer against its reference\n\n"
        "Each cell: extra instructions over the reference (glibc for guided and off, jemalloc for "
        "place), the layer's hits, and whether stdout differs from the program's alone.\n\n"
        + table(results, list(builds))
        + "\n\nWorst ratio per build: "
        + ", ".join(f"{b} {w:.4f}" for b, w in worst.items())
        + f" (goal: at most {GOAL}).\n"
    )
    print(md.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
