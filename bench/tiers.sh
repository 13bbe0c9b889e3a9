#!/usr/bin/env bash
# Start latency per tier next to each OCI runtime run by hand, and gVisor's cost inside.
# See bench/README.md.
#
#   bench/tiers.sh [--json]      (needs root and the runtimes: scripts/setup-ci.sh installs them)
#
# Environment: BENCH_N (measured iterations, default 20), KENNEL (the binary to measure).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
say() { echo "tiers.sh: $*" >&2; }
[[ $(id -u) -eq 0 ]] || { say "the oci tier needs root"; exit 2; }
# shellcheck source=bench/kennel.sh
. "$root/bench/kennel.sh"
# On a hybrid host (cgroup v1 with a cgroup2 mount beside it) crun run by hand refuses to
# start; the whole benchmark runs in a private mount namespace without that mount, as
# Kennel's launcher runs the runtimes. The host's mounts are untouched.
v2="$(awk '$9 == "cgroup2" {print $5; exit}' /proc/self/mountinfo)"
if [[ -n $v2 ]] && awk '$9 == "cgroup" {f=1} END {exit !f}' /proc/self/mountinfo; then
    exec unshare -m --propagation private -- /bin/sh -c \
        'umount -l "$0" && exec /usr/bin/python3 "$@"' "$v2" "$here/tiers.py" --kennel "$kennel" "$@"
fi
exec /usr/bin/python3 "$here/tiers.py" --kennel "$kennel" "$@"
