# Sourced by load.sh and images.sh (after common.sh, with $kennel set): a `kennel serve`
# that the script starts and stops, in a temporary directory $tmp.
#
#   serve_start <CONFIG       writes $tmp/server.toml from stdin, starts the server on it and
#                             waits for the address it logs; sets $server_pid and $url
#   serve_measure ARGV...     runs the load generator (in the background, waited for, so that
#                             a signal runs the cleanup at once), then stops the server;
#                             returns the generator's exit status
#
# A script that started something the server uses defines after_server(): the cleanup calls it
# once the server has stopped.

tmp="$(mktemp -d "${TMPDIR:-/tmp}/kennel-$name.XXXXXX")"
server_pid=""
load_pid=""

stop_server() {
    # The server ends its sandboxes itself on SIGTERM.
    [[ -n $server_pid ]] || return 0
    stop_pid "$server_pid" 30 "the server"
    server_pid=""
}

cleanup() {
    # On a signal, the load generator may still be running: it is ours, end it first.
    [[ -z $load_pid ]] || stop_pid "$load_pid" 10 "the load generator"
    stop_server
    if declare -F after_server >/dev/null; then after_server; fi
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

serve_start() {
    cat >"$tmp/server.toml"
    "$kennel" serve --config "$tmp/server.toml" >"$tmp/server.log" 2>&1 &
    server_pid=$!
    url=""
    local i
    for ((i = 0; i < 200; i++)); do
        if ! kill -0 "$server_pid" 2>/dev/null; then
            say "kennel serve exited before it listened; its log:"
            cat "$tmp/server.log" >&2
            exit 2
        fi
        url="$(sed -n 's/^kennel serve: listening on \(http:\/\/[0-9.:]*\).*/\1/p' "$tmp/server.log" | head -n 1)"
        [[ -n $url ]] && break
        sleep 0.05
    done
    if [[ -z $url ]]; then
        say "kennel serve did not report its address within 10 s; its log:"
        cat "$tmp/server.log" >&2
        exit 2
    fi
}

serve_measure() {
    "$@" &
    load_pid=$!
    local status=0
    wait "$load_pid" || status=$?
    load_pid=""
    if [[ $status -ne 0 ]]; then
        say "$(basename "$2") failed (exit status $status); the server's log:"
        tail -n 40 "$tmp/server.log" >&2
    fi
    stop_server
    return "$status"
}
