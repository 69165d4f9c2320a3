"""The allocator's two questions: `reuse` (is a freed class requested again soon?) and `lifetime`
(how long will this block live?), their causal predictors, the questions' `network`, the `hedge`
that corrects it inside the run, and `evaluation`, which scores them all together."""
