#!/bin/bash
# redis workload: redis-server and redis-benchmark in one container (or sandbox), over loopback.
#   redis-driver.sh REQUESTS WORK_DIR
# Both are traced; the readiness pings and the shutdown client are not. Debian's redis links
# jemalloc and calls malloc_usable_size, which the tracer must interpose.
set -euo pipefail
requests=$1
work=$2
port=6379
untraced() { LD_PRELOAD= "$@"; }  # an empty LD_PRELOAD loads nothing
/usr/bin/redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$work" --daemonize no --logfile "$work/redis.log" &
server=$!
for _ in $(untraced seq 200); do
    untraced redis-cli -p "$port" ping >/dev/null 2>&1 && break
    untraced sleep 0.05
done
/usr/bin/redis-benchmark -p "$port" -n "$requests" -r 100000 -c 10 -q \
    -t ping_inline,set,get,incr,lpush,rpush,lpop,rpop,sadd,hset,spop,zadd,lrange_100,mset
untraced redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
wait "$server" || true
