"""The nightly's glue: its parameters (`params`, one form for every stage) and what a night did
(`night_summary`, published as the `nightly-summary` artifact)."""
