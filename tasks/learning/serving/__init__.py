"""The champion served one call at a time: `streaming` (feed a thread's calls, get the next-call
distribution after each) and `stepping` (the network stepped with its recurrent state per thread)."""
