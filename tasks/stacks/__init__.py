"""Call stacks: what each allocation's whole calling context allocated.

profile  StackProfile: per distinct stack of a run (frames named, innermost first), its calls,
         bytes, bytes live at the peak, bytes leaked and temporaries; the one thing the report's
         flame graphs and tables, the diff of two runs and `heapcast export` read.
"""
