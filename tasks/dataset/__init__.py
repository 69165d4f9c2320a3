"""The events dataset: takes raw runs, gives Parquet under `<root>/events/workload=/run=/`, one
row per heap call (`events_schema`), frees paired with their blocks, the token (`tokens`). Open
`partitions` first (a run converted with Dask and committed atomically); `convert` turns one raw
file into rows; `events_reader` is the one reader every later stage reads the dataset with; `frame_tokens` reads a
run's stacks as the networks do (sub-word tokens of the frames' names)."""
