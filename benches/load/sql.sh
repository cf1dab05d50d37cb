#!/usr/bin/env bash
# The SQL stores under load, beside the Redis store: idemgate first-seen and replays on
# PostgreSQL (synchronous_commit on, and off) and on MariaDB (innodb_flush_log_at_trx_commit
# 1, and 2), with Redis 7.0 measured on the same rig for reference. run.sh runs this after
# its own rows (SQL=0 skips it); alone:
#
#   bash benches/load/sql.sh
#
# The upstream (nginx `return 201`), the load generator and every database run on CPU 0,
# the idemgates on CPU 1 (as in run.sh). PostgreSQL and MariaDB run at normal priority,
# not SCHED_FIFO like the rest of the rig: their threads spin on locks, and a spinning
# real-time thread never lets the holder of the lock run on the same CPU (MariaDB under
# SCHED_FIFO livelocked CPU 0 this way, starving the whole machine). The databases keep their data under target/ (a
# real disk: fsync costs what it costs there), as `nobody` when run as root. Rows are
# measured in ROUNDS interleaved slices, so drift of the host's speed reaches every row
# alike. Writes benches/load/RESULTS-sql.md. Loopback only; about 2 minutes once built.
#
# Knobs: DURATION (s per row, 12, in ROUNDS (4) slices), CONNS (64), SKIP_BUILD=1,
# PORT_BASE (21280), RESULTS_SQL (output file).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
DURATION=${DURATION:-12}
ROUNDS=${ROUNDS:-4}
SLICE=$(( (DURATION + ROUNDS - 1) / ROUNDS ))
CONNS=${CONNS:-64}
RESULTS_SQL=${RESULTS_SQL:-$HERE/RESULTS-sql.md}
STARTED=$(date +%s)
CLK_TCK=$(getconf CLK_TCK)
log() { printf '[%4ds] sql: %s\n' "$(($(date +%s) - STARTED))" "$*" >&2; }
die() { log "error: $*"; exit 1; }

export PATH="$PATH:/usr/sbin:/sbin"
PG_BIN=${IDEMGATE_TEST_PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}
missing=()
[[ -x $PG_BIN/initdb ]] || missing+=(postgresql)
command -v mariadbd >/dev/null || missing+=(mariadb-server)
command -v wrk >/dev/null || missing+=(wrk)
command -v nginx >/dev/null || missing+=(nginx)
command -v redis-server >/dev/null || missing+=(redis-server)
if ((${#missing[@]})); then
    log "installing ${missing[*]} (apt-get)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    PG_BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
fi
if [[ ${SKIP_BUILD:-0} != 1 ]]; then
    log "building idemgate (release)"
    (cd "$ROOT" && cargo build --release --bin idemgate --quiet)
fi
IDEMGATE=$ROOT/target/release/idemgate
[[ -x $IDEMGATE ]] || die "$IDEMGATE missing"

# shellcheck source=rig.sh
source "$HERE/rig.sh"
start_rig sql "${PORT_BASE:-21280}"
# The databases' files on disk (target/), not in a tmpfs.
DATA=$(mktemp -d "$ROOT/target/bench-sql.XXXXXX")
AS=()
if [[ $(id -u) -eq 0 ]]; then
    AS=(setpriv --reuid="$(id -u nobody)" --regid="$(id -g nobody)" --clear-groups)
    chown nobody "$DATA"
fi
trap 'stop_rig; [[ -n ${PG_DATA:-} ]] && "${AS[@]}" "$PG_BIN/pg_ctl" -D "$PG_DATA" -m immediate -w stop >/dev/null 2>&1; rm -rf "$DATA"' EXIT

# ---------------------------------------------------------------------------- servers
free_port REDIS_PORT
free_port PG_PORT
free_port MY_PORT
log "starting redis-server, PostgreSQL and MariaDB on CPU 0"
"${PRIO[@]}" taskset -c 0 redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save "" --appendonly no \
    --dir "$WORK" >"$WORK/redis.log" 2>&1 &
REDIS=$!
PIDS+=("$REDIS")

PG_DATA=$DATA/pg
"${AS[@]}" "$PG_BIN/initdb" -D "$PG_DATA" -U idemgate --auth=trust -E UTF8 >"$WORK/initdb.log" 2>&1
taskset -c 0 "${AS[@]}" "$PG_BIN/pg_ctl" -D "$PG_DATA" -l "$DATA/pg.log" -w \
    -o "-p $PG_PORT -k $DATA -c listen_addresses=127.0.0.1 -c max_connections=200 -c shared_buffers=256MB" \
    start >/dev/null
PG_MASTER=$(head -1 "$PG_DATA/postmaster.pid")
psql_() { "$PG_BIN/psql" -h 127.0.0.1 -p "$PG_PORT" -U idemgate -d "${2:-postgres}" -Atq -c "$1"; }
# Two databases on the one server: synchronous_commit as shipped (on), and off.
psql_ "CREATE DATABASE sync_on"
psql_ "CREATE DATABASE sync_off"
psql_ "ALTER DATABASE sync_off SET synchronous_commit = off"

mkdir -p "$DATA/my"
[[ ${#AS[@]} -eq 0 ]] || chown nobody "$DATA/my"
"${AS[@]}" mariadb-install-db --no-defaults --datadir="$DATA/my/data" --auth-root-authentication-method=normal \
    --skip-test-db >"$WORK/mariadb-install.log" 2>&1
taskset -c 0 "${AS[@]}" mariadbd --no-defaults --datadir="$DATA/my/data" --socket="$DATA/my/sock" \
    --port="$MY_PORT" --bind-address=127.0.0.1 --skip-name-resolve --max-connections=200 \
    --innodb-buffer-pool-size=256M --log-error="$DATA/my/err.log" >/dev/null 2>&1 &
MARIADB=$!
PIDS+=("$MARIADB")
my_() { mariadb -h 127.0.0.1 -P "$MY_PORT" -u root --batch --skip-column-names -e "$1"; }
for _ in $(seq 100); do my_ "SELECT 1" >/dev/null 2>&1 && break; sleep 0.1; done
my_ "CREATE DATABASE idemgate"

# ---------------------------------------------------------------------------- idemgates
# start_idem NAME STORE-YAML: an idemgate on CPU 1 with that store; sets URL_<NAME>, PID_<NAME>.
start_idem() {
    local name=$1 store=$2 port admin
    free_port port
    free_port admin
    sed -e "s/127.0.0.1:$IDEMGATE_PORT\$/127.0.0.1:$port/" -e "s/127.0.0.1:$ADMIN_PORT\$/127.0.0.1:$admin/" \
        -e "/^store:/,/^routes:/c\\store:\\n$store\\nroutes:" "$WORK/idemgate-memory.yaml" >"$WORK/idemgate-$name.yaml"
    env IDEMGATE_LOG=warn "${PRIO[@]}" taskset -c 1 "$IDEMGATE" run --config "$WORK/idemgate-$name.yaml" \
        >"$WORK/idemgate-$name.log" 2>&1 &
    PIDS+=($!)
    printf -v "PID_$name" '%s' $!
    printf -v "URL_$name" '%s' "http://127.0.0.1:$port"
    for _ in $(seq 100); do curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null && return; sleep 0.1; done
    die "idemgate $name not ready; see $WORK/idemgate-$name.log"
}
start_idem redis "  redis: { url: \"redis://127.0.0.1:$REDIS_PORT\" }"
start_idem pg "  postgres: { url: \"postgres://idemgate@127.0.0.1:$PG_PORT/sync_on\", max_connections: 32 }"
start_idem pgoff "  postgres: { url: \"postgres://idemgate@127.0.0.1:$PG_PORT/sync_off\", max_connections: 32 }"
start_idem my "  mysql: { url: \"mysql://root@127.0.0.1:$MY_PORT/idemgate\", max_connections: 32 }"

# ---------------------------------------------------------------------------- measuring
ticks_of() { # CPU ticks of these pids and their children (PostgreSQL: one process per connection)
    local pids=("$@") p all=()
    for p in "${pids[@]}"; do all+=("$p") && all+=($(pgrep -P "$p" || true)); done
    # A process may end meanwhile (PostgreSQL's autovacuum workers come and go).
    for p in "${all[@]}"; do { sed 's/.*) //' "/proc/$p/stat" 2>/dev/null || true; } | awk '{print $12 + $13}'; done |
        awk '{ s += $1 } END { print s + 0 }'
}
declare -A REQ US PT DT P50 P99 ERR DESC
ROWS=()
# row ID "description" URL IDEM-PID DB-PID MODE PREFIX N [SETUP-COMMAND]
row() {
    local id=$1 desc=$2 url=$3 idem=$4 db=$5 mode=$6 prefix=$7 n=$8 out result
    [[ -z ${9:-} ]] || eval "$9"
    [[ -n ${REQ[$id]:-} ]] || { ROWS+=("$id"); DESC[$id]=$desc; REQ[$id]=0; US[$id]=0; PT[$id]=0; DT[$id]=0; ERR[$id]=0; }
    local p0 d0 p1 d1
    p0=$(ticks_of "$idem"); d0=$(ticks_of "$db")
    out=$("${PRIO[@]}" taskset -c 0 wrk -t1 -c"$CONNS" -d"${SLICE}s" --timeout 5s -s "$HERE/post.lua" \
        "$url/orders" -- "$mode" "$prefix" "$n")
    p1=$(ticks_of "$idem"); d1=$(ticks_of "$db")
    result=$(grep '^RESULT' <<<"$out") || die "wrk printed no RESULT line: $out"
    read -r r d e p50 p99 < <(sed -E 's/.* requests=([0-9]+) duration_us=([0-9]+) connect=([0-9]+) read=([0-9]+) write=([0-9]+) status=([0-9]+) timeout=([0-9]+) p50_us=([0-9]+) p99_us=([0-9]+)/\1 \2 \3+\4+\5+\6+\7 \8 \9/' <<<"$result")
    REQ[$id]=$((REQ[$id] + r)); US[$id]=$((US[$id] + d)); ERR[$id]=$((ERR[$id] + e))
    PT[$id]=$((PT[$id] + p1 - p0)); DT[$id]=$((DT[$id] + d1 - d0))
    P50[$id]="${P50[$id]:-}${P50[$id]:+ }$p50"; P99[$id]="${P99[$id]:-}${P99[$id]:+ }$p99"
    log "$id: $((r * 1000000 / d)) req/s, errors $((e))"
}
flush() { my_ "SET GLOBAL innodb_flush_log_at_trx_commit = $1"; }

# Warm-up: connections opened, statements prepared, the tables created; replay keys stored.
for name in redis pg pgoff my; do
    url=URL_$name
    "${PRIO[@]}" taskset -c 0 wrk -t1 -c"$CONNS" -d2s -s "$HERE/post.lua" "${!url}/orders" -- replay "w$name" 1000 >/dev/null
done
for ((ROUND = 1; ROUND <= ROUNDS; ROUND++)); do
    log "round $ROUND of $ROUNDS (slices of ${SLICE}s)"
    row f "first-seen, Redis 7.0 (no persistence)" "$URL_redis" "$PID_redis" "$REDIS" unique "f$ROUND" 0
    row fr "replays, Redis 7.0 (1,000 keys)" "$URL_redis" "$PID_redis" "$REDIS" replay wredis 1000
    row p "first-seen, PostgreSQL, synchronous_commit on" "$URL_pg" "$PID_pg" "$PG_MASTER" unique "p$ROUND" 0
    row pa "first-seen, PostgreSQL, **synchronous_commit off**" "$URL_pgoff" "$PID_pgoff" "$PG_MASTER" unique "pa$ROUND" 0
    row pr "replays, PostgreSQL (1,000 keys)" "$URL_pg" "$PID_pg" "$PG_MASTER" replay wpg 1000
    row m "first-seen, MariaDB, innodb_flush_log_at_trx_commit 1" "$URL_my" "$PID_my" "$MARIADB" unique "m$ROUND" 0 "flush 1"
    row ma "first-seen, MariaDB, **innodb_flush_log_at_trx_commit 2**" "$URL_my" "$PID_my" "$MARIADB" unique "ma$ROUND" 0 "flush 2"
    row mr "replays, MariaDB (1,000 keys)" "$URL_my" "$PID_my" "$MARIADB" replay wmy 1000 "flush 1"
done
STORED_PG=$(psql_ "SELECT count(*) FROM idemgate_keys" sync_on 2>/dev/null || echo "?")

# ---------------------------------------------------------------------------- report
median() { tr ' ' '\n' | sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : int((v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
{
    echo "# Load benchmark: the SQL stores"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); machine: $(lscpu | awk -F: '/^Model name/ {gsub(/^[ \t]+/, "", $2); print $2; exit}'), nproc $(nproc)"
    echo "- load on the machine before the run: $(uptime | sed 's/.*load average/load average/')"
    echo "- $("$PG_BIN/postgres" --version), $(mariadbd --version | awk '{print $2, $3}'), redis $(redis-server --version | sed -E 's/.*v=([^ ]+).*/\1/'); data on $(df -P "$DATA" | awk 'NR == 2 {print $1}') (fsync on, PostgreSQL's and MariaDB's defaults besides the rows' settings)"
    echo "- CPU 0: wrk -t1 -c$CONNS, the upstream nginx, the databases; CPU 1: the idemgates; $ROUNDS interleaved rounds of ${SLICE}s per row; POSTs of a 1 KiB JSON body with an \`Idempotency-Key\`"
    echo "- p50 / p99: wrk's, under full load (closed loop), median over the slices"
    echo
    echo "| row | what | req/s | idemgate CPU µs/req | store server CPU µs/req | p50 / p99 ms | errors |"
    echo "|---|---|---:|---:|---:|---:|---:|"
    for id in "${ROWS[@]}"; do
        r=${REQ[$id]}
        printf '| %s | %s | %.0f | %.1f | %.1f | %.1f / %.1f | %s |\n' "$id" "${DESC[$id]}" \
            "$(awk -v r="$r" -v d="${US[$id]}" 'BEGIN { print r / (d / 1e6) }')" \
            "$(awk -v t="${PT[$id]}" -v hz="$CLK_TCK" -v r="$r" 'BEGIN { print t / hz * 1e6 / r }')" \
            "$(awk -v t="${DT[$id]}" -v hz="$CLK_TCK" -v r="$r" 'BEGIN { print t / hz * 1e6 / r }')" \
            "$(median <<<"${P50[$id]}" | awk '{print $1 / 1000}')" "$(median <<<"${P99[$id]}" | awk '{print $1 / 1000}')" \
            "${ERR[$id]}"
    done
    echo
    echo "PostgreSQL rows stored in the synchronous_commit-on database: $STORED_PG."
    echo "Rows marked **bold** trade durability for speed: a crash of the database (not a clean"
    echo "restart) may lose the last acknowledged commits (PostgreSQL: up to 3 × wal_writer_delay;"
    echo "MariaDB: up to a second)."
} >"$RESULTS_SQL"
cat "$RESULTS_SQL"
log "written to $RESULTS_SQL"
