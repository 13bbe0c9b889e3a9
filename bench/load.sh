#!/usr/bin/env bash
# Load benchmark for `kennel serve`: pool and cold run latency, throughput at 1/8/32 clients,
# session exec latency and memory, against a server this script starts and stops. See
# bench/README.md.
#
#   bench/load.sh [--json]
#
# Environment: BENCH_POOL (pooled python sandboxes, default 4), BENCH_N (sequential runs per
# latency variant, default 60), BENCH_WARMUP (default 3), BENCH_DURATION (seconds per
# throughput level, default 10), BENCH_CLIENTS (default 1,8,32), BENCH_EXECS (session execs,
# default 100), BENCH_PAUSE (settle time after a refill, default 0.2 s), KENNEL (binary).
# Exits 0 whether or not targets are met; non-zero only when it cannot measure.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
PY=/usr/bin/python3

json=()
for arg in "$@"; do
    case "$arg" in
        --json) json=(--json) ;;
        -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "load.sh: unknown argument: $arg (try --help)" >&2; exit 2 ;;
    esac
done

# Everything but the results goes to stderr, so `--json` output stays parseable.
say() { echo "load.sh: $*" >&2; }

if [[ ! -x $PY ]]; then
    say "$PY is missing; it runs the load generator and is a measured program (apt-get install python3)"
    exit 2
fi

pool="${BENCH_POOL:-4}"
if ! [[ $pool =~ ^[1-9][0-9]*$ ]]; then
    say "BENCH_POOL must be a positive integer, not '$pool'"
    exit 2
fi

# --- Kennel ------------------------------------------------------------------------------
# shellcheck source=bench/kennel.sh
. "$root/bench/kennel.sh"   # sets $kennel, building it when it is missing or stale

# --- The server --------------------------------------------------------------------------
tmp="$(mktemp -d "${TMPDIR:-/tmp}/kennel-load.XXXXXX")"
server_pid=""
load_pid=""

stop_server() {
    # SIGTERM to the one process this script started; the server ends its sandboxes itself.
    # Only if it is still there after 30 s does it get SIGKILL.
    [[ -n $server_pid ]] || return 0
    if kill -0 "$server_pid" 2>/dev/null; then
        kill -TERM "$server_pid" 2>/dev/null || true
        local i
        for ((i = 0; i < 300; i++)); do
            kill -0 "$server_pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$server_pid" 2>/dev/null; then
            say "the server (pid $server_pid) did not stop within 30 s of SIGTERM; sending SIGKILL"
            kill -KILL "$server_pid" 2>/dev/null || true
        fi
    fi
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
}

cleanup() {
    # On a signal, the load generator may still be running: it is ours, end it first.
    if [[ -n $load_pid ]] && kill -0 "$load_pid" 2>/dev/null; then
        kill -TERM "$load_pid" 2>/dev/null || true
        wait "$load_pid" 2>/dev/null || true
    fi
    stop_server
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Port 0: the kernel picks a free port, and the server logs the address it bound.
cat >"$tmp/server.toml" <<EOF
# Written by bench/load.sh.
listen = "127.0.0.1:0"
# Well above the 32 clients of the busiest level, so 429s mean something is wrong.
max_concurrent = 64

[pool]
python = $pool
# Off, so the memory figures and the refill work are the python pool's alone.
bash = 0
EOF

"$kennel" serve --config "$tmp/server.toml" >"$tmp/server.log" 2>&1 &
server_pid=$!

url=""
for ((i = 0; i < 200; i++)); do
    if ! kill -0 "$server_pid" 2>/dev/null; then
        say "kennel serve exited before it listened; its log:"
        cat "$tmp/server.log" >&2
        exit 2
    fi
    url="$(sed -n 's/^kennel serve: listening on \(http:\/\/[0-9.:]*\).*/\1/p' "$tmp/server.log" | head -n 1)"
    [[ -n $url ]] && break
    sleep 0.05
done
if [[ -z $url ]]; then
    say "kennel serve did not report its address within 10 s; its log:"
    cat "$tmp/server.log" >&2
    exit 2
fi
say "kennel serve (pid $server_pid) listening on $url, pool python=$pool"

# In the background and waited for, so that a signal to this script runs the cleanup at once.
"$PY" "$here/load.py" --url "$url" --server-pid "$server_pid" --pool "$pool" --kennel "$kennel" \
    "${json[@]}" &
load_pid=$!
status=0
wait "$load_pid" || status=$?
load_pid=""
if [[ $status -ne 0 ]]; then
    say "load.py failed (exit status $status); the server's log:"
    tail -n 40 "$tmp/server.log" >&2
fi
stop_server
exit "$status"
