"""heapcast's benchmarks: `python -m benchmarks` (`make bench`) runs the maintained speed benchmarks
(benchmarks/suite.py) into benchmarks/results/, each file in one shape (benchmarks/harness.py);
one-off studies live apart, in studies/<name>/, with the command that made each result."""
