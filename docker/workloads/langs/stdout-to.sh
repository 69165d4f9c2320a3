#!/bin/bash
# Run a program whose result goes to its standard output, that output into a file of the
# scratch folder (not the container's log):
#   stdout-to.sh OUT_FILE PROGRAM [ARG...]
# The shell's own few start-up calls are traced too (a trace file of their own); the program
# replaces it (exec), so its calls are the program's.
set -euo pipefail
out=$1
shift
exec "$@" >"$out"
