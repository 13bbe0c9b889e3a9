#!/usr/bin/env bash
# Pause and resume of a 512 MiB session per tier (issue 31): the pause's time and state size,
# the resume to the first exec answered beside a new session's start to its first exec (in the
# microvm tier, a clone-pool restore), and the verification of a saved state, apart. See
# bench/README.md.
#
#   bench/pause.sh [--json]       (needs root; BENCH_TIERS=native,microvm prepares the guest)
#
# Environment: BENCH_N (rounds per tier, default 3), BENCH_TIERS (a comma list of native,
# crun, runsc, microvm; default native,microvm), KENNEL_STATE_DIR (default
# /var/cache/kennel-tests/state), KENNEL. Exits non-zero only when it cannot measure.
set -euo pipefail
name=pause help=2,11
# shellcheck source=bench/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
[[ $(id -u) -eq 0 ]] || { say "sessions' cgroups and the microvm tier need root"; exit 2; }
tiers="${BENCH_TIERS:-native,microvm}"
export KENNEL_STATE_DIR="${KENNEL_STATE_DIR:-/var/cache/kennel-tests/state}"
# shellcheck source=bench/kennel.sh
. "$root/bench/kennel.sh"
microvm_pool=""
if [[ ,$tiers, == *,microvm,* ]]; then
    say "preparing the guest in $KENNEL_STATE_DIR/vm (kennel vm prepare; once per machine)"
    "$kennel" vm prepare >&2
    microvm_pool="microvm = { microvm-base = 1 }"
fi
# shellcheck source=bench/serve.sh
. "$here/serve.sh"
# Not under /tmp: the microvm tier's sandboxes build their roots there.
export KENNEL_SESSIONS_DIR="/var/tmp/kennel-bench-pause-$$"
after_server() { rm -rf "$KENNEL_SESSIONS_DIR"; }
serve_start <<EOF2
# Written by bench/pause.sh.
listen = "127.0.0.1:0"
max_concurrent = 4
[pool]
python = 0
bash = 0
$microvm_pool
EOF2
if [[ -n $microvm_pool ]]; then
    say "waiting for the pool's clone"
    for _ in $(seq 1 600); do
        curl -s "$url/healthz" | grep -q '"microvm-base":1' && break
        sleep 1
    done
fi
status=0
serve_measure "$PY" "$here/pause.py" --url "$url" --tiers "$tiers" --rounds "${BENCH_N:-3}" \
    "${json[@]}" || status=$?
exit "$status"
