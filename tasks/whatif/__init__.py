"""whatif: what allocator caching would have done to each traced run.

Replays a run's events, per process in call order, through allocator cache policies with a
compiled simulator, and measures the real layer under largest. Modules: policies.py (the configs),
events.py (a run laid out), simulate.py (the simulator), policy_core.py (the layer's own
decisions, which the simulator runs for every policy the layer offers), oracle.py (the bound),
guided.py (prediction arrays), sweep.py (the grid, the Pareto plot), night.py (the `whatif`
flow's tasks), layer.py (the real layer measured).

Each module and its rules: docs/whatif.md
"""
