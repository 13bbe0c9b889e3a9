#!/usr/bin/env bash
# A volume's write speed beside its anchor in the same run: writing and fsyncing 256 MiB
# (`dd ... conv=fsync`) to a volume mounted at /workspace/vol, against the same write to
# /workspace (the session's tmpfs), in one native session. See bench/README.md.
#
#   bench/volumes.sh [--json]
#
# Environment: BENCH_N (rounds of each write, default 5), BENCH_MIB (MiB per write, default
# 256), BENCH_STATE_PARENT (where the server's state directory is made, default /var/tmp),
# KENNEL (binary). Needs root (a volume is a loop device and an ext4 mount) and
# mkfs.ext4. Exits 0 whether or not a figure is good; non-zero only when it cannot measure.
set -euo pipefail

name=volumes help=2,10
# shellcheck source=bench/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"

# shellcheck source=bench/kennel.sh
. "$root/bench/kennel.sh"   # sets $kennel, building it when it is missing or stale
# shellcheck source=bench/serve.sh
. "$here/serve.sh"   # $tmp, serve_start and serve_measure; stops the server on exit

# The volume's image lives in a state directory of the server's own, on the disk a real
# one would use (not /tmp, which may be a tmpfs), removed once the server has stopped.
KENNEL_STATE_DIR="$(mktemp -d "${BENCH_STATE_PARENT:-/var/tmp}/kennel-volumes-state.XXXXXX")"
export KENNEL_STATE_DIR
after_server() {
    rm -rf "$KENNEL_STATE_DIR"
}

# No pool: the server's only sandbox is the session's.
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
serve_measure "$PY" "$here/volumes.py" --url "$url" "${json[@]}" || status=$?
exit "$status"
