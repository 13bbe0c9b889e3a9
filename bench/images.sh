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

name=images help=2,14
# shellcheck source=bench/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
image=python-data

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
# shellcheck source=bench/serve.sh
. "$here/serve.sh"   # $tmp, serve_start and serve_measure; stops the server on exit

# Port 0: the kernel picks a free port, and the server logs the address it bound.
serve_start <<EOF
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
say "kennel serve (pid $server_pid) listening on $url, pool images.$image=$pool, store $KENNEL_STATE_DIR"

status=0
# In the background and waited for, so that a signal to this script runs the cleanup at once.
serve_measure "$PY" "$here/images.py" --url "$url" --server-pid "$server_pid" --image "$image" --pool "$pool" \
    --kennel "$kennel" --audit-log "$tmp/audit.jsonl" "${json[@]}" || status=$?
exit "$status"
