#!/usr/bin/env bash
# Start, stop or query an MLflow tracking server (the UI) over heapcast's embedded store.
#
#   scripts/mlflow-server.sh start    start `mlflow server` on 127.0.0.1 in the background, wait
#                                     until /health answers, print the UI URL
#   scripts/mlflow-server.sh stop     stop the server this script started (its whole process
#                                     group: the server spawns workers), by its pid file
#   scripts/mlflow-server.sh status   say whether it runs and answers; print the URL
#
# The store is the one the embedded mode writes (tasks/registry/tracking.py decides where):
#   <root>/mlflow/mlflow.db, artifacts under <root>/mlflow/artifacts, root = $HEAPCAST_ROOT or
#   ./data. Port: $HEAPCAST_MLFLOW_PORT (default 5000). To log through the server instead of the
#   file, set `tracking_uri: http://127.0.0.1:<port>` in configs/tracking.yaml.
# `start` and `status` print `export MLFLOW_TRACKING_URI=...` on stdout (the rest goes to stderr),
# so `eval "$(scripts/mlflow-server.sh start)"` points the shell's mlflow clients at it.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${HEAPCAST_PYTHON:-$HERE/.venv/bin/python}
[ -x "$PY" ] || PY=python3
MLFLOW=$HERE/.venv/bin/mlflow
[ -x "$MLFLOW" ] || MLFLOW=mlflow
HOST=127.0.0.1
WAIT_S=${HEAPCAST_MLFLOW_WAIT_S:-180}

say() { echo "mlflow-server.sh: $*" >&2; }

# BACKEND_STORE_URI, ARTIFACTS_DESTINATION, STATE_DIR of the root, from the one place that decides.
eval "$(cd "$HERE" && "$PY" -m tasks.registry.tracking server-store ${HEAPCAST_ROOT:+"$HEAPCAST_ROOT"})"
PIDFILE=$STATE_DIR/server.pid
PORTFILE=$STATE_DIR/server.port
LOG=$STATE_DIR/server.log

running_pid() {  # prints the pid from the pid file when that process is alive
    [ -f "$PIDFILE" ] || return 1
    local pid
    pid=$(cat "$PIDFILE")
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && { echo "$pid"; return 0; }
    return 1
}

answers() { curl -sf --max-time 3 "http://$HOST:$1/health" >/dev/null 2>&1; }

start() {
    local port=${HEAPCAST_MLFLOW_PORT:-5000} pid
    if pid=$(running_pid); then
        port=$(cat "$PORTFILE" 2>/dev/null || echo "$port")
        say "already running (pid $pid) at http://$HOST:$port"
        echo "export MLFLOW_TRACKING_URI=http://$HOST:$port"
        return 0
    fi
    if answers "$port"; then
        say "something else already answers on $HOST:$port; set HEAPCAST_MLFLOW_PORT to another port"
        return 1
    fi
    mkdir -p "$STATE_DIR"
    # setsid: the server and its workers get a process group of their own, which `stop` ends.
    # No telemetry (no internet); no job runner (its huey consumers serve GenAI jobs heapcast
    # does not use, and cost start-up time); two workers are plenty for one user's UI.
    MLFLOW_DISABLE_TELEMETRY=true DO_NOT_TRACK=true \
    MLFLOW_SERVER_ENABLE_JOB_EXECUTION=${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false} \
        setsid "$MLFLOW" server \
            --backend-store-uri "$BACKEND_STORE_URI" \
            --artifacts-destination "$ARTIFACTS_DESTINATION" \
            --host "$HOST" --port "$port" --workers "${HEAPCAST_MLFLOW_WORKERS:-2}" \
            >"$LOG" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$PIDFILE"
    echo "$port" >"$PORTFILE"
    say "started pid $pid (store $BACKEND_STORE_URI, artifacts $ARTIFACTS_DESTINATION, log $LOG)"
    local waited=0
    until answers "$port"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            say "the server exited during start-up; last lines of $LOG:"
            tail -n 20 "$LOG" >&2 || true
            rm -f "$PIDFILE" "$PORTFILE"
            return 1
        fi
        if [ "$waited" -ge "$WAIT_S" ]; then
            say "no answer from http://$HOST:$port/health after ${WAIT_S}s; stopping it (log: $LOG)"
            stop
            return 1
        fi
        sleep 1
        waited=$((waited + 1))
    done
    say "UI at http://$HOST:$port (answered after ~${waited}s)"
    echo "export MLFLOW_TRACKING_URI=http://$HOST:$port"
}

stop() {
    local pid
    if ! pid=$(running_pid); then
        say "not running (no live pid in $PIDFILE)"
        rm -f "$PIDFILE" "$PORTFILE"
        return 0
    fi
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    local i
    for i in $(seq 1 30); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
        say "pid $pid still alive after SIGTERM; sending SIGKILL to its group"
        kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$PIDFILE" "$PORTFILE"
    say "stopped pid $pid and its workers"
}

status() {
    local pid port
    if pid=$(running_pid); then
        port=$(cat "$PORTFILE" 2>/dev/null || echo "${HEAPCAST_MLFLOW_PORT:-5000}")
        if answers "$port"; then
            say "running (pid $pid), UI at http://$HOST:$port"
            echo "export MLFLOW_TRACKING_URI=http://$HOST:$port"
            return 0
        fi
        say "pid $pid is alive but http://$HOST:$port/health does not answer (yet?); log: $LOG"
        return 1
    fi
    say "not running"
    return 3
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
