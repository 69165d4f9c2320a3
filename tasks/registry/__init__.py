"""The registry (MLflow): takes a `TrainOutcome`, gives a model version with its params, metrics
and plots, and moves the `champion` alias when the new version scores better on the same
evaluation. Open `register` first; `tracking` resolves the store, `champion` holds the rule."""
