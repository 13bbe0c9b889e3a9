# Sourced by docker.sh and sessions.sh (after common.sh): a private Docker Engine started as
# the tests start theirs (crates/kennel/tests/common/dockerd.rs) and stopped by its PID.
#
#   dockerd_start     checks for dockerd and the docker CLI ($docker), refuses when an engine
#                     already runs on the data root, starts one and waits for GET /_ping; sets
#                     $engine_pid and exports DOCKER_HOST
#   dockerd_stop      SIGTERM to the engine (SIGKILL after 20 s), removes its run directory
#                     and the empty kennel-docker cgroups beneath this script's cgroup
#
# BENCH_DOCKER_ROOT sets the engine's data root (default the tests': images imported there
# stay imported).

data_root="${BENCH_DOCKER_ROOT:-/var/cache/kennel-tests/docker}"
dockerd=/usr/sbin/dockerd
engine_dir="/run/kennel-bench-dockerd-$$"
engine_pid=""

dockerd_stop() {
    if [[ -n $engine_pid ]]; then
        stop_pid "$engine_pid" 20 dockerd
        engine_pid=""
    fi
    rm -rf "$engine_dir"
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

dockerd_ping() {
    "$PY" - "$engine_dir/docker.sock" <<'PY' 2>/dev/null
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

dockerd_start() {
    [[ -x $dockerd ]] || { say "$dockerd is missing (Debian's docker.io; scripts/setup-ci.sh installs it)"; exit 2; }
    docker="$(command -v /usr/bin/docker /usr/local/bin/docker | head -n 1 || true)"
    [[ -n $docker ]] || { say "the docker CLI is missing (/usr/bin/docker or /usr/local/bin/docker)"; exit 2; }
    # Never two engines on one data root at once.
    local others
    if others="$(pgrep -af -- "--data-root=$data_root")"; then
        say "a dockerd already runs on $data_root (the tests', or another bench); not starting a second"
        say "(BENCH_DOCKER_ROOT=/another/dir gives this bench a data root of its own):"
        say "$others"
        exit 2
    fi
    rm -rf "$engine_dir"
    mkdir -p "$engine_dir" "$data_root"
    # In a mount namespace of its own, so none of its mounts stays in the host's; unshare execs
    # dockerd, so $! is the engine's pid.
    unshare --mount --propagation private -- "$dockerd" \
        --userns-remap=default --iptables=false --ip6tables=false --bridge=none \
        --host="unix://$engine_dir/docker.sock" --data-root="$data_root" \
        --exec-root="$engine_dir/exec" --pidfile="$engine_dir/dockerd.pid" \
        --cgroup-parent=kennel-docker </dev/null >"$engine_dir/dockerd.log" 2>&1 &
    engine_pid=$!
    local i
    for ((i = 0; i < 600; i++)); do
        dockerd_ping && break
        if ! kill -0 "$engine_pid" 2>/dev/null; then
            say "dockerd exited before it answered; its log:"
            tail -n 40 "$engine_dir/dockerd.log" >&2
            exit 2
        fi
        sleep 0.1
    done
    if ! dockerd_ping; then
        say "dockerd did not answer GET /_ping within 60 s; its log:"
        tail -n 40 "$engine_dir/dockerd.log" >&2
        exit 2
    fi
    export DOCKER_HOST="unix://$engine_dir/docker.sock"
    say "dockerd (pid $engine_pid) answers on $DOCKER_HOST; docker CLI $docker"
}
