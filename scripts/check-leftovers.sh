#!/usr/bin/env bash
# After the test suite: lists what the tests left behind that is named after Kennel (every
# cgroup directory under /sys/fs/cgroup and every mount whose point or source has "kennel" in
# its name, in any case; every process of Kennel's binaries, and every QEMU, which only the
# microvm tier starts here) and exits 1 if there is any, 0 otherwise. Kennel's own cgroups
# (`kennel-<pid>-<start>-<n>`), the private dockerd's (`test-kennel-dockerd-<pid>`) and
# everything the tests mount are removed when their run or test binary ends, so a name here is
# a leak.
set -uo pipefail

cgroups=$(find /sys/fs/cgroup -mindepth 1 -type d -iname '*kennel*' 2>/dev/null | sort)
# /proc/self/mountinfo: field 5 is the mount point, the field after "-" + 2 the source.
mounts=$(awk '{ for (i = 7; i <= NF; i++) if ($i == "-") break; print $5, $(i + 2) }' \
    /proc/self/mountinfo | grep -i kennel | sort -u)

# comm is the binary's name cut to 15 characters: kennel, kennel-sandbox-helper, qemu-system-*.
processes=$(ps -eo pid=,comm=,args= | awk '$2 == "kennel" || $2 ~ /^kennel-sandbox/ || $2 ~ /^qemu-system/' \
    | cut -c1-160)

if [ -z "$cgroups" ] && [ -z "$mounts" ] && [ -z "$processes" ]; then
    echo "check-leftovers: nothing named after kennel is left in /sys/fs/cgroup, the mounts or the processes"
    exit 0
fi
echo "check-leftovers: the tests left these behind:"
[ -n "$cgroups" ] && sed 's/^/  cgroup /' <<<"$cgroups"
[ -n "$mounts" ] && sed 's/^/  mount /' <<<"$mounts"
[ -n "$processes" ] && sed 's/^/  process /' <<<"$processes"
exit 1
