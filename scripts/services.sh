#!/usr/bin/env bash
# Start, stop or query heapcast's services on 127.0.0.1, each by its pid.
#
#   scripts/services.sh up       start what is not running, wait until each answers, print the URLs
#                                and the variables to export (on stdout: `eval "$(... up)"` works)
#   scripts/services.sh down     stop everything this script started, by pid, in reverse order
#   scripts/services.sh status   each service: up/down by pid and by health check
#
# Services, in start order:
#   engine          the container engine, through scripts/engine.sh (only where none answers)
#   prefect-server  `prefect server start` with PREFECT_HOME inside the project
#   (pool+deploy)   work pool `heapcast` (type process) and `prefect deploy --all` from prefect.yaml
#   prefect-worker  `prefect worker start --pool heapcast` (stopped with SIGINT, as Prefect wants)
#   mlflow          MLflow tracking server on a SQLite store with served artifacts
#   dask-scheduler  `dask scheduler`
#   dask-worker     `dask worker` processes attached to that scheduler
#
# Pid files and logs live in .services/ (HEAPCAST_SERVICES_DIR). Every process is started in its
# own session (os.setsid), so stopping its process group also stops the children it spawned
# (uvicorn/gunicorn workers, Dask nannies, flow-run subprocesses).
#
# Settings (environment; defaults in brackets):
#   HEAPCAST_PREFECT_PORT [4200]  HEAPCAST_MLFLOW_PORT [5000]
#   HEAPCAST_DASK_PORT [8786]     HEAPCAST_DASK_DASHBOARD_PORT [8787]
#   HEAPCAST_DASK_WORKERS [2]     HEAPCAST_DASK_THREADS [1]
#   HEAPCAST_POOL [heapcast]
#   HEAPCAST_ROOT [<project>/data] the data root; MLflow serves the store under it
#                                 (<root>/mlflow, through scripts/mlflow-server.sh)
#   HEAPCAST_MLFLOW_DIR           serve this folder's mlflow.db + artifacts/ instead (direct)
#   PREFECT_HOME [<project>/.prefect]
#   HEAPCAST_NIGHTLY_CRON         a cron string that replaces prefect.yaml's nightly schedule
#   HEAPCAST_NIGHTLY_TZ [UTC]     its timezone
#   HEAPCAST_SERVICES             which services `up` starts [engine prefect mlflow dask]
#   HEAPCAST_DEPLOY [1]           0: create the pool but do not run `prefect deploy --all`
#   HEAPCAST_WAIT_S [180]         how long to wait for each service to answer
set -euo pipefail

PROJECT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SVC_DIR=${HEAPCAST_SERVICES_DIR:-$PROJECT_DIR/.services}
BIN=${HEAPCAST_BIN:-$PROJECT_DIR/.venv/bin}
[ -x "$BIN/prefect" ] || BIN=$(dirname "$(command -v prefect 2>/dev/null || echo /usr/local/bin/prefect)")
PY=$BIN/python; [ -x "$PY" ] || PY=$(command -v python3)

PREFECT_PORT=${HEAPCAST_PREFECT_PORT:-4200}
MLFLOW_PORT=${HEAPCAST_MLFLOW_PORT:-5000}
DASK_PORT=${HEAPCAST_DASK_PORT:-8786}
DASK_DASHBOARD_PORT=${HEAPCAST_DASK_DASHBOARD_PORT:-8787}
DASK_WORKERS=${HEAPCAST_DASK_WORKERS:-2}
DASK_THREADS=${HEAPCAST_DASK_THREADS:-1}
POOL=${HEAPCAST_POOL:-heapcast}
MLFLOW_DIR=${HEAPCAST_MLFLOW_DIR:-$PROJECT_DIR/data/mlflow}  # only without scripts/mlflow-server.sh
SERVICES=${HEAPCAST_SERVICES:-engine prefect mlflow dask}
WAIT_S=${HEAPCAST_WAIT_S:-180}

export PREFECT_HOME=${PREFECT_HOME:-$PROJECT_DIR/.prefect}
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export PREFECT_API_URL="http://127.0.0.1:$PREFECT_PORT/api"
PREFECT_UI_URL="http://127.0.0.1:$PREFECT_PORT"
MLFLOW_URL="http://127.0.0.1:$MLFLOW_PORT"
DASK_ADDRESS="tcp://127.0.0.1:$DASK_PORT"
DASK_DASHBOARD_URL="http://127.0.0.1:$DASK_DASHBOARD_PORT"

say() { echo "services.sh: $*" >&2; }
die() { say "$*"; exit 1; }
wants() { case " $SERVICES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

pidfile() { echo "$SVC_DIR/$1.pid"; }
logfile() { echo "$SVC_DIR/$1.log"; }

pid_of() {  # pid_of NAME: the recorded pid when that process is alive, else nothing (status 1)
    local f pid
    f=$(pidfile "$1")
    [ -f "$f" ] || return 1
    pid=$(cat "$f")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then echo "$pid"; return 0; fi
    return 1
}

http_ok() { curl -sf --max-time 3 "$1" >/dev/null 2>&1; }

port_free() {  # port_free PORT: nothing listens on 127.0.0.1:PORT
    ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

launch() {  # launch NAME CMD...: start CMD in its own session, record its pid, log to .services/NAME.log
    local name=$1; shift
    local log
    log=$(logfile "$name")
    echo "=== $(date -u +%FT%TZ) $*" >>"$log"
    # A background job of a non-interactive shell starts with SIGINT ignored, and Python keeps it
    # ignored: restore it (the Prefect worker stops on SIGINT), and start a new session.
    "$PY" -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.setsid(); os.execvp(sys.argv[1], sys.argv[1:])' \
        "$@" </dev/null >>"$log" 2>&1 &
    echo $! >"$(pidfile "$name")"
    say "started $name (pid $!, log $log)"
}

wait_until() {  # wait_until NAME CHECK...: poll CHECK until it succeeds; fail if NAME's process dies
    local name=$1; shift
    local i=0 t0=$SECONDS
    until "$@"; do
        if ! pid_of "$name" >/dev/null; then
            say "$name exited before answering; last lines of $(logfile "$name"):"
            tail -n 25 "$(logfile "$name")" >&2 || true
            exit 1
        fi
        i=$((i + 1))
        if [ $((SECONDS - t0)) -gt "$WAIT_S" ]; then
            say "$name did not answer within ${WAIT_S}s; last lines of $(logfile "$name"):"
            tail -n 25 "$(logfile "$name")" >&2 || true
            exit 1
        fi
        sleep 1
    done
    say "$name answers (after $((SECONDS - t0)) s)"
}

stop() {  # stop NAME [SIGNAL]: signal the recorded pid, wait, then TERM and KILL its process group
    local name=$1 sig=${2:-TERM} pid i
    if ! pid=$(pid_of "$name"); then
        rm -f "$(pidfile "$name")"
        return 0
    fi
    say "stopping $name (pid $pid, SIG$sig)"
    kill -"$sig" "$pid" 2>/dev/null || true
    for i in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then
        say "$name (pid $pid) still alive after 30 s: SIGTERM to its process group"
        kill -TERM -- "-$pid" 2>/dev/null || true
        for i in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    fi
    # children left in the group (uvicorn/gunicorn workers, nannies): the group goes too
    kill -TERM -- "-$pid" 2>/dev/null || true
    sleep 0.5
    kill -KILL -- "-$pid" 2>/dev/null || true
    rm -f "$(pidfile "$name")"
}

# ---------------------------------------------------------------- health checks
prefect_healthy() { http_ok "$PREFECT_API_URL/health"; }
mlflow_healthy() { http_ok "$MLFLOW_URL/health"; }
dask_scheduler_healthy() { http_ok "$DASK_DASHBOARD_URL/health"; }
dask_workers_count() {
    curl -sf --max-time 3 "$DASK_DASHBOARD_URL/json/counts.json" 2>/dev/null \
        | sed -n 's/.*"workers": *\([0-9]*\).*/\1/p'
}
dask_workers_healthy() { [ "$(dask_workers_count)" = "$DASK_WORKERS" ]; }
prefect_worker_healthy() {  # the pool has a worker whose heartbeat the server has seen
    curl -sf --max-time 5 -X POST -H 'Content-Type: application/json' -d '{}' \
        "$PREFECT_API_URL/work_pools/$POOL/workers/filter" 2>/dev/null | grep -q '"status": *"ONLINE"'
}

# ---------------------------------------------------------------- up
up_engine() {
    [ -x "$PROJECT_DIR/scripts/engine.sh" ] || { say "no scripts/engine.sh: skipping the container engine"; return 0; }
    if "$PROJECT_DIR/scripts/engine.sh" status >/dev/null 2>&1; then
        say "a container engine already answers; leaving it alone"
        ENGINE_EXPORT=$("$PROJECT_DIR/scripts/engine.sh" status 2>/dev/null || true)
        return 0
    fi
    ENGINE_EXPORT=$("$PROJECT_DIR/scripts/engine.sh" up)
    touch "$SVC_DIR/engine.started"   # ours: `down` stops it
}

up_prefect() {
    if pid_of prefect-server >/dev/null; then
        say "prefect-server already running (pid $(pid_of prefect-server))"
    else
        port_free "$PREFECT_PORT" || die "port $PREFECT_PORT is taken by another process; set HEAPCAST_PREFECT_PORT"
        mkdir -p "$PREFECT_HOME"
        launch prefect-server "$BIN/prefect" server start --host 127.0.0.1 --port "$PREFECT_PORT"
    fi
    wait_until prefect-server prefect_healthy

    local out
    if out=$("$BIN/prefect" work-pool create "$POOL" --type process 2>&1); then
        say "work pool $POOL created"
    elif echo "$out" | grep -qi "already exists"; then
        say "work pool $POOL already exists"
    else
        echo "$out" >&2; die "could not create work pool $POOL"
    fi

    if [ "${HEAPCAST_DEPLOY:-1}" != 0 ]; then
        say "deploying prefect.yaml (prefect deploy --all)"
        (cd "$PROJECT_DIR" && "$BIN/prefect" --no-prompt deploy --all) >>"$(logfile deploy)" 2>&1 \
            || { tail -n 30 "$(logfile deploy)" >&2; die "prefect deploy --all failed (log: $(logfile deploy))"; }
        if [ -n "${HEAPCAST_NIGHTLY_CRON:-}" ]; then
            say "nightly schedule: '$HEAPCAST_NIGHTLY_CRON' (${HEAPCAST_NIGHTLY_TZ:-UTC})"
            (cd "$PROJECT_DIR" && "$BIN/prefect" --no-prompt deploy --name nightly \
                --cron "$HEAPCAST_NIGHTLY_CRON" --timezone "${HEAPCAST_NIGHTLY_TZ:-UTC}") >>"$(logfile deploy)" 2>&1 \
                || { tail -n 30 "$(logfile deploy)" >&2; die "could not set the nightly schedule"; }
        fi
        say "deployed: $(grep -o "Deployment '[^']*'" "$(logfile deploy)" | sort -u | tr '\n' ' ')"
    fi

    if pid_of prefect-worker >/dev/null; then
        say "prefect-worker already running (pid $(pid_of prefect-worker))"
    else
        # Flow runs inherit the worker's environment: point them at the other services.
        (
            cd "$PROJECT_DIR"
            if wants dask; then export HEAPCAST_DASK_SCHEDULER="$DASK_ADDRESS"; fi
            if wants mlflow; then export MLFLOW_TRACKING_URI="$MLFLOW_URL"; fi
            if [ -n "${ENGINE_EXPORT:-}" ]; then eval "$ENGINE_EXPORT"; fi
            launch prefect-worker "$BIN/prefect" worker start --pool "$POOL" --name "heapcast-$(hostname)-$$"
        )
    fi
    wait_until prefect-worker prefect_worker_healthy
}

up_mlflow() {
    if pid_of mlflow >/dev/null; then
        say "mlflow already running (pid $(pid_of mlflow))"
    elif [ -z "${HEAPCAST_MLFLOW_DIR:-}" ] && [ -x "$PROJECT_DIR/scripts/mlflow-server.sh" ]; then
        # The store the embedded mode writes (<root>/mlflow), through its own script; its pid
        # is recorded here too, so status and down treat it like the others.
        port_free "$MLFLOW_PORT" || die "port $MLFLOW_PORT is taken by another process; set HEAPCAST_MLFLOW_PORT"
        HEAPCAST_MLFLOW_PORT=$MLFLOW_PORT HEAPCAST_MLFLOW_WAIT_S=$WAIT_S \
            "$PROJECT_DIR/scripts/mlflow-server.sh" start >/dev/null 2>>"$(logfile mlflow)" \
            || { tail -n 20 "$(logfile mlflow)" >&2; die "scripts/mlflow-server.sh start failed"; }
        local state
        state=$(cd "$PROJECT_DIR" && "$PY" -m tasks.registry.tracking server-store ${HEAPCAST_ROOT:+"$HEAPCAST_ROOT"} \
                | sed -n 's/^STATE_DIR=//p')
        cp "$state/server.pid" "$(pidfile mlflow)"
        touch "$SVC_DIR/mlflow.script"
        say "started mlflow with scripts/mlflow-server.sh (pid $(cat "$(pidfile mlflow)"), log $state/server.log)"
    else
        port_free "$MLFLOW_PORT" || die "port $MLFLOW_PORT is taken by another process; set HEAPCAST_MLFLOW_PORT"
        mkdir -p "$MLFLOW_DIR/artifacts"
        MLFLOW_SERVER_ENABLE_JOB_EXECUTION=${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false} \
        launch mlflow "$BIN/mlflow" server \
            --backend-store-uri "sqlite:///$MLFLOW_DIR/mlflow.db" \
            --artifacts-destination "$MLFLOW_DIR/artifacts" \
            --host 127.0.0.1 --port "$MLFLOW_PORT" --workers "${HEAPCAST_MLFLOW_WORKERS:-1}"
    fi
    wait_until mlflow mlflow_healthy
}

up_dask() {
    if pid_of dask-scheduler >/dev/null; then
        say "dask-scheduler already running (pid $(pid_of dask-scheduler))"
    else
        port_free "$DASK_PORT" || die "port $DASK_PORT is taken by another process; set HEAPCAST_DASK_PORT"
        launch dask-scheduler "$BIN/dask" scheduler --host 127.0.0.1 --port "$DASK_PORT" \
            --dashboard-address "127.0.0.1:$DASK_DASHBOARD_PORT"
    fi
    wait_until dask-scheduler dask_scheduler_healthy
    if pid_of dask-worker >/dev/null; then
        say "dask-worker already running (pid $(pid_of dask-worker))"
    else
        mkdir -p "$SVC_DIR/dask-worker-space"
        launch dask-worker "$BIN/dask" worker "$DASK_ADDRESS" --host 127.0.0.1 \
            --nworkers "$DASK_WORKERS" --nthreads "$DASK_THREADS" --no-dashboard \
            --local-directory "$SVC_DIR/dask-worker-space"
    fi
    wait_until dask-worker dask_workers_healthy
}

print_exports() {
    echo "# heapcast services: export these to point flows and clients at them"
    wants prefect && echo "export PREFECT_API_URL=$PREFECT_API_URL"
    wants dask && echo "export HEAPCAST_DASK_SCHEDULER=$DASK_ADDRESS"
    wants mlflow && echo "export MLFLOW_TRACKING_URI=$MLFLOW_URL"
    [ -n "${ENGINE_EXPORT:-}" ] && echo "$ENGINE_EXPORT"
    return 0
}

up() {
    mkdir -p "$SVC_DIR"
    local t0=$SECONDS
    ENGINE_EXPORT=""
    # MLflow and Dask first: the worker that Prefect starts points its flow runs at them.
    if wants engine; then up_engine; fi
    if wants mlflow; then up_mlflow; fi
    if wants dask; then up_dask; fi
    if wants prefect; then up_prefect; fi
    say "all services up in $((SECONDS - t0)) s"
    {
        wants prefect && echo "  Prefect UI      $PREFECT_UI_URL   (pool $POOL; run: prefect deployment run 'nightly/nightly')"
        wants mlflow && echo "  MLflow UI       $MLFLOW_URL"
        wants dask && echo "  Dask dashboard  $DASK_DASHBOARD_URL   (scheduler $DASK_ADDRESS)"
        echo "  logs and pids   $SVC_DIR"
    } >&2
    print_exports
}

# ---------------------------------------------------------------- down
down() {
    # reverse of the start order
    stop prefect-worker INT
    stop prefect-server
    stop dask-worker
    stop dask-scheduler
    if [ -f "$SVC_DIR/mlflow.script" ] && pid_of mlflow >/dev/null; then
        say "stopping mlflow (scripts/mlflow-server.sh stop)"
        "$PROJECT_DIR/scripts/mlflow-server.sh" stop 2>>"$(logfile mlflow)" || true
    fi
    rm -f "$SVC_DIR/mlflow.script"
    stop mlflow
    if [ -f "$SVC_DIR/engine.started" ]; then
        "$PROJECT_DIR/scripts/engine.sh" down || true
        rm -f "$SVC_DIR/engine.started"
    fi
    say "all services stopped"
}

# ---------------------------------------------------------------- status
status() {
    local rc=0 name pid health
    line() {  # line NAME CHECK URL
        local name=$1 check=$2 url=$3
        if pid=$(pid_of "$name"); then
            if $check; then health="answers"; else health="NOT ANSWERING"; rc=1; fi
            printf '  %-15s up    pid %-8s %-14s %s\n' "$name" "$pid" "$health" "$url" >&2
        else
            if $check; then health="answers (not started by services.sh)"; else health=""; fi
            printf '  %-15s down  %-12s %s %s\n' "$name" "" "$health" "$url" >&2
            rc=1
        fi
    }
    wants mlflow && line mlflow mlflow_healthy "$MLFLOW_URL"
    wants dask && line dask-scheduler dask_scheduler_healthy "$DASK_ADDRESS $DASK_DASHBOARD_URL"
    wants dask && line dask-worker dask_workers_healthy "$DASK_WORKERS worker(s) wanted, $(dask_workers_count || true) attached"
    wants prefect && line prefect-server prefect_healthy "$PREFECT_UI_URL"
    wants prefect && line prefect-worker prefect_worker_healthy "pool $POOL"
    if wants engine && [ -x "$PROJECT_DIR/scripts/engine.sh" ]; then
        if ENGINE_EXPORT=$("$PROJECT_DIR/scripts/engine.sh" status 2>/dev/null); then
            printf '  %-15s up    %-12s %s\n' engine "" "${ENGINE_EXPORT#export }" >&2
        else
            printf '  %-15s down\n' engine >&2; rc=1
        fi
    fi
    [ "$rc" = 0 ] && print_exports
    return "$rc"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    *) echo "usage: $0 up|down|status   (see the top of this file for settings)" >&2; exit 2 ;;
esac
