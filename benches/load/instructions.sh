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
# valgrind hides SHA-NI, so SHA-256 runs in software there: the script reports the
# first-seen rows also without sha2's compression function, the part that SHA-NI makes
# about twenty times cheaper natively.
#
# Prints a table and writes it to benches/load/INSTRUCTIONS.md (RESULTS overrides).
# Knobs: N (3000 counted requests), SKIP_BUILD=1, PORT_BASE (21280), RESULTS, KEEP (a
# directory to copy the callgrind dumps into, for `callgrind_annotate` or kcachegrind).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
N=${N:-3000}
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
if ((${#missing[@]})); then
    log "installing ${missing[*]} (apt-get)"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
command -v oha >/dev/null || die "oha missing: run benches/load/run.sh once (it installs it)"
if [[ ${SKIP_BUILD:-0} != 1 ]]; then
    (cd "$ROOT" && cargo build --release --bin idemgate --quiet)
fi
IDEMGATE=$ROOT/target/release/idemgate

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
free_port IDEMGATE_PORT
free_port ADMIN_PORT
mkdir -p "$WORK/tmp"
fill_templates "$WORK" nginx-upstream.conf nginx-proxy.conf idemgate-memory.yaml
# Under valgrind nginx runs as one process (no master), so the worker is what is counted.
sed -i 's/^worker_processes 1;/worker_processes 1;\nmaster_process off;/' "$WORK/nginx-proxy.conf"

nginx -p "$WORK" -c "$WORK/nginx-upstream.conf" >"$WORK/upstream.log" 2>&1 &
PIDS+=($!)
wait_port "$UPSTREAM_PORT" "$!"

BODY="{\"p\":\"$(head -c 1000 /dev/zero | tr '\0' x)\"}"
fire() { # fire PORT URL-REGEX COUNT [HEADER]
    local extra=()
    [[ -n ${4:-} ]] && extra=(-H "$4")
    oha -n "$3" -c 16 --no-tui -m POST -H 'Content-Type: application/json' "${extra[@]}" \
        -d "$BODY" --rand-regex-url "http://127.0.0.1:$1$2" >"$WORK/oha.out"
    grep -q 'Success rate:.*100.00%' "$WORK/oha.out" || die "requests failed: $(cat "$WORK/oha.out")"
}

# count NAME PORT URL-REGEX [HEADER] -- COMMAND...: prints "total sha2" instructions per request.
count() {
    local name=$1 port=$2 url=$3 header=$4
    shift 5
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$WORK/cg.$name" "$@" \
        >"$WORK/$name.log" 2>&1 &
    local vpid=$!
    PIDS+=("$vpid")
    wait_port "$port" "$vpid"
    fire "$port" "$url" 200 "$header"
    callgrind_control -i on "$vpid" >/dev/null
    fire "$port" "$url" "$N" "$header"
    callgrind_control -i off "$vpid" >/dev/null
    callgrind_control -d "$vpid" >/dev/null
    # Counted and dumped: no graceful drain needed (idemgate's would wait for idle clients).
    kill -KILL "$vpid" 2>/dev/null
    wait "$vpid" 2>/dev/null || true
    local dump
    dump=$(ls "$WORK/cg.$name".* | head -1)
    if [[ -n ${KEEP:-} ]]; then
        mkdir -p "$KEEP"
        cp "$dump" "$KEEP/callgrind.$name"
    fi
    local total sha
    total=$(callgrind_annotate "$dump" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1; exit}')
    sha=$(callgrind_annotate --inclusive=yes "$dump" 2>/dev/null |
        awk '/sha2::sha256::compress256 \[/ {gsub(",", "", $1); print $1; exit}')
    echo "$((total / N)) $((${sha:-0} / N))"
}

declare -A TOTAL SHA
row() { # row ID ...count args
    local id=$1 result
    shift
    log "counting $id ($N requests)"
    result=$(count "$id" "$@")
    TOTAL[$id]=${result% *}
    SHA[$id]=${result#* }
}
row b "$NGINX_PORT" '/pass/[a-z]{12}' '' -- nginx -p "$WORK" -c "$WORK/nginx-proxy.conf"
row c "$IDEMGATE_PORT" '/pass/[a-z]{12}' '' -- "$IDEMGATE" run --config "$WORK/idemgate-memory.yaml"
row d2 "$IDEMGATE_PORT" '/fp/[a-z]{12}' '' -- "$IDEMGATE" run --config "$WORK/idemgate-memory.yaml"
row e "$IDEMGATE_PORT" '/orders' 'Idempotency-Key: replayed-key' -- "$IDEMGATE" run --config "$WORK/idemgate-memory.yaml"

{
    echo "# Instructions per request (callgrind)"
    echo
    echo "Written by \`bash benches/load/instructions.sh\`; see benches/load/README.md."
    echo
    echo "| row | what | instructions / request | without SHA-256 compression | × nginx |"
    echo "|---|---|---:|---:|---:|"
    for id in b c d2 e; do
        case $id in
            b) what="nginx \`proxy_pass\`, 1 worker, upstream keepalive" ;;
            c) what="idemgate, unprotected route (streamed)" ;;
            d2) what="idemgate first-seen, body fingerprint, memory store" ;;
            e) what="idemgate replays of one stored key (\`Idempotency-Key\`)" ;;
        esac
        net=$((TOTAL[$id] - SHA[$id]))
        printf '| %s | %s | %d | %d | %.2f |\n' "$id" "$what" "${TOTAL[$id]}" "$net" \
            "$(awk -v a="$net" -v b="${TOTAL[b]}" 'BEGIN { print a / b }')"
    done
    echo
    echo "$N counted POSTs of 1 KiB JSON, oha -c16, $(date -u '+%Y-%m-%d %H:%M UTC'), $(valgrind --version), idemgate built $(date -u -r "$IDEMGATE" '+%Y-%m-%d %H:%M UTC')."
} | tee "$RESULTS"
