#!/usr/bin/env bash
# A/B of two idemgate builds beside nginx, in one run: is a change faster on this rig?
#
#   bash benches/load/ab.sh OLD_BINARY NEW_BINARY
#   EXTRA_YAML_B='connections: { upstream_http1: idemgate }' bash benches/load/ab.sh BIN BIN
#
# The rig of run.sh (wrk and the upstream nginx on CPU 0; nginx `proxy_pass` and both
# idemgates on CPU 1, memory store), fewer rows: b (nginx), c (unprotected POST), cg
# (unprotected GET), c8 (8 connections), d (first-seen, `Idempotency-Key`), e (replays).
# Every row runs for both builds in each of ROUNDS interleaved rounds (b, cA, cB, cgA, ...),
# so a host that changes speed mid-run reaches A and B alike. Prints req/s and the proxy's
# CPU µs per request (from /proc) per row and build, over all rounds, and B ÷ A.
# Knobs: ROUNDS (6), SLICE (s per slice, 3), CONNS (64), PORT_BASE (21480), EXTRA_YAML_A and
# EXTRA_YAML_B (lines appended to A's and B's config: one binary, two settings). The rig: rig.sh.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[[ $# -eq 2 && -x $1 && -x $2 ]] || { echo "usage: $0 OLD_BINARY NEW_BINARY" >&2; exit 2; }
BIN_A=$(realpath "$1") BIN_B=$(realpath "$2")
ROUNDS=${ROUNDS:-6}
SLICE=${SLICE:-3}
CONNS=${CONNS:-64}
LOAD_CPU=0
SUT_CPU=1
CLK_TCK=$(getconf CLK_TCK)

log() { printf '%s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
for tool in wrk nginx taskset; do command -v $tool >/dev/null || die "$tool missing (run.sh installs it)"; done

# shellcheck source=rig.sh
source "$HERE/rig.sh"
start_rig ab 21480
wait_port "$UPSTREAM_PORT" "${PIDS[0]}"
free_port NGINX_PORT
free_port NGINX_FWD_PORT
free_port B_PORT
free_port B_ADMIN_PORT
fill_templates "$WORK" nginx-proxy.conf
sed -e "s/127.0.0.1:$IDEMGATE_PORT\$/127.0.0.1:$B_PORT/" -e "s/127.0.0.1:$ADMIN_PORT\$/127.0.0.1:$B_ADMIN_PORT/" \
    "$WORK/idemgate-memory.yaml" >"$WORK/idemgate-b.yaml"
[[ -z ${EXTRA_YAML_A:-} ]] || printf '%s\n' "$EXTRA_YAML_A" >>"$WORK/idemgate-memory.yaml"
[[ -z ${EXTRA_YAML_B:-} ]] || printf '%s\n' "$EXTRA_YAML_B" >>"$WORK/idemgate-b.yaml"

start() { # start CPU PORT COMMAND...: sets PID to the started process
    "${PRIO[@]}" taskset -c "$1" "${@:3}" >"$WORK/log.$2" 2>&1 &
    PID=$!
    PIDS+=("$PID")
    wait_port "$2" "$PID"
}
start $SUT_CPU "$NGINX_PORT" nginx -p "$WORK/nginx/" -c "$WORK/nginx-proxy.conf"
NGINX=$(pgrep -P "$PID" | head -1)
export IDEMGATE_LOG=warn
start $SUT_CPU "$IDEMGATE_PORT" "$BIN_A" run --config "$WORK/idemgate-memory.yaml"
A=$PID
start $SUT_CPU "$B_PORT" "$BIN_B" run --config "$WORK/idemgate-b.yaml"
B=$PID

# User and system CPU ticks of a process, "user sys".
ticks() { sed 's/.*) //' "/proc/$1/stat" | awk '{print $12, $13}'; }
declare -A REQ US TICKS SYS
# slice ROW PID URL CONNS MODE PREFIX N
slice() {
    local row=$1 pid=$2 u0 s0 u1 s1 out result
    read -r u0 s0 <<<"$(ticks "$pid")"
    out=$("${PRIO[@]}" taskset -c $LOAD_CPU wrk -t1 -c"$4" -d"${SLICE}s" --timeout 5s -s "$HERE/post.lua" "$3" -- "$5" "$6" "$7")
    read -r u1 s1 <<<"$(ticks "$pid")"
    result=$(grep '^RESULT' <<<"$out") || die "wrk printed no RESULT line: $out"
    REQ[$row]=$((${REQ[$row]:-0} + $(sed -E 's/.* requests=([0-9]+).*/\1/' <<<"$result")))
    US[$row]=$((${US[$row]:-0} + $(sed -E 's/.* duration_us=([0-9]+).*/\1/' <<<"$result")))
    TICKS[$row]=$((${TICKS[$row]:-0} + u1 - u0 + s1 - s0))
    SYS[$row]=$((${SYS[$row]:-0} + s1 - s0))
}

ROW_IDS=(c cg c8 d e)
# Stores the replayed keys in both builds and warms every connection.
for side in A B; do
    port=$IDEMGATE_PORT
    [[ $side == B ]] && port=$B_PORT
    "${PRIO[@]}" taskset -c $LOAD_CPU wrk -t1 -c"$CONNS" -d2s -s "$HERE/post.lua" "http://127.0.0.1:$port/orders" -- replay r 1000 >/dev/null
done
for ((round = 1; round <= ROUNDS; round++)); do
    log "round $round of $ROUNDS"
    slice b "$NGINX" "http://127.0.0.1:$NGINX_PORT/pass/x" "$CONNS" unique "b$round" 0
    for row in "${ROW_IDS[@]}"; do
        for side in A B; do
            pid=$A port=$IDEMGATE_PORT
            [[ $side == B ]] && pid=$B port=$B_PORT
            url=http://127.0.0.1:$port
            case $row in
                c) slice "c$side" "$pid" "$url/pass/x" "$CONNS" unique "c$side$round" 0 ;;
                cg) slice "cg$side" "$pid" "$url/pass/x" "$CONNS" get "g$side$round" 0 ;;
                c8) slice "c8$side" "$pid" "$url/pass/x" 8 unique "c8$side$round" 0 ;;
                d) slice "d$side" "$pid" "$url/orders" "$CONNS" unique "d$side$round" 0 ;;
                e) slice "e$side" "$pid" "$url/orders" "$CONNS" replay r 1000 ;;
            esac
        done
    done
done

rps() { awk -v r="${REQ[$1]}" -v d="${US[$1]}" 'BEGIN { printf "%.0f", r / (d / 1e6) }'; }
cpu() { # "total (system)" µs per request
    awk -v t="${TICKS[$1]}" -v s="${SYS[$1]}" -v hz="$CLK_TCK" -v r="${REQ[$1]}" \
        'BEGIN { printf "%.2f (%.2f)", t / hz * 1e6 / r, s / hz * 1e6 / r }'
}
echo "A: $BIN_A ($(date -u -r "$BIN_A" '+%Y-%m-%d %H:%M UTC'))"
echo "B: $BIN_B ($(date -u -r "$BIN_B" '+%Y-%m-%d %H:%M UTC'))"
[[ -z ${EXTRA_YAML_A:-} ]] || echo "A's config adds: $EXTRA_YAML_A"
[[ -z ${EXTRA_YAML_B:-} ]] || echo "B's config adds: $EXTRA_YAML_B"
echo "$ROUNDS rounds of ${SLICE}s slices, wrk -t1 -c$CONNS (c8: -c8), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo
echo "÷ nginx: against b (64 connections, POST) for every row. CPU: the proxy's µs per request (of it in the kernel)."
echo
echo "| row | A req/s | B req/s | B ÷ A | A ÷ nginx | B ÷ nginx | A CPU µs/req (sys) | B CPU µs/req (sys) |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
echo "| b (nginx) | $(rps b) | | | | | $(cpu b) | |"
for row in "${ROW_IDS[@]}"; do
    a=$(rps "${row}A") b=$(rps "${row}B") n=$(rps b)
    printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$row" "$a" "$b" \
        "$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", b / a }')" \
        "$(awk -v a="$a" -v n="$n" 'BEGIN { printf "%.2f", a / n }')" \
        "$(awk -v b="$b" -v n="$n" 'BEGIN { printf "%.2f", b / n }')" "$(cpu "${row}A")" "$(cpu "${row}B")"
done
