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
default_kennel="$root/target/release/kennel"
kennel="${KENNEL:-$default_kennel}"
[[ $kennel == /* ]] || kennel="$root/$kennel"

stale() {
    # Missing, or older than any source that goes into the binary.
    [[ ! -e $1 ]] && return 0
    local newer
    newer="$(find "$root/Cargo.toml" "$root/Cargo.lock" "$root"/crates/*/Cargo.toml \
        "$root"/crates/*/build.rs "$root"/crates/*/src -newer "$1" -print -quit 2>/dev/null || true)"
    [[ -n $newer ]]
}

if stale "$kennel"; then
    if [[ $kennel == "$default_kennel" ]]; then
        say "building kennel (cargo build --release -p kennel)"
        if ! command -v cargo >/dev/null; then
            say "cargo not found; cannot build $kennel"
            exit 2
        fi
        (cd "$root" && cargo build --release -p kennel >&2)
    elif [[ -e $kennel ]]; then
        say "warning: KENNEL=$kennel is older than the sources; measuring it anyway"
    else
        say "KENNEL=$kennel does not exist"
        exit 2
    fi
fi

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
