#!/usr/bin/env bash
# User-space instructions per proxied request, counted by valgrind (callgrind): nginx
# `proxy_pass` beside idemgate's unprotected, first-seen and replay paths.
#
#   bash benches/load/instructions.sh            # about 1 minute once built
#
# Throughput on a shared VM moves by a third between runs of the same binary; an
# instruction count does not (the same binary and requests give the same count within a
# fraction of a percent, whatever else runs). It misses what the kernel does (syscalls,
# wake-ups), so it complements run.sh rather than replacing it. Each proxy runs under
# callgrind with counting off, gets 200 warm-up requests, then N counted ones (oha, 16
# connections, 1 KiB JSON POSTs to random paths); the count is divided by N.
#
# Row f runs idemgate with the Redis store against a redis-server that is counted too, so
# the table shows what a first-seen request costs Redis, and how much of that is the
# completion's swap script (`EVALSHA`, Lua; Redis 7.0 has no `SET … IFEQ`) against the
# claim (`SET … NX GET`, native). Row fv does the same against Valkey 9.1
# (scripts/fetch-valkey), where the completion is `SET … IFEQ` and its `PUBLISH` instead
# of the script.
#
# valgrind hides SHA-NI, so SHA-256 runs in software there: the script reports the
# first-seen rows also without sha2's compression function, the part that SHA-NI makes
# about twenty times cheaper natively.
#
# Prints a table and writes it to benches/load/INSTRUCTIONS.md (RESULTS overrides).
# Knobs: N (3000 counted requests), SKIP_BUILD=1, IDEMGATE (the binary to count, default
# target/release/idemgate), PORT_BASE (21280), RESULTS, KEEP (a
# directory to copy the callgrind dumps into, for `callgrind_annotate` or kcachegrind),
# ROWS (which rows to count, default all: b bf bg c cg d2 do2 e f fv), CONNS (oha's
# connections, 16), EXTRA_YAML (lines appended to idemgate's configs, e.g. a
# `connections:` block, to count a setting's cost).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
N=${N:-3000}
CONNS=${CONNS:-16}
ROWS=${ROWS:-b bf bg c cg d2 do2 e f fv}
wants() { [[ " $ROWS " == *" $1 "* ]]; }
RESULTS=${RESULTS:-$HERE/INSTRUCTIONS.md}
export PATH="$HOME/.cargo/bin:$PATH:/usr/sbin:/sbin"
# No access log under test (nginx runs with `access_log off` too).
export IDEMGATE_LOG=warn

log() { printf '%s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

SUDO=""
[[ $(id -u) -eq 0 ]] || SUDO=sudo
missing=()
command -v valgrind >/dev/null || missing+=(valgrind)
command -v nginx >/dev/null || missing+=(nginx)
command -v curl >/dev/null || missing+=(curl)
command -v redis-server >/dev/null || missing+=(redis-server)
if ((${#missing[@]})); then
    log "installing ${missing[*]} (apt-get)"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
command -v oha >/dev/null || die "oha missing: run benches/load/run.sh once (it installs it)"
VALKEY_SERVER=""
wants fv && VALKEY_SERVER=$("$ROOT/scripts/fetch-valkey")

if [[ ${SKIP_BUILD:-0} != 1 ]]; then
    (cd "$ROOT" && cargo build --release --bin idemgate --quiet)
fi
IDEMGATE=${IDEMGATE:-$ROOT/target/release/idemgate}

WORK=$(mktemp -d /tmp/idemgate-instr.XXXXXX)
PIDS=()
cleanup() {
    set +e
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# shellcheck source=ports.sh
source "$HERE/ports.sh"
next_port=${PORT_BASE:-21280}
free_port UPSTREAM_PORT
free_port NGINX_PORT
free_port NGINX_FWD_PORT
free_port IDEMGATE_PORT
free_port ADMIN_PORT
free_port REDIS_PORT
mkdir -p "$WORK/tmp"
fill_templates "$WORK" nginx-upstream.conf nginx-proxy.conf idemgate-memory.yaml idemgate-redis.yaml
if [[ -n ${EXTRA_YAML:-} ]]; then
    for yaml in idemgate-memory.yaml idemgate-redis.yaml; do
        printf '%s\n' "$EXTRA_YAML" >>"$WORK/$yaml"
    done
fi
# Under valgrind nginx runs as one process (no master), so the worker is what is counted.
sed -i 's/^worker_processes 1;/worker_processes 1;\nmaster_process off;/' "$WORK/nginx-proxy.conf"

nginx -p "$WORK" -c "$WORK/nginx-upstream.conf" >"$WORK/upstream.log" 2>&1 &
PIDS+=($!)
wait_port "$UPSTREAM_PORT" "$!"

BODY="{\"p\":\"$(head -c 1000 /dev/zero | tr '\0' x)\"}"
fire() { # fire PORT URL-REGEX COUNT [HEADER]: POSTs of BODY, or GETs where HEADER is GET
    local extra=(-m POST -H 'Content-Type: application/json' -d "$BODY")
    if [[ ${4:-} == GET ]]; then
        extra=(-m GET)
    elif [[ -n ${4:-} ]]; then
        extra+=(-H "$4")
    fi
    oha -n "$3" -c "$CONNS" --no-tui "${extra[@]}" \
        --rand-regex-url "http://127.0.0.1:$1$2" >"$WORK/oha.out"
    grep -q 'Success rate:.*100.00%' "$WORK/oha.out" || die "requests failed: $(cat "$WORK/oha.out")"
}

# under_callgrind NAME PORT COMMAND...: starts COMMAND under callgrind with counting off
# and waits until it listens on PORT; sets VPID.
under_callgrind() {
    local name=$1 port=$2
    shift 2
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$WORK/cg.$name" "$@" \
        >"$WORK/$name.log" 2>&1 &
    VPID=$!
    PIDS+=("$VPID")
    wait_port "$port" "$VPID"
}

# dump NAME PID: stops counting, dumps and kills PID (counted and dumped: no graceful
# drain needed; idemgate's would wait for idle clients); sets DUMP to the dump's path.
dump() {
    local name=$1 pid=$2
    callgrind_control -i off "$pid" >/dev/null
    callgrind_control -d "$pid" >/dev/null
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null || true
    DUMP=$(ls "$WORK/cg.$name".* | head -1)
    if [[ -n ${KEEP:-} ]]; then
        mkdir -p "$KEEP"
        cp "$DUMP" "$KEEP/callgrind.$name"
    fi
}

# per_request DUMP [FUNCTION]: the dump's instructions (or FUNCTION's, inclusive) over N.
per_request() {
    local n
    if [[ -z ${2:-} ]]; then
        n=$(callgrind_annotate "$1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1; exit}')
    else
        n=$(callgrind_annotate --inclusive=yes "$1" 2>/dev/null |
            awk -v f="$2 [" 'index($0, f) {gsub(",", "", $1); print $1; exit}')
    fi
    echo $((${n:-0} / N))
}

# count NAME PORT URL-REGEX [HEADER] -- COMMAND...: prints "total sha2" instructions per request.
count() {
    local name=$1 port=$2 url=$3 header=$4
    shift 5
    under_callgrind "$name" "$port" "$@"
    local vpid=$VPID
    fire "$port" "$url" 200 "$header"
    callgrind_control -i on "$vpid" >/dev/null
    fire "$port" "$url" "$N" "$header"
    dump "$name" "$vpid"
    echo "$(per_request "$DUMP") $(per_request "$DUMP" sha2::sha256::compress256)"
}

declare -A TOTAL SHA
row() { # row ID ...count args
    local id=$1 result
    shift
    wants "$id" || return 0
    log "counting $id ($N requests)"
    result=$(count "$id" "$@")
    TOTAL[$id]=${result% *}
    SHA[$id]=${result#* }
}
row b "$NGINX_PORT" '/pass/[a-z]{12}' '' -- nginx -p "$WORK" -c "$WORK/nginx-proxy.conf"
row bf "$NGINX_FWD_PORT" '/pass/[a-z]{12}' '' -- nginx -p "$WORK" -c "$WORK/nginx-proxy.conf"
row bg "$NGINX_PORT" '/pass/[a-z]{12}' GET -- nginx -p "$WORK" -c "$WORK/nginx-proxy.conf"
row c "$IDEMGATE_PORT" '/pass/[a-z]{12}' '' -- "$IDEMGATE" run --config "$WORK/idemgate-memory.yaml"
row cg "$IDEMGATE_PORT" '/pass/[a-z]{12}' GET -- "$IDEMGATE" run --config "$WORK/idemgate-memory.yaml"
row d2 "$IDEMGATE_PORT" '/fp/[a-z]{12}' '' -- "$IDEMGATE" run --config "$WORK/idemgate-memory.yaml"
row do2 "$IDEMGATE_PORT" '/observed-fp/[a-z]{12}' '' -- "$IDEMGATE" run --config "$WORK/idemgate-memory.yaml"
row e "$IDEMGATE_PORT" '/orders' 'Idempotency-Key: replayed-key' -- "$IDEMGATE" run --config "$WORK/idemgate-memory.yaml"

# store_row ID SERVER: idemgate (Redis store) and the store server SERVER (a redis-server
# or valkey-server binary) both counted over the same first-seen requests; sets the row's
# TOTAL and SHA, and SERVER_TOTAL, SERVER_SCRIPT (the scripts' share) and SERVER_VERSION
# under ID.
declare -A SERVER_TOTAL SERVER_SCRIPT SERVER_VERSION
store_row() {
    local id=$1 server=$2
    wants "$id" || return 0
    log "counting $id ($N requests; idemgate and $(basename "$server"))"
    under_callgrind "$id-server" "$REDIS_PORT" "$server" --bind 127.0.0.1 --port "$REDIS_PORT" \
        --save "" --appendonly no --dir "$WORK"
    local server_vpid=$VPID
    under_callgrind "$id" "$IDEMGATE_PORT" "$IDEMGATE" run --config "$WORK/idemgate-redis.yaml"
    local idem_vpid=$VPID
    fire "$IDEMGATE_PORT" '/fp/[a-z]{12}' 200
    callgrind_control -i on "$server_vpid" >/dev/null
    callgrind_control -i on "$idem_vpid" >/dev/null
    fire "$IDEMGATE_PORT" '/fp/[a-z]{12}' "$N"
    dump "$id" "$idem_vpid"
    TOTAL[$id]=$(per_request "$DUMP")
    SHA[$id]=$(per_request "$DUMP" sha2::sha256::compress256)
    dump "$id-server" "$server_vpid"
    SERVER_TOTAL[$id]=$(per_request "$DUMP")
    SERVER_SCRIPT[$id]=$(per_request "$DUMP" evalShaCommand)
    SERVER_VERSION[$id]="$(basename "$server" | sed 's/-server//') $("$server" --version | sed -E 's/.*v=([^ ]+).*/\1/')"
}
store_row f "$(command -v redis-server)"
wants fv && store_row fv "$VALKEY_SERVER"

{
    echo "# Instructions per request (callgrind)"
    echo
    echo "Written by \`bash benches/load/instructions.sh\`; see benches/load/README.md."
    echo
    echo "| row | what | instructions / request | without SHA-256 compression | × nginx |"
    echo "|---|---|---:|---:|---:|"
    for id in b bf bg c cg d2 do2 e f fv; do
        wants "$id" || continue
        case $id in
            b) what="nginx \`proxy_pass\`, 1 worker, upstream keepalive" ;;
            bf) what="the same nginx setting idemgate's forwarded headers (\`Host\`, \`X-Forwarded-*\`)" ;;
            bg) what="nginx \`proxy_pass\`, GET (no body)" ;;
            c) what="idemgate, unprotected route (streamed)" ;;
            cg) what="idemgate, unprotected route, GET (no body)" ;;
            d2) what="idemgate first-seen, body fingerprint, memory store" ;;
            do2) what="idemgate, \`idempotency: observe\`, body fingerprint, memory store (every request first-seen)" ;;
            e) what="idemgate replays of one stored key (\`Idempotency-Key\`)" ;;
            f) what="idemgate first-seen, body fingerprint, Redis store on Redis (idemgate only)" ;;
            fv) what="idemgate first-seen, body fingerprint, Redis store on Valkey (idemgate only)" ;;
        esac
        net=$((TOTAL[$id] - SHA[$id]))
        ref=b
        [[ $id == cg || $id == bg ]] && ref=bg
        printf '| %s | %s | %d | %d | %s |\n' "$id" "$what" "${TOTAL[$id]}" "$net" \
            "$([[ -n ${TOTAL[$ref]:-} ]] && awk -v a="$net" -v b="${TOTAL[$ref]}" 'BEGIN { printf "%.2f", a / b }' || echo –)"
    done
    echo
    echo "× nginx: against row b, GET rows against bg; oha -c$CONNS.${EXTRA_YAML:+ Config added: \`$EXTRA_YAML\`.}"
    echo
    if wants f || wants fv; then
    echo "The store server (user space) per first-seen request:"
    echo
    echo "| row | server | completion | instructions / request | in scripts (\`EVALSHA\`, inclusive) | everything else (claim, completion \`SET\`, protocol, event loop) |"
    echo "|---|---|---|---:|---:|---:|"
    for id in f fv; do
        wants "$id" || continue
        printf '| %s | %s | %s | %d | %d | %d |\n' "$id" "${SERVER_VERSION[$id]}" \
            "$([[ ${SERVER_SCRIPT[$id]} -gt 0 ]] && echo "swap script" || echo "\`SET … IFEQ\`")" \
            "${SERVER_TOTAL[$id]}" "${SERVER_SCRIPT[$id]}" "$((SERVER_TOTAL[$id] - SERVER_SCRIPT[$id]))"
    done
    echo
    fi
    echo "$N counted requests (POSTs of 1 KiB JSON; GET rows without a body), oha -c$CONNS, $(date -u '+%Y-%m-%d %H:%M UTC'), $(valgrind --version), idemgate built $(date -u -r "$IDEMGATE" '+%Y-%m-%d %H:%M UTC')."
} | tee "$RESULTS"
