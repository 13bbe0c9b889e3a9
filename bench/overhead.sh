#!/usr/bin/env bash
# What the sandbox costs code that already runs: a ~2 s pure-python loop timed from inside,
# bare against `kennel run`, and a 1 GiB stdout flood (the supervisor's drain rate and peak
# RSS). Prints the change against bench/baselines/overhead.json and updates it (information
# only). See bench/README.md.
#
#   bench/overhead.sh [--json]
#
# Environment: BENCH_N (rounds, default 5), KENNEL (kennel binary, default
# target/release/kennel under the repo root).
set -euo pipefail

name=overhead help=2,10
# shellcheck source=bench/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
# shellcheck source=bench/kennel.sh
. "$root/bench/kennel.sh"   # sets $kennel, building it when it is missing or stale

exec "$PY" "$here/overhead.py" --kennel "$kennel" "${json[@]}"
