#!/usr/bin/env bash
# System calls per proxied request, nginx `proxy_pass` beside idemgate, counted by
# `strace -c -f` over N requests (oha, CONNS connections, after a warm-up):
#
#   bash benches/load/syscalls.sh          # about half a minute once built
#
# strace slows every call down, so the counts are what this shows, not the times: on
# loopback a proxy's kernel time is mostly its sends and receives, so equal counts say that
# a difference in CPU per request lies in user space (see instructions.sh). Rows: b/c
# (POST of 1 KiB JSON to the unprotected route), bg/cg (GET), d2 (first-seen, body
# fingerprint, memory store). Knobs: N (20000), CONNS (64), PORT_BASE (21680),
# SKIP_BUILD=1, EXTRA_YAML (lines appended to idemgate's config, e.g.
# `connections: { upstream_http1: idemgate }`). The rig: rig.sh.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
N=${N:-20000}
CONNS=${CONNS:-64}
log() { printf '%s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
for tool in strace oha nginx taskset; do
    command -v $tool >/dev/null || die "$tool missing (apt-get install strace; run.sh installs the others)"
done
[[ ${SKIP_BUILD:-} == 1 ]] || (cd "$ROOT" && cargo build --release --locked --quiet)

# shellcheck source=rig.sh
source "$HERE/rig.sh"
start_rig syscalls 21680
wait_port "$UPSTREAM_PORT" "${PIDS[0]}"
free_port NGINX_PORT
free_port NGINX_FWD_PORT
fill_templates "$WORK" nginx-proxy.conf
[[ -z ${EXTRA_YAML:-} ]] || printf '%s\n' "$EXTRA_YAML" >>"$WORK/idemgate-memory.yaml"
taskset -c 1 nginx -p "$WORK/nginx/" -c "$WORK/nginx-proxy.conf" >/dev/null 2>&1 &
PIDS+=($!)
NGINX_MASTER=$!
wait_port "$NGINX_PORT" "$NGINX_MASTER"
NGINX=$(pgrep -P "$NGINX_MASTER" | head -1)
IDEMGATE_LOG=warn taskset -c 1 "$ROOT/target/release/idemgate" run --config "$WORK/idemgate-memory.yaml" >"$WORK/idemgate.log" 2>&1 &
PIDS+=($!)
IDEMGATE=$!
wait_port "$IDEMGATE_PORT" "$IDEMGATE"

BODY=$(printf '{"amount":%d,"note":"%0900d"}' 1234 0)
# count ROW PID PORT PATH_REGEX METHOD: one table row.
count() {
    local row=$1 pid=$2 port=$3 path=$4 method=$5 args=()
    [[ $method == POST ]] && args=(-m POST -H 'content-type: application/json' -d "$BODY")
    taskset -c 0 oha -n 2000 -c "$CONNS" --no-tui "${args[@]}" --rand-regex-url "http://127.0.0.1:$port$path" >/dev/null
    strace -c -f -p "$pid" -o "$WORK/strace.$row" 2>/dev/null &
    local tracer=$!
    # Counted from the moment every thread is traced (TracerPid set); the summary is
    # written at SIGINT.
    while grep -qx $'TracerPid:\t0' "/proc/$pid"/task/*/status; do sleep 0.05; done
    taskset -c 0 oha -n "$N" -c "$CONNS" --no-tui "${args[@]}" --rand-regex-url "http://127.0.0.1:$port$path" >"$WORK/oha.$row"
    kill -INT "$tracer"
    wait "$tracer" || true
    grep -q '\[201\] '"$N"' responses' "$WORK/oha.$row" || die "row $row: not $N answers of 201: $(cat "$WORK/oha.$row")"
    awk -v row="$row" -v n="$N" '
        # strace -c: % time, seconds, usecs/call, calls, [errors,] syscall.
        $1 ~ /^[0-9.]+$/ && NF >= 5 && $NF != "total" { by[$NF] = $4 }
        END {
            line = ""
            for (s in by) if (by[s] / n >= 0.01) line = line sprintf("%s %.2f, ", s, by[s] / n)
            printf "| %s | %s |\n", row, substr(line, 1, length(line) - 2)
        }' "$WORK/strace.$row"
}
printf '| row | system calls per request (those at 0.01 or more) |\n|---|---|\n'
count b "$NGINX" "$NGINX_PORT" '/pass/[a-z]{12}' POST
count c "$IDEMGATE" "$IDEMGATE_PORT" '/pass/[a-z]{12}' POST
count bg "$NGINX" "$NGINX_PORT" '/pass/[a-z]{12}' GET
count cg "$IDEMGATE" "$IDEMGATE_PORT" '/pass/[a-z]{12}' GET
count d2 "$IDEMGATE" "$IDEMGATE_PORT" '/fp/[a-z]{16}' POST
