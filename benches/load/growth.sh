#!/usr/bin/env bash
# Tail latency of first-seen requests while the memory store grows through a doubling of
# its shards' hash tables, against the same load where no table grows.
#
#   bash benches/load/growth.sh          # about 3 minutes once built; needs run.sh's tools
#
# For each starting size in SIZES a fresh idemgate (memory store, on CPU 1) is filled with
# that many keys by wrk (on CPU 0), then oha sends first-seen POSTs (1 KiB JSON, random
# fingerprint-route paths) at 5,000 req/s for LSECS seconds, open loop with latency
# correction, and the script prints p50, p99, p99.9 and the slowest request. The default
# sizes put 50,000 new keys just across 1,835,008 keys (where tables of 2^15 or 2^17
# buckets per shard fill to 7/8 and double, with 64 or 16 shards) and well below it. Each
# size runs ROUNDS times, alternating. Loopback only.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
SIZES=${SIZES:-"1800000 1700000"}
ROUNDS=${ROUNDS:-2}
LSECS=${LSECS:-10}
IDEMGATE=${IDEMGATE:-$ROOT/target/release/idemgate}
export PATH="$HOME/.cargo/bin:$PATH:/usr/sbin:/sbin"
log() { printf '%s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
for tool in wrk nginx oha jq curl; do
    command -v $tool >/dev/null || die "$tool missing: bash benches/load/run.sh installs it"
done
[[ -x $IDEMGATE ]] || die "build first: cargo build --release --bin idemgate"
# shellcheck source=rig.sh
source "$HERE/rig.sh"
start_rig growth 21380
printf '{"a":"%01000d"}' 0 >"$WORK/body.json"

printf '| keys before | keys after | p50 µs | p99 µs | p99.9 µs | slowest µs |\n|---:|---:|---:|---:|---:|---:|\n'
for ((round = 1; round <= ROUNDS; round++)); do
    for size in $SIZES; do
        env IDEMGATE_LOG=warn "${PRIO[@]}" taskset -c 1 "$IDEMGATE" run --config "$WORK/idemgate-memory.yaml" >"$WORK/idemgate.log" 2>&1 &
        id=$!
        PIDS+=("$id")
        wait_port "$IDEMGATE_PORT" "$id"
        fill_store "g$round" "$size" >/dev/null
        before=$(entries)
        "${PRIO[@]}" taskset -c 0 oha --no-tui --output-format json -c 64 -q 5000 --latency-correction \
            --wait-ongoing-requests-after-deadline -z "${LSECS}s" -m POST -H 'Content-Type: application/json' \
            -D "$WORK/body.json" --rand-regex-url "http://127.0.0.1:$IDEMGATE_PORT/fp/[a-z]{16}" >"$WORK/oha.json"
        jq -r --arg b "$before" --arg a "$(entries)" \
            '"| \($b) | \($a) | \(.latencyPercentiles.p50 * 1e6 | round) | \(.latencyPercentiles.p99 * 1e6 | round) | \(.latencyPercentiles["p99.9"] * 1e6 | round) | \(.summary.slowest * 1e6 | round) |"' "$WORK/oha.json"
        kill -TERM "$id"
        wait "$id" || true
    done
done
