#!/usr/bin/env bash
# Start latency of the docker runtime next to the docker CLI on the same engine, with
# `kennel run --runtime runc` for reference, measured interleaved in one run, against a private
# Docker Engine this script starts (as the tests do) and stops. See bench/README.md.
#
#   bench/docker.sh [--json]      (needs root and Debian's docker.io: scripts/setup-ci.sh)
#
# Environment: BENCH_N (measured iterations, default 20), BENCH_WARMUP (default 2), KENNEL
# (the binary to measure). Exits non-zero only when it cannot measure.
set -euo pipefail
name=docker help=2,9
# shellcheck source=bench/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
[[ $(id -u) -eq 0 ]] || { say "a Docker Engine needs root"; exit 2; }
dockerd=/usr/sbin/dockerd
[[ -x $dockerd ]] || { say "$dockerd is missing (Debian's docker.io; scripts/setup-ci.sh installs it)"; exit 2; }
docker="$(command -v /usr/bin/docker /usr/local/bin/docker | head -n 1 || true)"
[[ -n $docker ]] || { say "the docker CLI is missing (/usr/bin/docker or /usr/local/bin/docker)"; exit 2; }
# shellcheck source=bench/kennel.sh
. "$root/bench/kennel.sh"

# The engine's data root is the tests' (images imported there stay imported): never two
# engines on it at once.
data_root=/var/cache/kennel-tests/docker
if others="$(pgrep -af -- "--data-root=$data_root")"; then
    say "a dockerd already runs on $data_root (the tests', or another bench); not starting a second:"
    say "$others"
    exit 2
fi

# --- The engine ----------------------------------------------------------------------------
dir="/run/kennel-bench-dockerd-$$"
engine_pid=""
bench_pid=""

stop_engine() {
    # The one engine this script started, by its PID: SIGTERM, SIGKILL after 20 s.
    [[ -n $engine_pid ]] || return 0
    stop_pid "$engine_pid" 20 dockerd
    engine_pid=""
}

remove_cgroup_parents() {
    # The (empty) kennel-docker cgroups the engine's containers were made beneath, beneath
    # this process's own cgroup in every hierarchy; rmdir leaves a non-empty one alone.
    local line ctrl path h
    while IFS= read -r line; do
        ctrl="${line#*:}"; ctrl="${ctrl%%:*}"
        path="${line#*:*:}"
        h="${ctrl#name=}"; [[ -n $h ]] || h=unified
        rmdir "/sys/fs/cgroup/$h${path%/}/kennel-docker" 2>/dev/null || true
        rmdir "/sys/fs/cgroup${path%/}/kennel-docker" 2>/dev/null || true
    done </proc/$$/cgroup
}

cleanup() {
    [[ -z $bench_pid ]] || stop_pid "$bench_pid" 10 docker.py
    stop_engine
    rm -rf "$dir"
    remove_cgroup_parents
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

rm -rf "$dir"
mkdir -p "$dir" "$data_root"
# In a mount namespace of its own, so none of its mounts stays in the host's; unshare execs
# dockerd, so $! is the engine's pid.
unshare --mount --propagation private -- "$dockerd" \
    --userns-remap=default --iptables=false --ip6tables=false --bridge=none \
    --host="unix://$dir/docker.sock" --data-root="$data_root" --exec-root="$dir/exec" \
    --pidfile="$dir/dockerd.pid" --cgroup-parent=kennel-docker \
    </dev/null >"$dir/dockerd.log" 2>&1 &
engine_pid=$!

ping() {
    "$PY" - "$dir/docker.sock" <<'PY' 2>/dev/null
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(2)
s.connect(sys.argv[1])
s.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
answer = b""
while chunk := s.recv(4096):
    answer += chunk
sys.exit(0 if answer.startswith((b"HTTP/1.0 200", b"HTTP/1.1 200")) else 1)
PY
}
for ((i = 0; i < 600; i++)); do
    ping && break
    if ! kill -0 "$engine_pid" 2>/dev/null; then
        say "dockerd exited before it answered; its log:"
        tail -n 40 "$dir/dockerd.log" >&2
        exit 2
    fi
    sleep 0.1
done
if ! ping; then
    say "dockerd did not answer GET /_ping within 60 s; its log:"
    tail -n 40 "$dir/dockerd.log" >&2
    exit 2
fi
export DOCKER_HOST="unix://$dir/docker.sock"
say "dockerd (pid $engine_pid) answers on $DOCKER_HOST; docker CLI $docker; kennel $kennel"

# In the background and waited for, so that a signal to this script runs the cleanup at once.
status=0
"$PY" "$here/docker.py" --kennel "$kennel" --docker "$docker" "${json[@]}" &
bench_pid=$!
wait "$bench_pid" || status=$?
bench_pid=""
exit "$status"
