# Sourced after common.sh, with $tiers (a comma list) and $clones set: exports
# KENNEL_STATE_DIR (default the tests' own), finds the kennel binary (kennel.sh), and when
# $tiers names microvm prepares the guest (once per machine) and sets $microvm_pool to the
# server's pool line for $clones clones of microvm-base; "" otherwise.
export KENNEL_STATE_DIR="${KENNEL_STATE_DIR:-/var/cache/kennel-tests/state}"
# shellcheck source=bench/kennel.sh
. "$root/bench/kennel.sh"
microvm_pool=""
if [[ ,$tiers, == *,microvm,* ]]; then
    say "preparing the guest in $KENNEL_STATE_DIR/vm (kennel vm prepare; once per machine)"
    "$kennel" vm prepare >&2
    microvm_pool="microvm = { microvm-base = $clones }"
fi
