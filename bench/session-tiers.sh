# Sourced by pause.sh and snapshots.sh after common.sh, with $clones (the microVM clones the
# server's pool keeps, and waits for) and $extra_config (more of the server's config) set:
# prepares the guest when BENCH_TIERS names microvm, starts a server with sessions kept under
# /var/tmp, and runs "$here/$name.py" against it with the tiers and rounds asked for.
[[ $(id -u) -eq 0 ]] || { say "sessions' cgroups and the microvm tier need root"; exit 2; }
tiers="${BENCH_TIERS:-native,microvm}"
# shellcheck source=bench/guest.sh
. "$here/guest.sh"
# shellcheck source=bench/serve.sh
. "$here/serve.sh"
# Not under /tmp: the microvm tier's sandboxes build their roots there.
export KENNEL_SESSIONS_DIR="/var/tmp/kennel-bench-$name-$$"
after_server() { rm -rf "$KENNEL_SESSIONS_DIR"; }
serve_start <<EOF2
# Written by bench/$name.sh.
listen = "127.0.0.1:0"
$extra_config
[pool]
python = 0
bash = 0
$microvm_pool
EOF2
if [[ -n $microvm_pool ]]; then
    say "waiting for the pool's $clones clone(s)"
    for _ in $(seq 1 $((clones * 600))); do
        curl -s "$url/healthz" | grep -q "\"microvm-base\":$clones" && break
        sleep 1
    done
fi
status=0
serve_measure "$PY" "$here/$name.py" --url "$url" --tiers "$tiers" --rounds "${BENCH_N:-3}" \
    "${json[@]}" || status=$?
exit "$status"
