#!/bin/bash
# make workload: copy the generated C project into the scratch folder (setup, not traced), then
# trace a parallel build: make -j2 and every process it starts (gcc, cc1, as, gcc-ar, ar, collect2,
# ld, sh, mkdir, the built program).
#   make-driver.sh INPUT_DIR WORK_DIR
set -euo pipefail
in=$1
work=$2
untraced() { LD_PRELOAD= "$@"; }  # an empty LD_PRELOAD loads nothing
untraced mkdir -p "$work/project" "$work/tmp"
untraced cp -R "$in/." "$work/project/"
# gcc's and ld's temporary files in the scratch folder, the same path in every runner
export TMPDIR="$work/tmp"
cd "$work/project"
# -j2 fixed: the default of one job, or a job count that follows the CPU count, would make
# another build on another machine; --no-print-directory: no path in make's output
exec /usr/bin/make -j2 --no-print-directory
