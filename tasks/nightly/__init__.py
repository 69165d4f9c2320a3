"""The nightly's glue: its parameters (`params`, one form for every stage) and what a night did.

Open `night_summary` first: it reads each stage's outcome into the `NightlySummary`
(`summary_model`, the data), published as the `nightly-summary` artifact and a file
(`markdown`, every table) and printed on one screen (`terminal`); both open with `verdict`.
"""
