#!/usr/bin/env bash
# A microVM session saved with its memory and restored (issue 31, `keep: "saved"`), at the
# sandbox and agent level: the save's time and state size, and the restore's time to the first
# answer, beside a clone-pool restore (the snapshot's) in the same run. See bench/README.md.
#
#   bench/vmsave.sh               (needs root and the prepared guest, as the microvm tests)
#
# Environment: BENCH_N (rounds, default 3), BENCH_VM_MIB (the guest's memory, default 1024;
# the session's limit is 512 MiB, or the guest's less 160 MiB), BENCH_PROFILE (cargo's
# profile for the test and the kennel binary it drives, default dev; release takes a long
# build), KENNEL_STATE_DIR is not read: the tests' state is. Prints each round's figures and
# their medians; exits non-zero only when it cannot measure.
set -euo pipefail
name=vmsave help=2,12
# shellcheck source=bench/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
[[ $(id -u) -eq 0 ]] || { say "the microvm tier needs root"; exit 2; }
profile=()
[[ ${BENCH_PROFILE:-dev} == release ]] && profile=(--release)
say "running the ignored test bench_save_and_restore (crates/kennel/tests/vm_save.rs)"
out="$(cd "$root" && cargo test -j1 "${profile[@]}" -p kennel --test vm_save -- \
    --ignored --nocapture --exact bench_save_and_restore)"
grep '^ROUND ' <<<"$out" || { say "no figures: the bench did not run"; exit 2; }
grep '^ROUND ' <<<"$out" | "$PY" -c '
import statistics, sys
rows = [line.split()[2:] for line in sys.stdin]
names = rows[0][0::2]
for i, name in enumerate(names):
    values = [float(r[2 * i + 1]) for r in rows]
    print(f"MEDIAN {name} {statistics.median(values):.1f} (n={len(values)})")
'
