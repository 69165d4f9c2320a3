#!/bin/bash
# service workload: hc-kvserver and its load generator hc-loadgen in one container (or
# sandbox), over loopback; both traced (the readiness wait is not).
#   kv-driver.sh SEED SESSIONS CLIENTS WORK_DIR
# Exit code: the load generator's, else the server's.
set -euo pipefail
seed=$1 sessions=$2 clients=$3 work=$4
port=7411
untraced() { LD_PRELOAD= "$@"; }  # an empty LD_PRELOAD loads nothing
rm -f "$work/kv.ready"
/usr/local/bin/hc-kvserver "$port" "$work/kv.ready" &
server=$!
for _ in $(untraced seq 400); do
    [ -e "$work/kv.ready" ] && break
    untraced sleep 0.05
done
[ -e "$work/kv.ready" ] || { echo "kv-driver.sh: hc-kvserver did not start" >&2; exit 2; }
/usr/local/bin/hc-loadgen "$port" "$seed" "$sessions" "$clients"
wait "$server"
