#!/usr/bin/env bash
# Cold start of the microvm tier next to gVisor's `runsc run` of the same command, measured
# interleaved in one run. See bench/README.md.
#
#   bench/microvm.sh [--json]      (needs root; prepares the guest first: kennel vm prepare)
#
# Environment: BENCH_N (measured rounds, default 10), BENCH_WARMUP (default 1),
# KENNEL_STATE_DIR (the prepared guest's state, default /var/cache/kennel-tests/state), KENNEL
# (the binary to measure). Exits non-zero only when it cannot measure.
set -euo pipefail
name=microvm help=2,9
# shellcheck source=bench/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
[[ $(id -u) -eq 0 ]] || { say "the microvm tier and runsc need root"; exit 2; }
# shellcheck source=bench/kennel.sh
. "$root/bench/kennel.sh"
export KENNEL_STATE_DIR="${KENNEL_STATE_DIR:-/var/cache/kennel-tests/state}"
say "preparing the guest in $KENNEL_STATE_DIR/vm (kennel vm prepare; once per machine)"
"$kennel" vm prepare >&2
# runsc run by hand, as in tiers.sh: on a hybrid host the whole benchmark runs in a private
# mount namespace without the cgroup2 mount; the host's mounts are untouched.
v2="$(awk '$9 == "cgroup2" {print $5; exit}' /proc/self/mountinfo)"
if [[ -n $v2 ]] && awk '$9 == "cgroup" {f=1} END {exit !f}' /proc/self/mountinfo; then
    exec unshare -m --propagation private -- /bin/sh -c \
        'umount -l "$0" && exec /usr/bin/python3 "$@"' "$v2" "$here/microvm.py" --kennel "$kennel" "${json[@]}"
fi
exec "$PY" "$here/microvm.py" --kennel "$kennel" "${json[@]}"
