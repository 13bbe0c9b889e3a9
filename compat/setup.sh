#!/bin/sh
# Installs what the compatibility target needs from Debian: CPython's own regression tests
# and the packages the agent jobs use. Idempotent: installs only what is missing.
set -eu
PKGS="libpython3.11-testsuite python3-numpy python3-pandas python3-matplotlib sqlite3 gcc libc6-dev python3-venv python3-pip"
missing=""
for p in $PKGS; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
if [ -z "$missing" ]; then
    echo "compat/setup.sh: all packages present"
    exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "compat/setup.sh: installing$missing"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
