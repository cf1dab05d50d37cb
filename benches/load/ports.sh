# Sourced by run.sh, allocators.sh and instructions.sh: free loopback ports, the config
# templates they are filled into, and waiting until a started process listens on one.
#
# Ports are probed upwards from `next_port` (each script seeds it from PORT_BASE), below
# the kernel's ephemeral range (ip_local_port_range, 32768+ by default): a port in it can
# be free now and taken minutes later as the local port of some outgoing connection.
# Others' tests may hold fixed ports, hence the probe.

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# wait_port PORT PID: returns once something listens on PORT; dies (the sourcing script's
# `die`) if PID exits first or after 20 s (a proxy under valgrind takes seconds to start).
wait_port() {
    local port=$1 pid=$2
    for _ in $(seq 200); do
        kill -0 "$pid" 2>/dev/null || die "process $pid (port $port) exited; see $WORK"
        port_free "$port" || return 0
        sleep 0.1
    done
    die "nothing listens on 127.0.0.1:$port after 20 s"
}

# free_port VAR: sets VAR to the next free port.
free_port() {
    while ! port_free "$next_port"; do next_port=$((next_port + 1)); done
    printf -v "$1" '%s' "$next_port"
    next_port=$((next_port + 1))
}

# fill_templates DIR TEMPLATE...: copies each template from $HERE into DIR with
# @UPSTREAM_PORT@, @NGINX_PORT@, @NGINX_FWD_PORT@, @IDEMGATE_PORT@, @ADMIN_PORT@ and
# @REDIS_PORT@ replaced by the variables of those names (a port the script did not pick is
# left as it is).
fill_templates() {
    local dir=$1 name template
    local edits=(-e '')
    shift
    for name in UPSTREAM_PORT NGINX_PORT NGINX_FWD_PORT IDEMGATE_PORT ADMIN_PORT REDIS_PORT; do
        [[ -n ${!name:-} ]] && edits+=(-e "s/@$name@/${!name}/g")
    done
    for template in "$@"; do
        sed "${edits[@]}" "$HERE/$template" >"$dir/$template"
    done
}
