"""Learning: takes the events dataset, gives a trained predictor of a thread's next heap call and
its `Evaluation` against baselines on runs and programs it never saw. Open `train` first;
`sequences` loads token runs, `model` builds the networks, `baselines` the references,
`evaluate` scores them on the same positions. No MLflow here."""
