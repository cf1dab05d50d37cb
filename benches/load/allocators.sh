#!/usr/bin/env bash
# Memory store under three allocators, same binary: glibc malloc (the default), jemalloc
# and mimalloc (Debian's libjemalloc2 / libmimalloc2.0, swapped in with LD_PRELOAD, which
# works because idemgate uses the system allocator). For each: replay and first-seen
# throughput, then RSS per key over a fill of FILL_KEYS (1,000,000) keys and replays spread
# over them. Same pinning and scheduling as run.sh; loopback only; about 4 minutes.
#
# This is how mimalloc was chosen. Since then the binary has linked mimalloc
# as its global allocator (src/main.rs), so a preloaded malloc reaches only what C code
# allocates: to compare allocators again, build a binary without `#[global_allocator]`.
#
#   bash benches/load/allocators.sh
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
FILL_KEYS=${FILL_KEYS:-1000000}
IDEMGATE=$ROOT/target/release/idemgate
[[ -x $IDEMGATE ]] || { echo "build first: cargo build --release --bin idemgate" >&2; exit 1; }
LIBDIR=/usr/lib/x86_64-linux-gnu
if [[ ! -e $LIBDIR/libjemalloc.so.2 || ! -e $LIBDIR/libmimalloc.so.2 ]]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libjemalloc2 libmimalloc2.0 >/dev/null
fi
# shellcheck source=rig.sh
source "$HERE/rig.sh"
start_rig alloc 21180

rss() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
# rate MODE PREFIX SECONDS N: requests per second of one wrk run
rate() {
    "${PRIO[@]}" taskset -c 0 wrk -t1 -c64 -d"$3s" -s "$HERE/post.lua" "http://127.0.0.1:$IDEMGATE_PORT/orders" -- "$1" "$2" "$4" |
        sed -nE 's/^RESULT requests=([0-9]+) duration_us=([0-9]+).*/\1 \2/p' | awk '{printf "%.0f", $1 / ($2 / 1e6)}'
}

printf '| allocator | replays, 1,000 keys | first-seen | fill to %s keys | replays over the filled keys | RSS per stored key |\n' "$FILL_KEYS"
printf '|---|---:|---:|---:|---:|---:|\n'
for variant in glibc "jemalloc:LD_PRELOAD=$LIBDIR/libjemalloc.so.2" "mimalloc:LD_PRELOAD=$LIBDIR/libmimalloc.so.2"; do
    name=${variant%%:*}
    preload=()
    [[ $variant == *:* ]] && preload=("${variant#*:}")
    env IDEMGATE_LOG=warn "${preload[@]}" "${PRIO[@]}" taskset -c 1 "$IDEMGATE" run --config "$WORK/idemgate-memory.yaml" >"$WORK/idemgate.log" 2>&1 &
    id=$!
    PIDS+=("$id")
    for _ in $(seq 100); do curl -sf "http://127.0.0.1:$ADMIN_PORT/healthz" >/dev/null && break; sleep 0.1; done
    rate replay r 2 1000 >/dev/null
    replay=$(rate replay r 5 1000)
    first=$(rate unique d 5 0)
    e0=$(entries)
    m0=$(rss "$id")
    fill_store f "$FILL_KEYS" 240 >"$WORK/fill.out"
    sleep 1
    e1=$(entries)
    m1=$(rss "$id")
    fill=$(sed -nE 's/^RESULT requests=([0-9]+) duration_us=([0-9]+).*/\1 \2/p' "$WORK/fill.out" | awk '{printf "%.0f", $1 / ($2 / 1e6)}')
    spread=$(rate replay f 5 "$FILL_KEYS")
    printf '| %s | %s | %s | %s | %s | %s B |\n' "$name" "$replay" "$first" "$fill" "$spread" $(((m1 - m0) * 1024 / (e1 - e0)))
    kill -TERM "$id"
    wait "$id" || true
done
