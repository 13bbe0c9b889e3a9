# Sourced by the bench scripts (with $root and say() set): picks the kennel binary to
# measure, $KENNEL or target/release/kennel, and builds the default one when it is missing or
# older than the sources.

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
        say "building kennel (cargo build --release -p kennel -p kennel-sandbox)"
        if ! command -v cargo >/dev/null; then
            say "cargo not found; cannot build $kennel"
            exit 2
        fi
        (cd "$root" && cargo build --release -p kennel -p kennel-sandbox >&2)
    elif [[ -e $kennel ]]; then
        say "warning: KENNEL=$kennel is older than the sources; measuring it anyway"
    else
        say "KENNEL=$kennel does not exist"
        exit 2
    fi
fi
