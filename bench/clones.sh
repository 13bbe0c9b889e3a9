#!/usr/bin/env bash
# MicroVM clones in the server's pool: a pooled pandas run on a clone of python-data, the
# clones' memory (PSS per idle clone) and their fill time, beside `kennel run --runtime runsc`
# and a cold microvm run of the same code, in one run. See bench/README.md.
#
#   bench/clones.sh [--json]      (needs root; prepares the guest and builds python-data first)
#
# Environment: BENCH_POOL (clones of python-data, default 2), BENCH_N (pooled runs, each on a
# full, settled pool, default 10), BENCH_ANCHOR_N (runsc runs, default 5), BENCH_COLD_N (cold
# microvm runs, default 1: about a minute each under TCG), KENNEL_STATE_DIR (default
# /var/cache/kennel-tests/state), KENNEL (binary). Exits non-zero only when it cannot measure.
set -euo pipefail
name=clones help=2,11
# shellcheck source=bench/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
[[ $(id -u) -eq 0 ]] || { say "the microvm tier, image builds and runsc need root"; exit 2; }
image=python-data
pool="${BENCH_POOL:-2}"
[[ $pool =~ ^[1-9][0-9]*$ ]] || { say "BENCH_POOL must be a positive integer, not '$pool'"; exit 2; }
export KENNEL_STATE_DIR="${KENNEL_STATE_DIR:-/var/cache/kennel-tests/state}"
# shellcheck source=bench/kennel.sh
. "$root/bench/kennel.sh"
say "preparing the guest and the image $image (once per machine)"
"$kennel" vm prepare >&2
(cd "$root" && "$kennel" image build "$image" -f "images/$image.toml" >&2)

# shellcheck source=bench/serve.sh
. "$here/serve.sh"
serve_start <<EOF
# Written by bench/clones.sh.
listen = "127.0.0.1:0"
[pool]
python = 0
bash = 0
microvm = { $image = $pool }
EOF
say "kennel serve (pid $server_pid) on $url, pool microvm.$image=$pool"
status=0
serve_measure "$PY" "$here/clones.py" --url "$url" --server-pid "$server_pid" --image "$image" \
    --pool "$pool" --kennel "$kennel" "${json[@]}" || status=$?
exit "$status"
