"""Learning: takes the events dataset, gives a trained predictor of a thread's next heap call, the
answers to an allocator's questions, and their `Evaluation` against baselines on runs and programs
it never saw. Open `train` first (the Prefect tasks). At this level: `split` (which runs train,
which are scored), `labels` (the questions' answers from the events), `predictions`, `scores` and
`evaluate` (every predictor scored on the same positions), `outcome` and `answers` (what training
hands to registration). The rooms:
- `nextcall`: the next-call network: its model, data, fitting, training, bundle and hedge;
- `counters`: the online counters and the baselines every network must beat;
- `questions`: reuse and lifetime, their causal predictors, network and hedge;
- `serving`: the champion fed call by call (`streaming`, `stepping`);
- `table`: the layer's table distilled from the questions' network, and its file.
No MLflow here."""
