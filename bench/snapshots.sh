#!/usr/bin/env bash
# Snapshots and forks of a 512 MiB session per tier (issue 32): a snapshot's time and size
# beside a pause of the same session; a fork of 5 from it until all 5 have answered an exec,
# beside 5 sessions started cold at once (and, in the microvm tier, 5 clone-pool restores).
# See bench/README.md.
#
#   bench/snapshots.sh [--json]   (needs root; BENCH_TIERS=native,microvm prepares the guest)
#
# Environment: BENCH_N (rounds per tier, default 3), BENCH_TIERS (a comma list of native,
# crun, runsc, microvm; default native,microvm), KENNEL_STATE_DIR (default
# /var/cache/kennel-tests/state), KENNEL. Exits non-zero only when it cannot measure.
set -euo pipefail
name=snapshots help=2,11
# shellcheck source=bench/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
clones=5
extra_config=$'max_concurrent = 8\n[sessions]\nmax_sessions = 32'
# shellcheck source=bench/session-tiers.sh
. "$here/session-tiers.sh"
