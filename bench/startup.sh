#!/usr/bin/env bash
# Start-latency benchmark: bare vs bubblewrap vs `kennel run`, for /bin/true and
# `/usr/bin/python3 -c pass`, measured interleaved in one run. See bench/README.md.
#
#   bench/startup.sh [--json]
#
# Environment: BENCH_N (measured iterations, default 50), BENCH_WARMUP (warm-up rounds,
# default 3), KENNEL (kennel binary, default target/release/kennel under the repo root).
# Exits 0 whether or not targets are met; non-zero only when it cannot measure.
set -euo pipefail

name=startup help=2,9
# shellcheck source=bench/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"

# --- Kennel ------------------------------------------------------------------------------
# shellcheck source=bench/kennel.sh
. "$root/bench/kennel.sh"   # sets $kennel, building it when it is missing or stale

# --- bubblewrap --------------------------------------------------------------------------
skip=()
bwrap="$(command -v bwrap || true)"
if [[ -z $bwrap ]]; then
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
        say "bwrap not found; installing bubblewrap with apt-get"
        export DEBIAN_FRONTEND=noninteractive
        if apt-get update -qq >&2 && apt-get install -y -qq bubblewrap >&2; then
            bwrap="$(command -v bwrap || true)"
        fi
    fi
    if [[ -z $bwrap ]]; then
        why="bubblewrap is not installed and could not be installed (needs root and apt-get)"
        say "SKIPPING the bwrap variants: $why"
        skip=(--skip-note "bwrap=$why")
    fi
fi

args=(--kennel "$kennel" "${skip[@]}" "${json[@]}")
if [[ -n $bwrap ]]; then
    args+=(--bwrap "$bwrap")
else
    args+=(--bwrap "")
fi
exec "$PY" "$here/startup.py" "${args[@]}"
