#!/usr/bin/env bash
# DNS for every program, beside its anchors measured in the same run and the same sandbox:
# getaddrinfo of an allowed name (the sandbox's resolver) against getaddrinfo of `localhost`
# (/etc/hosts), and a GET through the name's synthetic address (no proxy variables) against
# the same GET through the proxy variables' HTTP proxy, to a loopback server on the host; p50
# and p99, as ratios. See bench/README.md.
#
#   bench/dns.sh [--json]
#
# Environment: BENCH_N (lookups and GETs of each kind, default 1000), KENNEL (binary). Needs
# root (the resolver and the proxy are bound in the sandbox's network namespace). Exits 0
# whether or not a figure is good; non-zero only when it cannot measure.
set -euo pipefail

name=dns help=2,13
# shellcheck source=bench/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
[[ $(id -u) -eq 0 ]] || { say "dns needs root"; exit 2; }
# shellcheck source=bench/kennel.sh
. "$here/kennel.sh"   # $kennel

exec "$PY" "$here/dns.py" --kennel "$kennel" "${json[@]}"
