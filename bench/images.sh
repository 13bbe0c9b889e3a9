#!/usr/bin/env bash
# Image benchmark for `kennel serve`: the warm pool of the image python-data, sustained at a
# fixed rate, against cold runs of the same code through the same server and through
# `kennel run`, in one run. See bench/README.md.
#
#   bench/images.sh [--json]
#
# Environment: BENCH_RATE (pooled runs per second, default 2), BENCH_DURATION (seconds of
# sustained pooled runs, default 60), BENCH_POOL (warm sandboxes of the image, default 2),
# BENCH_N (sequential runs on a full, settled pool, default 10), BENCH_COLD_N (cold runs
# through the server, default 10), BENCH_CLI_N (cold `kennel run`s, default 5), BENCH_PAUSE
# (settle time after a refill, default 1 s), KENNEL_STATE_DIR (the image store's state
# directory, default /var/cache/kennel-tests/state), KENNEL (binary).
# Exits 0 whether or not targets are met; non-zero only when it cannot measure.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
PY=/usr/bin/python3
image=python-data

json=()
for arg in "$@"; do
    case "$arg" in
        --json) json=(--json) ;;
        -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "images.sh: unknown argument: $arg (try --help)" >&2; exit 2 ;;
    esac
done

# Everything but the results goes to stderr, so `--json` output stays parseable.
say() { echo "images.sh: $*" >&2; }

if [[ ! -x $PY ]]; then
    say "$PY is missing; it runs the load generator (apt-get install python3)"
    exit 2
fi

pool="${BENCH_POOL:-2}"
if ! [[ $pool =~ ^[1-9][0-9]*$ ]]; then
    say "BENCH_POOL must be a positive integer, not '$pool'"
    exit 2
fi

# The image store the server and the CLI both read: the test suites' store by default, where
# the image is usually built already.
export KENNEL_STATE_DIR="${KENNEL_STATE_DIR:-/var/cache/kennel-tests/state}"

# --- Kennel ------------------------------------------------------------------------------
# shellcheck source=bench/kennel.sh
. "$root/bench/kennel.sh"   # sets $kennel, building it when it is missing or stale

# --- The image ---------------------------------------------------------------------------
if ! listing="$("$kennel" image ls 2>&1)"; then
    say "kennel image ls failed (KENNEL_STATE_DIR=$KENNEL_STATE_DIR): $listing"
    exit 2
fi
if ! grep -q "^$image " <<<"$listing"; then
    if [[ $(id -u) -ne 0 ]]; then
        say "the image $image is not in $KENNEL_STATE_DIR/images, and building it needs root"
        exit 2
    fi
    say "the image $image is not in $KENNEL_STATE_DIR/images; building it first (about a minute:"
    say "  $kennel image build $image -f images/$image.toml)"
    if ! (cd "$root" && "$kennel" image build "$image" -f "images/$image.toml" >&2); then
        say "building the image $image failed; nothing measured"
        exit 2
    fi
fi

# --- The server --------------------------------------------------------------------------
tmp="$(mktemp -d "${TMPDIR:-/tmp}/kennel-images.XXXXXX")"
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
# Written by bench/images.sh.
listen = "127.0.0.1:0"
# Far above what 2 runs/s keep in flight, so 429s mean something is wrong.
max_concurrent = 64
# One line per run, with whether the pool served it and the server's own time for it.
audit_log = "$tmp/audit.jsonl"

[pool]
# Off, so the refill work and the CPU figures are the image pool's alone.
python = 0
bash = 0
images = { $image = $pool }
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
say "kennel serve (pid $server_pid) listening on $url, pool images.$image=$pool, store $KENNEL_STATE_DIR"

# In the background and waited for, so that a signal to this script runs the cleanup at once.
"$PY" "$here/images.py" --url "$url" --server-pid "$server_pid" --image "$image" --pool "$pool" \
    --kennel "$kennel" --audit-log "$tmp/audit.jsonl" "${json[@]}" &
load_pid=$!
status=0
wait "$load_pid" || status=$?
load_pid=""
if [[ $status -ne 0 ]]; then
    say "images.py failed (exit status $status); the server's log:"
    tail -n 40 "$tmp/server.log" >&2
fi
stop_server
exit "$status"
