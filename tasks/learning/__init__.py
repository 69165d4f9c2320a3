"""Learning: takes the events dataset, gives a trained predictor of a thread's next heap call and
its `Evaluation` against baselines on runs and programs it never saw. Open `train` first;
`sequences` loads token runs, `model` builds the networks, `baselines` the references,
`evaluate` scores them on the same positions. The allocator's questions: `labels` (reuse of a
freed class, lifetime of a block, from the events), `reuse` (its causal baselines, in the same
tables). `streaming` serves the model call by call (`stepping`: the compiled one-step network).
No MLflow here."""
