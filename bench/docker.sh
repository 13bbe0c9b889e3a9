#!/usr/bin/env bash
# Start latency of the docker runtime next to the docker CLI on the same engine, with
# `kennel run --runtime runc` for reference, measured interleaved in one run, against a private
# Docker Engine this script starts (as the tests do) and stops. See bench/README.md.
#
#   bench/docker.sh [--json]      (needs root and Debian's docker.io: scripts/setup-ci.sh)
#
# Environment: BENCH_N (measured iterations, default 20), BENCH_WARMUP (default 2), KENNEL
# (the binary to measure), BENCH_DOCKER_ROOT (the engine's data root, default the tests').
# Exits non-zero only when it cannot measure.
set -euo pipefail
name=docker help=2,10
# shellcheck source=bench/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
[[ $(id -u) -eq 0 ]] || { say "a Docker Engine needs root"; exit 2; }
# shellcheck source=bench/kennel.sh
. "$root/bench/kennel.sh"
# shellcheck source=bench/dockerd.sh
. "$here/dockerd.sh"

bench_pid=""
cleanup() {
    [[ -z $bench_pid ]] || stop_pid "$bench_pid" 10 docker.py
    dockerd_stop
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
dockerd_start

# In the background and waited for, so that a signal to this script runs the cleanup at once.
status=0
"$PY" "$here/docker.py" --kennel "$kennel" --docker "$docker" "${json[@]}" &
bench_pid=$!
wait "$bench_pid" || status=$?
bench_pid=""
exit "$status"
