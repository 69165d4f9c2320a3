"""Replay: takes the workload catalog (configs/workloads.yaml), gives raw traces and a manifest
per run under `<root>/raw/<workload>/<run>/`. Open `replays` first (one input replayed, published
atomically); `workloads` validates the catalog, `inputs` generates inputs, `images` builds the
containers, `runners/` runs a program (docker or local sandbox)."""
