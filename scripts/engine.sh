#!/usr/bin/env bash
# Start, stop or query the container engine heapcast replays workloads on.
#
#   scripts/engine.sh up      install docker.io if dockerd is missing, start dockerd in the
#                             background (no systemd needed), wait until it answers
#   scripts/engine.sh down    stop the dockerd this script started, by its pid file
#   scripts/engine.sh status  say whether an engine answers at DOCKER_HOST (or ours)
#
# `up` and `status` print `export DOCKER_HOST=...` on stdout (everything else goes to stderr),
# so `eval "$(scripts/engine.sh up)"` points the shell at the engine.
# The data root (/var/lib/heapcast-docker) persists between runs on the same machine, so images
# built once (the base image, the workload images) are cached for the next run.
set -euo pipefail

STATE_DIR=${HEAPCAST_ENGINE_DIR:-/var/lib/heapcast-docker}
RUN_DIR=${HEAPCAST_ENGINE_RUN:-/run/heapcast-docker}
SOCK="$RUN_DIR/docker.sock"
PIDFILE="$RUN_DIR/dockerd.pid"
LOG="$RUN_DIR/dockerd.log"
OUR_HOST="unix://$SOCK"
WAIT_S=${HEAPCAST_ENGINE_WAIT_S:-60}

say() { echo "engine.sh: $*" >&2; }

answers() {  # answers HOST: true when an engine answers /_ping at HOST
    local host=$1
    case "$host" in
        unix://*) curl -sf --max-time 3 --unix-socket "${host#unix://}" http://d/_ping >/dev/null 2>&1 ;;
        tcp://*) curl -sf --max-time 3 "http://${host#tcp://}/_ping" >/dev/null 2>&1 ;;
        *) return 1 ;;
    esac
}

find_answering() {  # prints the first DOCKER_HOST that answers
    local h
    for h in "${DOCKER_HOST:-}" "$OUR_HOST" unix:///var/run/docker.sock; do
        [ -n "$h" ] && answers "$h" && { echo "$h"; return 0; }
    done
    return 1
}

ensure_installed() {
    if command -v dockerd >/dev/null 2>&1; then return 0; fi
    say "dockerd not found: installing Debian's docker.io"
    [ "$(id -u)" = 0 ] || { say "installing docker.io needs root (apt-get)"; exit 1; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends docker.io >&2 || {
        apt-get update >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends docker.io >&2
    }
}

up() {
    local h
    if h=$(find_answering); then
        say "an engine already answers at $h"
        echo "export DOCKER_HOST=$h"
        return 0
    fi
    command -v curl >/dev/null || { say "curl is needed to check the engine"; exit 1; }
    ensure_installed
    mkdir -p "$STATE_DIR" "$RUN_DIR"
    if [ -f "$PIDFILE" ] && ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
        rm -f "$PIDFILE"   # stale pid file from a machine restart or a crash
    fi
    if [ ! -f "$PIDFILE" ]; then
        say "starting dockerd (data root $STATE_DIR, socket $SOCK, log $LOG)"
        # setsid: the engine outlives this shell and its process group
        setsid dockerd -H "$OUR_HOST" --data-root "$STATE_DIR" --exec-root "$RUN_DIR/exec" \
            --pidfile "$PIDFILE" --storage-driver overlay2 </dev/null >>"$LOG" 2>&1 &
    fi
    local i=0
    while ! answers "$OUR_HOST"; do
        i=$((i + 1))
        if [ "$i" -gt $((WAIT_S * 2)) ]; then
            say "dockerd did not answer within ${WAIT_S}s; last lines of $LOG:"
            tail -n 20 "$LOG" >&2 || true
            exit 1
        fi
        sleep 0.5
    done
    say "dockerd answers at $OUR_HOST (pid $(cat "$PIDFILE" 2>/dev/null || echo '?'))"
    echo "export DOCKER_HOST=$OUR_HOST"
}

down() {
    if [ ! -f "$PIDFILE" ]; then
        say "no pid file at $PIDFILE: no engine started by this script is running"
        return 0
    fi
    local pid
    pid=$(cat "$PIDFILE")
    if kill -0 "$pid" 2>/dev/null; then
        say "stopping dockerd (pid $pid)"
        kill -TERM "$pid"
        local i=0
        while kill -0 "$pid" 2>/dev/null; do
            i=$((i + 1))
            if [ "$i" -gt 60 ]; then say "dockerd (pid $pid) still alive after 30 s; sending SIGKILL"; kill -KILL "$pid"; fi
            sleep 0.5
        done
    fi
    rm -f "$PIDFILE"
    say "stopped"
}

status() {
    local h
    if h=$(find_answering); then
        say "an engine answers at $h"
        echo "export DOCKER_HOST=$h"
    else
        say "no engine answers (tried ${DOCKER_HOST:-\$DOCKER_HOST unset}, $OUR_HOST, /var/run/docker.sock); start one with: scripts/engine.sh up"
        return 1
    fi
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
