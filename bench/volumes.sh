#!/usr/bin/env bash
# A volume's write speed beside its anchor in the same run, per tier: writing and fsyncing
# 256 MiB (`dd ... conv=fsync`) to a volume mounted at /workspace/vol, against the same write
# to /workspace (the session's tmpfs), in one session of each tier (native: a loop device;
# microvm: the guest's virtio-blk disk). See bench/README.md.
#
#   bench/volumes.sh [--json]
#
# Environment: BENCH_N (rounds of each write, default 5), BENCH_MIB (MiB per write, default
# 256), BENCH_TIERS (native, microvm or both, the default), BENCH_STATE_PARENT (where the
# volumes and session records are kept, default /var/tmp), KENNEL_STATE_DIR (default
# /var/cache/kennel-tests/state: the guest), KENNEL (binary). Needs root (a volume is a loop
# device and an ext4 mount, or a disk QEMU opens) and mkfs.ext4. Exits 0 whether or not a
# figure is good; non-zero only when it cannot measure.
set -euo pipefail

name=volumes help=2,14
# shellcheck source=bench/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
[[ $(id -u) -eq 0 ]] || { say "volumes need root"; exit 2; }
tiers="${BENCH_TIERS:-native,microvm}"
clones=0
# shellcheck source=bench/guest.sh
. "$here/guest.sh"   # $kennel, the guest prepared when $tiers names microvm
# shellcheck source=bench/serve.sh
. "$here/serve.sh"   # $tmp, serve_start and serve_measure; stops the server on exit

# The volumes' images live on the disk a real server would use (not /tmp, which may be a
# tmpfs), removed once the server has stopped.
kept="$(mktemp -d "${BENCH_STATE_PARENT:-/var/tmp}/kennel-volumes-state.XXXXXX")"
export KENNEL_VOLUMES_DIR="$kept/volumes" KENNEL_SESSIONS_DIR="$kept/sessions"
after_server() {
    rm -rf "$kept"
}

# No pool: the server's only sandboxes are the sessions'.
serve_start <<EOF2
# Written by bench/volumes.sh.
listen = "127.0.0.1:0"

[pool]
python = 0
bash = 0

[maxima]
memory = "2G"
workspace_size = "1G"
timeout = "300s"
EOF2
say "kennel serve (pid $server_pid) listening on $url"

status=0
serve_measure "$PY" "$here/volumes.py" --url "$url" --tiers "$tiers" "${json[@]}" || status=$?
exit "$status"
