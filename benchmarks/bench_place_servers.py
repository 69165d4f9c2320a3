"""heapcast's placement layer inside real servers: redis-server loaded then partly deleted, burst
after burst, and the catalog's threaded key-value service under its load generator.

Part 1, redis. Each burst SETs --requests short-lived keys (values of 32-288 bytes) and, every --every-th,
one key that stays; then DELetes the short-lived ones and asks redis to give back what its
allocator holds free (MEMORY PURGE: jemalloc's arenas purged, what redis offers its users
against fragmentation). After each burst: the server's resident set (/proc/PID/statm) and
redis's own count of live bytes (INFO used_memory); at the end its peak RSS (VmHWM), CPU time
and minor faults (/proc/PID/stat). Arms, rounds alternating: redis as Debian builds it (linked
to jemalloc), tcmalloc and mimalloc preloaded, and jemalloc with the layer in front: placement
off, by the online counter (and by it with no site ever stepping aside: falls=0), by the long
sites of a first run of the same input (the bound, an optimistic reference) and by size alone
(no prediction). glibc cannot be measured: the binary links jemalloc, so its malloc is never
glibc's.

Part 2, kv_service (docker/workloads/threads/src: hc-kvserver, a thread per connection, and
hc-loadgen, 16 clients of --sessions sessions of 200 requests: GET, PUT of 100 B - 512 KiB values
that live until a later PUT replaces them, SCAN), built here with cc -O2: the server's peak RSS,
CPU time and minor faults (wait4) under glibc, the same allocators and the same jemalloc arms;
its output (what it holds at the end) must be the same in every arm.

    .venv/bin/python benchmarks/bench_place_servers.py [--reps 3] [--bursts 8]
        [--requests 50000] [--every 100] [--sessions 20] [--out PATH]

writes benchmarks/results/place_servers.json: medians and min-max for time.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from bench_place import (  # noqa: E402
    JEMALLOC,
    MIMALLOC,
    NATIVE,
    REPO,
    TCMALLOC,
    alternating,
    clean_env,
    layer_arms,
    learn_env,
)

from benchmarks.harness import write_result  # noqa: E402

OUT = REPO / "benchmarks" / "results" / "place_servers.json"
REFERENCE = (
    "redis-server as Debian links it (jemalloc) and kv_service under glibc, tcmalloc, mimalloc "
    "and jemalloc with placement off, rounds alternating; the bound (a first run's sites) and "
    "placement by size"
)
KV_SRC = REPO / "docker" / "workloads" / "threads" / "src"
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024
TICKS = os.sysconf("SC_CLK_TCK")


def resp(*args: bytes | str) -> bytes:
    """One command in redis's wire protocol (RESP), as `redis-cli --pipe` sends it."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def burst_commands(burst: int, requests: int, every: int) -> tuple[bytes, bytes]:
    """(the burst's SETs, its DELs): short-lived keys req:B:I, kept keys keep:B:I."""
    sets, dels = [], []
    for i in range(requests):
        sets.append(resp("SET", f"req:{burst}:{i}", b"x" * (32 + (i * 7919) % 257)))
        if i % every == 0:
            sets.append(resp("SET", f"keep:{burst}:{i}", b"y" * (32 + (i * 104729) % 257)))
        dels.append(resp("DEL", f"req:{burst}:{i}"))
    return b"".join(sets), b"".join(dels)


def cli(sock: Path, *args: str, data: bytes | None = None) -> str:
    argv = ["redis-cli", "-s", str(sock), *(["--pipe"] if data is not None else args)]
    p = subprocess.run(argv, input=data, capture_output=True, check=True)
    text = p.stdout.decode()
    if data is not None and "errors: 0," not in text:
        raise RuntimeError(f"redis-cli --pipe: {text.strip()[-200:]}")
    return text


def proc_stat(pid: int) -> tuple[float, int]:
    """(CPU seconds, minor faults) of a running process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS, int(fields[7])


def run_arm(env: dict[str, str], bursts: list[tuple[bytes, bytes]], work: Path) -> dict:
    """One redis-server under `env` through every burst; its figures."""
    sock = work / "redis.sock"
    sock.unlink(missing_ok=True)
    argv = ["redis-server", "--port", "0", "--unixsocket", str(sock), "--save", ""]
    argv += ["--appendonly", "no", "--dir", str(work)]
    log = (work / "redis.log").open("wb")
    t0 = time.perf_counter()
    server = subprocess.Popen(argv, env=clean_env(env), stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.05)
        else:
            raise RuntimeError(f"redis-server did not start under {env}: {work / 'redis.log'}")
        rss, used = [], []
        for sets, dels in bursts:
            cli(sock, data=sets)
            cli(sock, data=dels)
            cli(sock, "MEMORY", "PURGE")
            rss.append(int(Path(f"/proc/{server.pid}/statm").read_text().split()[1]) * PAGE_KB)
            info = cli(sock, "INFO", "memory")
            used.append(
                next(int(x.split(":")[1]) for x in info.split() if x.startswith("used_memory:"))
            )
        peak = next(
            int(x.split()[1])
            for x in Path(f"/proc/{server.pid}/status").read_text().splitlines()
            if x.startswith("VmHWM:")
        )
        cpu, faults = proc_stat(server.pid)
        keys = int(cli(sock, "DBSIZE").strip())
        cli(sock, "SHUTDOWN", "NOSAVE")
        server.wait(timeout=30)
    finally:
        if server.poll() is None:  # an error above: the server must not outlive the bench
            server.kill()
            server.wait()
        log.close()
    return {
        "rss_after_bursts_kb": rss,
        "used_memory_after_bursts_kb": [u // 1024 for u in used],
        "rss_end_kb": rss[-1],
        # VmHWM is the kernel's lazily synced counter: never below what statm showed
        "peak_rss_kb": max(peak, *rss),
        "cpu_s": cpu,
        "wall_s": time.perf_counter() - t0,
        "minor_faults": faults,
        "keys": keys,
        "stderr_tail": (work / "redis.log").read_text().splitlines()[-2:],
    }


def summarize(runs: list[dict]) -> dict:
    n = len(runs[0]["rss_after_bursts_kb"])

    def med(key: str, i: int | None = None) -> float:
        return statistics.median(r[key] if i is None else r[key][i] for r in runs)

    return {
        "rss_after_bursts_kb": [med("rss_after_bursts_kb", i) for i in range(n)],
        "used_memory_after_bursts_kb": [med("used_memory_after_bursts_kb", i) for i in range(n)],
        "rss_end_kb": med("rss_end_kb"),
        "peak_rss_kb": med("peak_rss_kb"),
        "cpu_s": med("cpu_s"),
        "cpu_s_range": [min(r["cpu_s"] for r in runs), max(r["cpu_s"] for r in runs)],
        "minor_faults": med("minor_faults"),
        "keys": sorted({r["keys"] for r in runs}),
        "runs": len(runs),
    }


def build_kv(work: Path) -> tuple[Path, Path]:
    """hc-kvserver and hc-loadgen, compiled here from the catalog's sources."""
    out = []
    for name in ("kvserver", "loadgen"):
        exe = work / name
        subprocess.run(
            ["cc", "-O2", "-pthread", "-o", str(exe), str(KV_SRC / f"{name}.c")], check=True
        )
        out.append(exe)
    return out[0], out[1]


def run_kv(env: dict[str, str], kv: tuple[Path, Path], sessions: int, work: Path) -> dict:
    """One hc-kvserver under `env`, hc-loadgen (no preload) driving it; the server's figures."""
    server_exe, loadgen = kv
    ready = work / "kv.ready"
    ready.unlink(missing_ok=True)
    with socket.socket() as s:  # a free loopback port
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    out = tempfile.TemporaryFile()
    err = tempfile.TemporaryFile()
    t0 = time.perf_counter()
    server = subprocess.Popen(
        [str(server_exe), port, str(ready)], env=clean_env(env), stdout=out, stderr=err
    )
    try:
        for _ in range(200):
            if ready.exists() or server.poll() is not None:
                break
            time.sleep(0.05)
        if not ready.exists():
            raise RuntimeError(f"hc-kvserver did not start under {env}")
        subprocess.run(
            [str(loadgen), port, "7", str(sessions), "16"],
            env=clean_env({}),
            capture_output=True,
            check=True,
            timeout=600,
        )
        _, status, ru = os.wait4(server.pid, 0)
        server.returncode = os.waitstatus_to_exitcode(status)
    finally:
        if server.returncode is None:
            server.kill()
            server.wait()
    out.seek(0)
    err.seek(0)
    if server.returncode != 0:
        raise RuntimeError(
            f"hc-kvserver under {env}: exit {server.returncode}: {err.read()[-300:]}"
        )
    return {
        "stdout": out.read().decode(),
        "stderr": err.read().decode(),
        "peak_rss_kb": ru.ru_maxrss,
        "cpu_s": ru.ru_utime + ru.ru_stime,
        "wall_s": time.perf_counter() - t0,
        "minor_faults": ru.ru_minflt,
    }


def summarize_kv(runs: list[dict]) -> dict:
    return {
        "peak_rss_kb": statistics.median(r["peak_rss_kb"] for r in runs),
        "peak_rss_kb_range": [
            min(r["peak_rss_kb"] for r in runs),
            max(r["peak_rss_kb"] for r in runs),
        ],
        "cpu_s": statistics.median(r["cpu_s"] for r in runs),
        "cpu_s_range": [min(r["cpu_s"] for r in runs), max(r["cpu_s"] for r in runs)],
        "minor_faults": statistics.median(r["minor_faults"] for r in runs),
        "runs": len(runs),
    }


def bench_kv(args: argparse.Namespace, work: Path) -> dict:
    """Part 2: every arm (glibc too) on hc-kvserver, rounds alternating."""
    kv = build_kv(work)
    sites = work / "kv-sites.txt"
    run_kv(learn_env(sites), kv, args.sessions, work)  # the bound's first run
    table = {"glibc": {}, "jemalloc": {"LD_PRELOAD": str(JEMALLOC)}}
    table |= {n: e for n, e in arms(sites).items() if n != "jemalloc (redis's own)"}
    table["jemalloc+place"]["HEAPCAST_PLACE"] += ",stats=1"  # its line on the server's stderr
    names = list(table)
    results = alternating(names, args.reps, lambda n: run_kv(table[n], kv, args.sessions, work))
    counter = [
        line
        for x in results["jemalloc+place"]
        for line in x["stderr"].splitlines()
        if line.startswith("heapcast place: pid=")
    ]
    return {
        "argv": ["hc-loadgen", "PORT", "7", str(args.sessions), "16"],
        "bound_sites": sites.read_text().splitlines(),
        "counter_stats": counter[-1:],
        "output_identical_across_arms": len({x["stdout"] for n in names for x in results[n]}) == 1,
        "arms": {n: summarize_kv(results[n]) for n in names},
    }


def arms(sites: Path) -> dict[str, dict[str, str]]:
    """name -> environment: redis as linked, tcmalloc, mimalloc and the layer's arms, with the
    online counter once more where no site ever steps aside (falls=0)."""
    layer = layer_arms(sites)
    never = {**layer["jemalloc+place"]}
    never["HEAPCAST_PLACE"] += ",falls=0"
    return {
        "jemalloc (redis's own)": {},
        "tcmalloc": {"LD_PRELOAD": str(TCMALLOC)},
        "mimalloc": {"LD_PRELOAD": str(MIMALLOC)},
        **layer,
        "jemalloc+place-never-aside": never,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--bursts", type=int, default=8)
    ap.add_argument("--requests", type=int, default=50_000, help="short-lived keys a burst")
    ap.add_argument("--every", type=int, default=100, help="one kept key per this many")
    ap.add_argument("--sessions", type=int, default=20, help="kv_service: sessions a client")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    missing = [p for p in ("redis-server", "redis-cli") if shutil.which(p) is None]
    if missing:
        sys.exit(f"{', '.join(missing)} not found: install Debian's redis-server and redis-tools")
    subprocess.run(["make", "-s", "-C", str(NATIVE), "place"], check=True)
    bursts = [burst_commands(b, args.requests, args.every) for b in range(args.bursts)]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sites = work / "sites.txt"
        run_arm(learn_env(sites), bursts, work)  # the bound's first run, the same bursts
        table = arms(sites)
        stats = work / "place.stats"
        table["jemalloc+place"]["HEAPCAST_PLACE"] += f",stats={stats}"
        names = list(table)
        results = alternating(names, args.reps, lambda n: run_arm(table[n], bursts, work))
        kv = bench_kv(args, work)
        result = {
            "command": f"python benchmarks/bench_place_servers.py --reps {args.reps} --bursts "
            f"{args.bursts} --requests {args.requests} --every {args.every} --sessions "
            f"{args.sessions}",
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            "redis": subprocess.run(
                ["redis-server", "--version"], capture_output=True, text=True
            ).stdout.strip(),
            "bound_sites": sites.read_text().splitlines(),
            "counter_stats": stats.read_text().splitlines()[-1:],
            "keys_identical_across_arms": len(
                {k for n in names for k in summarize(results[n])["keys"]}
            )
            == 1,
            "arms": {n: summarize(results[n]) for n in names},
            "kv_service": kv,
        }
    write_result("place_servers", result, reference=REFERENCE, out=args.out)
    print(result["redis"])
    print("counter:", *result["counter_stats"])
    for name, a in result["arms"].items():
        after = " ".join(f"{x / 1024:.1f}" for x in a["rss_after_bursts_kb"])
        print(
            f"{name:24s} RSS after bursts {after} | peak {a['peak_rss_kb'] / 1024:.1f} MB "
            f"| cpu {a['cpu_s']:.2f} s | faults {a['minor_faults']:.0f} | live "
            f"{a['used_memory_after_bursts_kb'][-1] / 1024:.1f} MB"
        )
    print("kv_service counter:", *result["kv_service"]["counter_stats"])
    for name, a in result["kv_service"]["arms"].items():
        print(
            f"{name:24s} peak {a['peak_rss_kb'] / 1024:.1f} MB | cpu {a['cpu_s']:.2f} s "
            f"| faults {a['minor_faults']:.0f}"
        )


if __name__ == "__main__":
    main()
