#!/bin/bash
# freeciv workload: an AI-only autogame read from a generated server script.
#   freeciv-driver.sh INPUT_DIR WORK_DIR
# The server quits on EOF on stdin, so stdin is a FIFO held open read-write (fd 3): it never
# sees EOF, and `-e` makes it exit when the game ends (endturn). It refuses to run as root.
set -euo pipefail
in=$1
work=$2
untraced() { LD_PRELOAD= "$@"; }  # an empty LD_PRELOAD loads nothing
untraced mkdir -p "$work/saves"
untraced mkfifo "$work/stdin.fifo"
exec 3<>"$work/stdin.fifo"
exec /usr/games/freeciv-server --exit-on-end --read "$in/script.serv" --saves "$work/saves" \
    --bind 127.0.0.1 --port 5556 --Announce none --debug 1 --log "$work/server.log" <&3
