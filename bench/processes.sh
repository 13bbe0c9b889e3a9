#!/usr/bin/env bash
# Background processes and terminals in a native session, each figure beside an anchor
# measured in the same run: a process start (`POST .../processes` of /bin/true) against a
# session exec of `true`; the server's RSS while 64 processes (and 8 terminals) flood output
# and SSE and WebSocket clients read, against the same server at rest; a keystroke's echo
# through the terminal WebSocket against a host pty bridged by a `websockets` server. See
# bench/README.md.
#
#   bench/processes.sh [--json]
#
# Environment: BENCH_N (rounds of process start and exec, and keystrokes, default 50),
# BENCH_WARMUP (default 3), BENCH_FLOOD (seconds of each flood, default 4), BENCH_REST (seconds
# the server is sampled at rest, default 2), BENCH_VENV (the virtualenv with PyPI's websockets,
# made when missing; default /var/cache/kennel-bench/venvs/processes), KENNEL (binary).
# Exits 0 whether or not targets are met; non-zero only when it cannot measure.
set -euo pipefail

name=processes help=2,15
# shellcheck source=bench/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"

# --- The client's Python: /usr/bin/python3 with PyPI's websockets, in a virtualenv ---------
# Pinned, and made again only when the pin changes (as scripts/adapter-venvs.sh does).
websockets_pin="websockets==17.4"
venv="${BENCH_VENV:-/var/cache/kennel-bench/venvs/processes}"
if [[ ! -x $venv/bin/python || "$(cat "$venv/.pin" 2>/dev/null)" != "$websockets_pin" ]]; then
    say "making $venv ($websockets_pin, from PyPI)"
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    if "$PY" -m venv "$venv" >&2 && "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        "$websockets_pin" >&2; then
        echo "$websockets_pin" >"$venv/.pin"
    else
        say "cannot install $websockets_pin; the keystroke echo is skipped"
        rm -rf "$venv"
    fi
fi
client="$PY"
[[ -x $venv/bin/python ]] && client="$venv/bin/python"

# --- Kennel and its server ------------------------------------------------------------------
# shellcheck source=bench/kennel.sh
. "$root/bench/kennel.sh"   # sets $kennel, building it when it is missing or stale
# shellcheck source=bench/serve.sh
. "$here/serve.sh"   # $tmp, serve_start and serve_measure; stops the server on exit

# No pool: the server's only sandbox is the session's, and nothing refills under a figure.
serve_start <<EOF
# Written by bench/processes.sh.
listen = "127.0.0.1:0"
max_concurrent = 8

[pool]
python = 0
bash = 0

# Two SSE clients and eight terminal WebSockets are open at once, past the default 8 streams.
[connections]
streams_per_token = 16
EOF
say "kennel serve (pid $server_pid) listening on $url"

status=0
serve_measure "$client" "$here/processes.py" --url "$url" --server-pid "$server_pid" "${json[@]}" || status=$?
exit "$status"
