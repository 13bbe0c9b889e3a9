#!/usr/bin/env bash
# Cost of watching: `kennel run` with the seccomp listener on (the default), on without the
# exec log (`layers.exec_log = false`) and off
# (`layers.watch = false`), side by side with bare runs, for a start (/bin/true), a
# syscall-heavy program (100k stat calls in python) and an exec-heavy one (200 execs of
# /bin/true from sh), measured interleaved in one run. See bench/README.md.
#
#   bench/watch.sh [--json]
#
# Environment: BENCH_N (measured iterations, default 20), KENNEL (kennel binary, default
# target/release/kennel under the repo root). Exits 0 whether or not targets are met.
set -euo pipefail

name=watch help=2,12
# shellcheck source=bench/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
# shellcheck source=bench/kennel.sh
. "$root/bench/kennel.sh"   # sets $kennel, building it when it is missing or stale

exec "$PY" "$here/watch.py" --kennel "$kennel" "${json[@]}"
