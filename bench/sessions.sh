#!/usr/bin/env bash
# Sessions on every tier: `POST /v1/sessions` create time and an idle session's PSS, per tier
# (native, runsc, crun, docker, microvm served by the pool and not), each beside an anchor
# measured in the same run: a cold `python3 -c pass` run in that tier, and that tier's idle
# pooled sandbox (or the native one where a tier has no pool). See bench/README.md.
#
#   bench/sessions.sh [--json]    (needs root; prepares the guest: kennel vm prepare; starts a
#                                  private Docker Engine as bench/docker.sh does)
#
# Environment: BENCH_N (measured rounds, default 10), BENCH_WARMUP (default 1), BENCH_SETTLE
# (seconds an idle session sits before its PSS is read, default 1), BENCH_POOL (microvm-base
# clones, default 1), BENCH_UNPOOLED_MEMORY (the memory limit of the microvm session no clone
# serves, default 640M), BENCH_TIERS (a comma list of native,runsc,crun,docker,microvm; default
# all), KENNEL_STATE_DIR (default /var/cache/kennel-tests/state), BENCH_DOCKER_ROOT (the
# engine's data root, default the tests'), KENNEL. Exits non-zero only when it cannot measure.
set -euo pipefail
name=sessions help=2,15
# shellcheck source=bench/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
[[ $(id -u) -eq 0 ]] || { say "runsc, crun, a Docker Engine and the microvm tier need root"; exit 2; }
pool="${BENCH_POOL:-1}"
[[ $pool =~ ^[1-9][0-9]*$ ]] || { say "BENCH_POOL must be a positive integer, not '$pool'"; exit 2; }
tiers="${BENCH_TIERS:-native,runsc,crun,docker,microvm}"
clones=$pool
# shellcheck source=bench/guest.sh
. "$here/guest.sh"

if [[ ,$tiers, == *,docker,* ]]; then
    # shellcheck source=bench/dockerd.sh
    . "$here/dockerd.sh"
    trap dockerd_stop EXIT
    dockerd_start
    # From here serve.sh's cleanup stops the server, whose docker sessions go first, then this.
    after_server() { dockerd_stop; }
fi
# shellcheck source=bench/serve.sh
. "$here/serve.sh"
# The python pool is the native anchor of idle memory; nothing takes from it (argv runs and
# sessions never do), so it never refills under a figure.
serve_start <<EOF2
# Written by bench/sessions.sh.
listen = "127.0.0.1:0"
max_concurrent = 8
[pool]
python = 1
bash = 0
$microvm_pool
EOF2
say "kennel serve (pid $server_pid) on $url, tiers $tiers"
status=0
serve_measure "$PY" "$here/sessions.py" --url "$url" --server-pid "$server_pid" --pool "$pool" \
    --tiers "$tiers" "${json[@]}" || status=$?
exit "$status"
