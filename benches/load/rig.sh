# Sourced by ab.sh, allocators.sh, growth.sh and sql.sh: the rig they run on. Sets PRIO
# (SCHED_FIFO as root, so other work on the machine cannot delay the rig's wake-ups), a work directory
# removed at exit with every process in PIDS stopped, free ports (UPSTREAM_PORT,
# IDEMGATE_PORT, ADMIN_PORT, probed from PORT_BASE or the caller's default), the memory-store
# config filled in, and the upstream nginx (`return 201`) running on CPU 0.
#
#   start_rig NAME DEFAULT_PORT_BASE
#   fill_store PREFIX N [MAX_SECS]   # store N first-seen keys; wrk's output on stdout
#   entries                          # the idemgate's stored keys, from /metrics

start_rig() {
    PRIO=()
    [[ $(id -u) -eq 0 ]] && PRIO=(chrt -f 10)
    WORK=$(mktemp -d "/tmp/idemgate-$1.XXXXXX")
    PIDS=()
    trap stop_rig EXIT
    trap 'exit 130' INT TERM
    # shellcheck source=ports.sh
    source "$HERE/ports.sh"
    next_port=${PORT_BASE:-$2}
    free_port UPSTREAM_PORT
    free_port IDEMGATE_PORT
    free_port ADMIN_PORT
    fill_templates "$WORK" nginx-upstream.conf idemgate-memory.yaml
    mkdir -p "$WORK/nginx/tmp"
    "${PRIO[@]}" taskset -c 0 nginx -p "$WORK/nginx/" -c "$WORK/nginx-upstream.conf" -e "$WORK/nginx/error.log" >/dev/null 2>&1 &
    PIDS+=($!)
}

fill_store() {
    local out=$WORK/fill-wrk.out wrk_pid
    "${PRIO[@]}" taskset -c 0 wrk -t1 -c64 -d"${3:-600}s" -s "$HERE/post.lua" "http://127.0.0.1:$IDEMGATE_PORT/orders" -- fill "$1" "$2" >"$out" &
    wrk_pid=$!
    # post.lua's fill stops its thread once its keys are stored; wrk then waits for its
    # duration, so it is interrupted as soon as the thread is gone.
    sleep 0.5
    while [[ $(ls "/proc/$wrk_pid/task" 2>/dev/null | wc -l) -gt 1 ]]; do sleep 0.05; done
    kill -INT "$wrk_pid" 2>/dev/null || true
    wait "$wrk_pid" || true
    cat "$out"
}

entries() { curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" | awk '$1 == "idemgate_store_entries" {print $2}'; }

stop_rig() {
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$WORK"
}
