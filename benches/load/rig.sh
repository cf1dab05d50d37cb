# Sourced by allocators.sh and growth.sh: the rig both run on. Sets PRIO (SCHED_FIFO as
# root, so other work on the machine cannot delay the rig's wake-ups), a work directory
# removed at exit with every process in PIDS stopped, free ports (UPSTREAM_PORT,
# IDEMGATE_PORT, ADMIN_PORT, probed from PORT_BASE or the caller's default), the memory-store
# config filled in, and the upstream nginx (`return 201`) running on CPU 0.
#
#   start_rig NAME DEFAULT_PORT_BASE

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

stop_rig() {
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$WORK"
}
