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
clones=1
extra_config=$'max_concurrent = 4'
# shellcheck source=bench/session-tiers.sh
. "$here/session-tiers.sh"
