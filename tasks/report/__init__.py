"""The heap report (`heapcast report`): takes one run, or two to compare, and gives one
self-contained HTML page (plotly, its JavaScript inlined: no network needed) and a short terminal
summary.

A run is a folder of raw traces (converted here in-process, no Dask), a run folder of the events
dataset, some `.hct`/`.parquet` files, or `WORKLOAD/RUN` under a data root (sources.py). What the
page shows: docs/report.md#what-the-page-shows.

Open `summary` first (`make_report`: input -> page + text); `sources` resolves and reads the
input, `analysis` reduces the events to a `HeapReport` (numpy/Arrow only, no loop per event) and
`page` draws it. `night_reports` writes a night's pages, and the training run's page that
registration logs.
"""
