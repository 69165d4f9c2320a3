"""The registry (MLflow): takes a `TrainOutcome` and its training report (a file the train flow
made), gives a model version with its params, metrics and plots, and moves the `champion` alias
when the new version scores better on the same evaluation; `register` returns the version as a
`RegisteredModel` (tasks.learning.outcome) for the stages after it. Open `register` first; `tracking` resolves the store, `champion` holds the rule."""
