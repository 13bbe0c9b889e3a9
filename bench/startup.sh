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

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
PY=/usr/bin/python3

json=()
for arg in "$@"; do
    case "$arg" in
        --json) json=(--json) ;;
        -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "startup.sh: unknown argument: $arg (try --help)" >&2; exit 2 ;;
    esac
done

# Everything but the results goes to stderr, so `--json` output stays parseable.
say() { echo "startup.sh: $*" >&2; }

if [[ ! -x $PY ]]; then
    say "$PY is missing; it is both the harness and a measured program (apt-get install python3)"
    exit 2
fi

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
