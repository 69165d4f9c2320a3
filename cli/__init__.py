"""`heapcast`, the command line: a thin front end over the stages (see `main`)."""
