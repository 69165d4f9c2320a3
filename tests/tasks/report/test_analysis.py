"""tasks.report: the report's numbers against runs whose answers are known exactly."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.core.storage import Root
from tasks.dataset.convert import convert_trace, events_from_trace
from tasks.format.trace_reader import parse_trace
from tasks.report.analysis import analyze, calls_bin, calls_bin_range
from tasks.report.sources import ReportInputError, resolve
from tasks.report.summary import make_report, summary_text
from tests.tasks.report import scenario as sc
from tests.tracegen import malloc, module, synthetic_records, thread_start, trace_bytes, write_trace


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    raw = sc.write_raw(root / "raw" / "hand" / "r1")
    events = sc.write_events(raw, root)
    return {"root": root, "raw": raw, "events": events}


def by_class(counts, amounts) -> dict[int, tuple[int, int]]:
    return {int(k): (int(amounts[k]), int(counts[k])) for k in np.flatnonzero(counts)}


@pytest.mark.parametrize("kind", ["raw", "events"])
def test_hand_made_run_is_reported_exactly(runs, kind):
    # GIVEN the hand-made run, as raw traces (converted in-process) or as the events dataset
    rep = analyze(resolve(str(runs[kind])))
    # THEN every figure is the one worked out by hand (tests/tasks/report/scenario.py)
    assert rep.kind == kind and rep.events == 13 and rep.warnings == []
    assert (rep.peak_bytes, rep.peak_ns) == (sc.PEAK, sc.PEAK_NS)
    peak = by_class(rep.peak_by_class_blocks, rep.peak_by_class_bytes)
    assert peak == sc.PEAK_CLASSES
    assert {rep.processes[i].pid: v for i, v in rep.peak_by_process.items()} == {
        100: 6024,
        101: 700,
    }
    assert by_class(rep.leak_by_class_count, rep.leak_by_class_bytes) == sc.LEAKS
    assert (rep.leaks, rep.leak_bytes) == (4, 2440)
    assert by_class(rep.temp_by_class_count, rep.temp_by_class_bytes) == sc.TEMPORARIES
    assert (rep.unpaired_frees, rep.failed_allocations) == (1, 1)
    assert rep.ops == {"malloc": 8, "free": 4, "realloc": 1}
    assert (rep.allocations, rep.allocated_bytes) == (8, 100 + 1000 + 5000 + 24 + 2000 + 700 + 16)
    # lifetimes: 2, 2, 5 calls in pid 100 and 2 in pid 101; 20, 20, 50 and 10 ns
    assert {
        int(k): int(rep.lifetime_calls_hist[k]) for k in np.flatnonzero(rep.lifetime_calls_hist)
    } == {2: 3, 5: 1}
    ns = {int(k): int(rep.lifetime_ns_hist[k]) for k in np.flatnonzero(rep.lifetime_ns_hist)}
    assert ns == {4: 1, 5: 2, 6: 1}  # bit lengths of 10, 20, 50
    # callers: only pid 100 recorded them
    callers = {
        int(a): tuple(
            int(rep.callers[k][i])
            for k in ("calls", "allocs", "bytes", "leaks", "leak_bytes", "temps")
        )
        for i, a in enumerate(rep.callers["caller"])
    }
    assert callers == sc.CALLERS
    # processes and threads: pid 101 forked by 100, then exec'd (a new image, same pid)
    procs = [
        (p.pid, p.ppid, p.parent, p.relation, p.cmdline, p.events, p.threads) for p in rep.processes
    ]
    assert procs == [
        (100, 1, -1, "", ("prog", "run"), 9, 1),
        (101, 100, 0, "fork", ("prog", "child"), 3, 2),
        (101, 100, 1, "exec", ("/bin/true",), 1, 1),
    ]
    assert sorted(rep.threads) == [(0, 100, 9), (1, 101, 2), (1, 202, 1), (2, 101, 1)]
    assert [(p.peak_bytes, p.final_bytes, p.leaks) for p in rep.processes] == [
        (6024, 2024, 2),
        (700, 400, 1),
        (16, 16, 1),
    ]


def test_total_live_merges_processes_by_time_and_ends_each_image_with_it(runs):
    rep = analyze(resolve(str(runs["raw"])), bins=1000)
    # 10..200 ns in 1-ns bins: bin k is ns 10 + k
    edges = rep.bin_edges_ns
    assert (edges[0], edges[1] - edges[0], len(edges) - 1) == (10, 1, 191)
    live = rep.total.live_max
    at = {t: live[t - 10] for t in (10, 45, 48, 50, 55, 60, 89, 90, 95, 150, 200)}
    # 55: pid 101's last call (6424), then its 400 B left leave with it; 89 (no call): the
    # value since 80; 90: pid 100's last call, then its 2024 B leave; 200: the exec'd image
    assert at == {
        10: 100,
        45: 6300,
        48: 6700,
        50: 6724,
        55: 6424,
        60: 1024,
        89: 2024,
        90: 2024,
        95: 0,
        150: 0,
        200: 16,
    }
    # allocation rate: one allocation in the bins of 10, 20, 40, 45, 48, 50, 70 (realloc), 200
    calls = rep.total.alloc_calls
    assert [int(t) + 10 for t in np.flatnonzero(calls)] == [10, 20, 40, 45, 48, 50, 70, 200]
    assert rep.total.alloc_bytes.sum() == rep.allocated_bytes
    # per process: drawn only while the image is alive (NaN elsewhere)
    series = {s.image: s for s in rep.per_process}
    p100 = series[0].live_max
    assert p100[50 - 10] == 6024 and np.isnan(p100[95 - 10]) and p100[90 - 10] == 2024
    assert np.isnan(series[1].live_max[0]) and series[1].live_max[48 - 10] == 700


def test_temporary_threshold_is_a_parameter(runs):
    rep = analyze(resolve(str(runs["events"])), temporary_calls=5)
    temps = by_class(rep.temp_by_class_count, rep.temp_by_class_bytes)
    assert temps == {**sc.TEMPORARIES, 10: (1000, 1)}  # the realloc'd block: 5 calls
    assert analyze(resolve(str(runs["events"])), temporary_calls=1).temporaries == 0


def test_rows_shuffled_across_processes_in_one_part_are_put_back_in_call_order(runs, tmp_path):
    # GIVEN pid 100's and 101's rows in one part, shuffled (as hand-made datasets are written)
    tables = [
        events_from_trace(parse_trace(trace_bytes(sc.PARENT, caller=True, pid=100, ppid=1), "a")),
        events_from_trace(parse_trace(trace_bytes(sc.CHILD, caller=True, pid=101, ppid=100), "b")),
    ]
    t = pa.concat_tables(tables)
    t = t.take(np.random.default_rng(3).permutation(t.num_rows))
    pq.write_table(t, tmp_path / "part-0.parquet")
    rep = analyze(resolve(str(tmp_path)))
    # THEN the same live bytes as from the traces (less the exec'd image, not in this part)
    assert (rep.peak_bytes, rep.peak_ns) == (sc.PEAK, sc.PEAK_NS)
    assert by_class(rep.peak_by_class_blocks, rep.peak_by_class_bytes) == sc.PEAK_CLASSES
    procs = sorted((p.pid, p.ppid, p.peak_bytes, p.final_bytes, p.relation) for p in rep.processes)
    assert procs == [(100, 1, 6024, 2024, ""), (101, 100, 700, 400, "fork")]


def test_a_long_trace_agrees_with_the_converter_and_keeps_its_plots_bounded(tmp_path):
    # GIVEN 300 k calls of three threads (addresses reused, the last blocks never freed)
    recs = synthetic_records(300_000, seed=4, threads=3, live=2048)
    path = write_trace(tmp_path / "7-1.hct", recs, pid=7)
    _, stats = convert_trace(parse_trace(path.read_bytes(), str(path)))
    rep = analyze(resolve(str(tmp_path)), bins=100)
    # THEN one process: its peak and its never-freed blocks are the converter's own figures
    assert rep.events == stats.rows and rep.peak_bytes == stats.peak_live_bytes
    assert rep.leaks == stats.never_freed and rep.thread_count == 3
    # and the curves have ~100 points, their largest the peak
    assert len(rep.total.live_max) <= 100 and rep.total.live_max.max() == rep.peak_bytes
    assert rep.total.alloc_calls.sum() == rep.allocations


def test_calls_bins_are_exact_up_to_15_then_powers_of_two():
    v = np.array([0, 1, 4, 15, 16, 31, 32, 1000, 2**40])
    bins = calls_bin(v)
    for x, k in zip(v, bins):
        lo, hi = calls_bin_range(int(k))
        assert lo <= x < hi


# ------------------------------------------------------------------------------ bad input


def test_a_corrupt_file_among_good_ones_is_named_and_the_rest_reported(runs, tmp_path):
    raw = sc.write_raw(tmp_path / "run")
    (raw / "100-9.hct").write_bytes(b"not a trace at all")
    (raw / "101-9.hct").write_bytes(b"")
    rep = analyze(resolve(str(raw)))
    assert rep.events == 13 and rep.peak_bytes == sc.PEAK
    assert len(rep.warnings) == 2
    assert any(
        "100-9.hct" in w and "does not look like a heapcast trace" in w for w in rep.warnings
    )
    assert any("101-9.hct" in w and "empty file" in w for w in rep.warnings)


def test_a_corrupt_events_part_is_named_and_the_rest_reported(runs, tmp_path):
    import shutil

    shutil.copytree(runs["events"], tmp_path / "ev")
    (tmp_path / "ev" / "part-bad.parquet").write_bytes(b"PAR1 garbage")
    rep = analyze(resolve(str(tmp_path / "ev")))
    assert rep.events == 13 and len(rep.warnings) == 1 and "part-bad.parquet" in rep.warnings[0]


def test_a_truncated_trace_is_reported_with_a_warning(tmp_path):
    path = write_trace(tmp_path / "5-1.hct", sc.PARENT, caller=True, pid=5)
    path.write_bytes(path.read_bytes() + b"\x01\x02\x03")
    rep = analyze(resolve(str(tmp_path)))
    assert rep.events == 9 and "dropped a truncated last record (3 bytes)" in rep.warnings[0]


def test_nothing_readable_is_an_error_naming_the_files(tmp_path):
    (tmp_path / "1-1.hct").write_bytes(b"garbage")
    with pytest.raises(ReportInputError, match=r"nothing readable.*1-1.hct.*does not look like"):
        analyze(resolve(str(tmp_path)))


def test_a_folder_without_traces_is_an_error_naming_it(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ReportInputError, match=rf"{tmp_path}: no heapcast traces"):
        resolve(str(tmp_path))


def test_a_data_root_is_not_a_run(runs):
    with pytest.raises(ReportInputError, match="name one run"):
        resolve(str(runs["root"]))


def test_workload_run_names_resolve_under_the_root(runs, tmp_path):
    root = Root.from_url(str(runs["root"]))
    # converted: the events; only raw: the traces; neither: an error naming both places
    assert resolve("hand/r1", root).kind == "events"
    sc.write_raw(tmp_path / "raw" / "w" / "only-raw")
    assert resolve("w/only-raw", Root.from_url(str(tmp_path))).kind == "raw"
    with pytest.raises(
        ReportInputError, match=r"hand/nope: no such run under the data root .*raw/hand/nope"
    ):
        resolve("hand/nope", root)
    with pytest.raises(ReportInputError, match="no such file or folder"):
        resolve("/no/such/folder")


def test_the_events_run_gets_its_command_from_the_replay_manifest(runs):
    import json

    manifest = runs["raw"] / "manifest.json"
    manifest.write_text(json.dumps({"command": ["prog", "run", "--fast"]}))
    try:
        assert resolve(str(runs["events"])).command == ["prog", "run", "--fast"]
        assert resolve(str(runs["raw"])).command == ["prog", "run", "--fast"]
    finally:
        manifest.unlink()


def test_diff_reports_both_runs_and_their_differences(runs, tmp_path):
    other = tmp_path / "other"
    write_trace(other / "100-1.hct", sc.PARENT[:6], caller=True, pid=100)  # up to 0x3000's free
    res = make_report(str(runs["raw"]), tmp_path / "d.html", diff=str(other))
    a, b = res.reports
    assert (a.peak_bytes, b.peak_bytes) == (sc.PEAK, 6024)
    text = summary_text([a, b])
    assert "difference (A = " in text and "peak live   6.57 KiB -> 5.88 KiB (-10%)" in text
    assert res.html_path.read_text().count("B − A") >= 4


def _reference_total(tables: list[pa.Table]) -> tuple[np.ndarray, np.ndarray]:
    """Total live bytes after each call, merged the plain way: every image's rows and releases
    concatenated, one stable sort by time (images in order, releases last at the same ns)."""
    times, deltas = [], []
    rel_t, rel_d = [], []
    for t in tables:
        op = t["op"].to_numpy()
        defines = np.isin(op, [1, 2, 3, 4, 6, 7, 8, 9, 10]) & (t["addr"].to_numpy() != 0)
        d = np.where(defines, t["size"].to_numpy(), 0).astype(np.int64)
        d -= t["freed_size"].fill_null(0).to_numpy().astype(np.int64)
        times.append(t["time_ns"].to_numpy())
        deltas.append(d)
        if d.sum():
            rel_t.append(times[-1][-1])
            rel_d.append(-d.sum())
    time = np.concatenate(times + [np.array(rel_t, np.int64)])
    delta = np.concatenate(deltas + [np.array(rel_d, np.int64)])
    o = np.argsort(time, kind="stable")
    return time[o], np.cumsum(delta[o])


@pytest.mark.parametrize("window", [None, 5_000, 7])
def test_windowed_merge_equals_one_big_sort(tmp_path, monkeypatch, window):
    import tasks.report.analysis as analysis

    if window:
        monkeypatch.setattr(analysis, "WINDOW_ROWS", window)
    # GIVEN three overlapping processes (times interleave at random, some equal)
    specs = [(11, 60_000, 2), (12, 30_000, 1), (13, 9_000, 3)]
    tables = []
    for pid, n, threads in specs:
        recs = synthetic_records(n, seed=pid, threads=threads, live=300)
        recs["time"] = recs["time"] // np.uint64(7) + np.uint64(pid)  # overlap, with ties
        recs = recs[np.argsort(recs["time"], kind="stable")]
        path = write_trace(tmp_path / "run" / f"{pid}-{pid}.hct", recs, pid=pid)
        tables.append(events_from_trace(parse_trace(path.read_bytes(), str(path))))
    rep = analyze(resolve(str(tmp_path / "run")), bins=200 if window != 7 else 40)
    time, total = _reference_total(tables)
    # THEN the peak, its time and every bin's largest value are those of one big sort
    k = int(np.argmax(total))
    assert (rep.peak_bytes, rep.peak_ns) == (int(total[k]), int(time[k]))
    edges = rep.bin_edges_ns
    starts = np.searchsorted(time, edges[:-1])
    full = starts < np.append(starts[1:], len(time))
    assert np.array_equal(rep.total.live_max[full], np.maximum.reduceat(total, starts[full]))
    assert sum(rep.peak_by_process.values()) == rep.peak_bytes == rep.peak_by_class_bytes.sum()
    assert rep.warnings == []


def test_a_remote_root_is_read_through_its_filesystem(runs):
    # GIVEN the run's events and raw traces under an fsspec root that is not a local folder
    import fsspec

    fs = fsspec.filesystem("memory")
    for sub, folder in (
        ("events/workload=hand/run=r1", runs["events"]),
        ("raw/hand/r2", runs["raw"]),
    ):
        for p in folder.iterdir():
            fs.pipe_file(f"/heapcast-test-root/{sub}/{p.name}", p.read_bytes())
    try:
        ev = analyze(resolve("hand/r1", Root.from_url("memory://heapcast-test-root")))
        raw = analyze(resolve("hand/r2", Root.from_url("memory://heapcast-test-root")))
    finally:
        fs.rm("/heapcast-test-root", recursive=True)
    # THEN both read as from local folders
    assert (ev.kind, raw.kind) == ("events", "raw")
    for rep in (ev, raw):
        assert (rep.events, rep.peak_bytes, rep.leaks) == (13, sc.PEAK, 4)
        assert [p.cmdline for p in rep.processes][0] == ("prog", "run")


def test_callers_with_a_module_map_are_one_entry_per_module_and_offset(tmp_path):
    # GIVEN two processes running the same code at different load addresses (ASLR), from a
    # module that cannot be read here
    for pid, bias in ((10, 0x555500000000), (11, 0x566600000000)):
        recs = module(0, bias, bias + 0x4000, bias, "/nonexistent/prog") + [
            thread_start(1, pid),
            malloc(2, 100, 0x1000, caller=bias + 0x1234),
            malloc(3, 100, 0x2000, caller=bias + 0x1234),
            malloc(4, 8, 0x3000, caller=0x77),  # outside every module: its raw address
        ]
        write_trace(tmp_path / f"{pid}-{pid}.hct", recs, caller=True, pid=pid)
    rep = analyze(resolve(str(tmp_path)))
    c = rep.callers
    # THEN the same (module, offset) is one caller over both processes, named module+offset
    assert list(c["label"]) == ["prog+0x1234", "0x77"]
    assert list(c["calls"]) == [4, 2] and list(c["bytes"]) == [400, 16]
    assert list(c["module"]) == ["/nonexistent/prog", ""] and list(c["function"]) == ["", ""]
    assert "prog+0x1234 4 calls" in summary_text([rep])
