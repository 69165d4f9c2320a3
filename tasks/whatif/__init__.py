"""whatif: what allocator caching would have done to each traced run.

Replays a run's events (the events dataset), per process in call order, through allocator
cache policies with a compiled simulator, and measures the real seed-002 layer.

- policies.py  strict pydantic configs: none, seed002, seed001, lru, guided, belady, oracle;
               `policy_from_dict`.
- events.py    `read_events(root, workload, run)` -> pyarrow Table; `prepare(table)` -> SimInput
               (simulation order, block partners, time basis).
- simulate.py  `simulate(events, policy, predictions=None) -> dict` of metrics; the rules of the
               cache, the hit rate, the byte figures and the PAGE-FAULT MODEL are in its
               docstring.
- oracle.py    the upper bound of the hit rate at a byte budget (why a bound: its docstring).
- guided.py    prediction arrays for `guided`: causal `keep_at_free` / `next_call_top` (the
               default: the top-k a predictor gives at the free); optimistic `reuse_labels`
               and `predictions_from_topk` (horizon > 1), which read later events;
               `align_token_run`.
- sweep.py     `sweep(root, runs, policies)` / `sweep_run(table, ...)` -> pandas DataFrame, one
               row per (run, policy, param); `default_grid()`; `pareto_plot(df, png)`.
- night.py     the Prefect tasks of the `whatif` flow (flows/whatif.py) and of nightly's step:
               a registered model's evaluation runs through the grid, the guided policy fed by
               the model and the online counter (causal: what a live cache has at the free) and
               by the freeing thread's true future (`thread_future_optimistic`: it reads the
               future, and is no upper bound); every peeking predictor's name ends
               `_optimistic` in the table, the artifact, the metrics and the plot; the Parquet
               table under <root>/whatif/, the `whatif` artifact, the MLflow metrics and the
               Pareto plot.
- layer.py     `build_layer()` (make -C native layer), `measure_layer(argv, env)` -> faults
               and the layer's counters with and without native/build/libheapcast_layer.so
               (HEAPCAST_LAYER=policy=seed002,...) on the host;
               `measure_layer_workload(workload, input, runner)`: a catalog workload untraced
               through the replay runners (docker or local), plain / layer loaded but off /
               layer on, rotated rounds (benchmarks/bench_whatif_layer.py).
"""
