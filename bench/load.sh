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

name=load help=2,13
# shellcheck source=bench/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"

pool="${BENCH_POOL:-4}"
if ! [[ $pool =~ ^[1-9][0-9]*$ ]]; then
    say "BENCH_POOL must be a positive integer, not '$pool'"
    exit 2
fi

# --- Kennel ------------------------------------------------------------------------------
# shellcheck source=bench/kennel.sh
. "$root/bench/kennel.sh"   # sets $kennel, building it when it is missing or stale

# --- The server --------------------------------------------------------------------------
# shellcheck source=bench/serve.sh
. "$here/serve.sh"   # $tmp, serve_start and serve_measure; stops the server on exit

# Port 0: the kernel picks a free port, and the server logs the address it bound.
serve_start <<EOF
# Written by bench/load.sh.
listen = "127.0.0.1:0"
# Well above the 32 clients of the busiest level, so 429s mean something is wrong.
max_concurrent = 64

[pool]
python = $pool
# Off, so the memory figures and the refill work are the python pool's alone.
bash = 0
EOF
say "kennel serve (pid $server_pid) listening on $url, pool python=$pool"

status=0
# In the background and waited for, so that a signal to this script runs the cleanup at once.
serve_measure "$PY" "$here/load.py" --url "$url" --server-pid "$server_pid" --pool "$pool" --kennel "$kennel" \
    "${json[@]}" || status=$?
exit "$status"
