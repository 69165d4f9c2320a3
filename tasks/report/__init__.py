"""The heap report (`heapcast report`): takes one run, or two to compare, and gives one
self-contained HTML page (plotly, its JavaScript inlined: no network needed) and a short terminal
summary.

A run is a folder of raw traces (`*.hct`, converted here in-process with the dataset's own
converter, `tasks.dataset.convert.convert_groups`, no Dask), a run folder of the events dataset
(`events/workload=<w>/run=<r>/`), some `.hct`/`.parquet` files, or `WORKLOAD/RUN` under a data
root. What the page shows: the peak of live heap bytes (when, which size classes and processes
held it), live bytes and the allocation rate over time (per process and in total, ~1000 time bins
however long the run), the size-class histogram, lifetimes (ns and calls), temporaries, leaks,
the fork/exec tree and threads, and the top callers when the trace recorded them.

Open `summary` first (`make_report`: input -> page + text); `sources` resolves and reads the
input, `analysis` reduces the events to a `HeapReport` (numpy/Arrow only, no loop per event) and
`page` draws it. `night_reports` writes a night's pages, and the training run's page that
registration logs.
"""
