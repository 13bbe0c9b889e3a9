# Sourced first by startup.sh, load.sh, images.sh and docker.sh, with the script's arguments and with
# $name (the script's, for messages) and $help (the lines of its header that --help prints)
# set: sets $here, $root and $PY, parses --json into $json, defines say() and stop_pid() and
# checks $PY.

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
PY=/usr/bin/python3

json=()
for arg in "$@"; do
    case "$arg" in
        --json) json=(--json) ;;
        -h|--help) sed -n "${help}p" "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "$name.sh: unknown argument: $arg (try --help)" >&2; exit 2 ;;
    esac
done

# Everything but the results goes to stderr, so `--json` output stays parseable.
say() { echo "$name.sh: $*" >&2; }

if [[ ! -x $PY ]]; then
    say "$PY is missing; it runs the benchmark's harness (apt-get install python3)"
    exit 2
fi

stop_pid() {
    # SIGTERM to $1, a process this script started, by its PID; SIGKILL if it is still there
    # after $2 seconds ($3 names it); then reaped.
    local pid=$1 secs=$2 what=$3 i
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < secs * 10; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            say "$what (pid $pid) did not stop within $secs s of SIGTERM; sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    wait "$pid" 2>/dev/null || true
}
