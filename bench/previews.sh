#!/usr/bin/env bash
# A GET through a preview URL beside its anchor in the same run: `curl` on the host to a
# session's `python3 -m http.server` through Kennel's path-form preview, against `curl` to the
# same port from inside the sandbox, both timed by curl itself (`%{time_total}`), p50 and p99.
# See bench/README.md.
#
#   bench/previews.sh [--json]
#
# Environment: BENCH_N (GETs of each kind, default 200), BENCH_TIERS (native, crun or both,
# default native), KENNEL (binary). Needs root (a session's network namespace is entered to
# reach its port) and curl. Exits 0 whether or not a figure is good; non-zero only when it
# cannot measure.
set -euo pipefail

name=previews help=2,12
# shellcheck source=bench/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
[[ $(id -u) -eq 0 ]] || { say "previews need root"; exit 2; }
command -v curl >/dev/null || { say "curl is missing (apt-get install curl)"; exit 2; }
tiers="${BENCH_TIERS:-native}"
# shellcheck source=bench/kennel.sh
. "$here/kennel.sh"   # $kennel
# shellcheck source=bench/serve.sh
. "$here/serve.sh"    # $tmp, serve_start and serve_measure; stops the server on exit

# The previews' key and table go in the server's own directory, removed with it.
export KENNEL_STATE_DIR="$tmp/state"

# No pool: the server's only sandboxes are the sessions'.
serve_start <<EOF2
# Written by bench/previews.sh.
listen = "127.0.0.1:0"

[pool]
python = 0
bash = 0
EOF2
say "kennel serve (pid $server_pid) listening on $url"

status=0
serve_measure "$PY" "$here/previews.py" --url "$url" --tiers "$tiers" "${json[@]}" || status=$?
exit "$status"
