#!/usr/bin/env bash
# Makes one virtualenv per agent-framework extra of the Python SDK (sdk/python/requirements/
# EXTRA.txt, exact pins from PyPI), under $KENNEL_VENVS (default /var/cache/kennel-tests/venvs),
# with pytest and httpx beside the framework. A venv is rebuilt only when its requirements
# file changed (its sha256 is kept in the venv). Usage: adapter-venvs.sh [EXTRA...]
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venvs="${KENNEL_VENVS:-/var/cache/kennel-tests/venvs}"
say() { echo "adapter-venvs: $*"; }

extras=("$@")
if ((${#extras[@]} == 0)); then
    for f in "$root"/sdk/python/requirements/*.txt; do
        extras+=("$(basename "$f" .txt)")
    done
fi

mkdir -p "$venvs"
for extra in "${extras[@]}"; do
    req="$root/sdk/python/requirements/$extra.txt"
    [[ -f $req ]] || { echo "adapter-venvs: no $req" >&2; exit 1; }
    venv="$venvs/$extra"
    want="$(sha256sum "$req" | cut -d' ' -f1)"
    if [[ -x $venv/bin/python && "$(cat "$venv/.requirements.sha256" 2>/dev/null)" == "$want" ]]; then
        say "$extra: present"
        continue
    fi
    say "$extra: installing $(grep -v '^#' "$req" | xargs)"
    rm -rf "$venv"
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        -r "$req" "pytest>=7" "httpx>=0.23"
    echo "$want" > "$venv/.requirements.sha256"
done
