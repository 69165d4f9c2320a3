#!/bin/bash
# git workload: build a repository from the generated fast-import stream (setup, not traced),
# then trace what a developer's git does on it: repack, log -p, blame.
#   git-driver.sh INPUT_DIR WORK_DIR
set -euo pipefail
in=$1
repo=$2/repo
untraced() { LD_PRELOAD= "$@"; }  # an empty LD_PRELOAD loads nothing
untraced git init -q -b main "$repo"
untraced git -C "$repo" fast-import --quiet < "$in/repo.fi"
untraced git -C "$repo" checkout -q main
# pack.threads fixed: the default follows the CPU count, which differs between machines
git -C "$repo" -c pack.threads=3 repack -a -d -f -q
git -C "$repo" log -p --stat > /dev/null
while read -r f; do
    git -C "$repo" blame -w -- "$f" > /dev/null
done < "$in/blame.list"
echo "git workload done: $(untraced git -C "$repo" rev-list --count HEAD) commits"
