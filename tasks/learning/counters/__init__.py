"""Predictors with no training: `online` (the back-off n-gram that learns each thread as it goes),
`baselines` (the references every network is scored beside) and `by_due` (the counters of a
question whose answer becomes known later)."""
