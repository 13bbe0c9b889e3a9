#!/usr/bin/env bash
# Installs what Kennel's test suite and benchmarks need on a fresh Debian machine (as root).
# Idempotent: installs only missing packages, and runs `apt-get update` only when it must.
# It changes nothing else on the host: no network, hostname, clock, mount or sysctl changes.
set -euo pipefail

say() { echo "setup-ci: $*"; }
die() { echo "setup-ci: error: $*" >&2; exit 1; }

# Debian packages, with why each is needed.
#   bubblewrap       the bwrap baseline in bench/startup.sh; `kennel doctor` checks for it
#   python3          /usr/bin/python3 (with ctypes), the interpreter the tests run in sandboxes
#                    and bare as the control (a pyenv `python3` on PATH does not count)
#   coreutils        /bin/true, /bin/sleep and friends, run in sandboxes by the tests
#   util-linux       setsid (escaping-process tests) and setpriv (rootless-fallback test)
#   bash, dash       /bin/bash and /bin/sh (the Bash and Sh snippet languages)
#   gcc, libc6-dev   the C linker (`cc`) and C runtime that rustc links test binaries with
#   ca-certificates  TLS roots for cargo to fetch crates from crates.io
#   curl, openssl    the network-allowlist tests: a client in the sandbox, a test certificate
#   python3-pip      the network-allowlist tests: pip install from a local index; with its
#                    setuptools, the Python SDK installed from its path (test_packaging.py)
#   runsc            gVisor, the oci tier's strongest runtime (the limits suite under runsc)
#   crun, runc       the oci tier's container runtimes (limits and escape suites under each)
#   jq               the README's curl examples, run as written by tests/readme.rs
#   mmdebstrap       `kennel image build`: an image's Debian base (tests/images.rs)
#   umoci            the reference unpacker the OCI import is compared with (kennel-image tests)
#   docker.io        dockerd, the Docker Engine the docker runtime is tested against (the tests
#                    start a private one and stop it; the package's own service is not started)
#   kmod             depmod and modprobe: `kennel vm prepare` resolves the guest kernel's module
#                    order with them, against the unpacked kernel (tests/vm_prepare.rs)
#   erofs-utils      mkfs.erofs: the microVM tier's read-only root disks, made from images
#   python3-venv     the agent-framework adapters' virtualenvs (scripts/adapter-venvs.sh)
#   python3-numpy    the snapshot suite: forks of a session that imported numpy each reseed its
#                    generator (runsc runs the host's python3)
#   python3-aiohttp  the DNS suite: an HTTP client that ignores proxy variables (trust_env off)
#                    resolves an allowed name through the sandbox's resolver (tests/suites/dns.rs)
#   python3-requests the secrets suite: a client of a secret's host, through the proxy's
#                    interception, that trusts the sandbox's CA bundle (REQUESTS_CA_BUNDLE)
#   chromium         headless, as the browser of tests/front.rs: a web page of another origin,
#                    or under a name rebound to 127.0.0.1, cannot drive `kennel serve`
packages=(bubblewrap python3 coreutils util-linux bash dash gcc libc6-dev ca-certificates jq
    curl openssl python3-pip runsc crun runc mmdebstrap umoci docker.io kmod erofs-utils
    python3-venv python3-numpy python3-aiohttp python3-requests chromium)

installed() {
    [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true) == "install ok installed" ]]
}

command -v dpkg-query >/dev/null && command -v apt-get >/dev/null \
    || die "this script expects Debian (dpkg and apt-get)"

missing=()
for p in "${packages[@]}"; do
    installed "$p" || missing+=("$p")
done

if ((${#missing[@]})); then
    [[ $(id -u) -eq 0 ]] || die "missing packages (${missing[*]}); run this script as root"
    say "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
    say "packages present: ${packages[*]}"
fi

# What the tests actually run, by path.
for path in /usr/bin/python3 /bin/sh /bin/bash /bin/true /bin/sleep /usr/bin/env; do
    [[ -x $path ]] || die "$path is missing or not executable"
done
for tool in bwrap setsid setpriv cc; do
    command -v "$tool" >/dev/null || die "$tool is not on PATH"
done
/usr/bin/python3 -c 'import ctypes, json, socket' || die "/usr/bin/python3 lacks ctypes/json/socket"

# The official MCP Python SDK (PyPI `mcp`), the client tests/mcp.rs drives `kennel mcp` with.
# Installed for /usr/bin/python3 only when it is missing (needs PyPI to be reachable).
if ! /usr/bin/python3 -c 'import mcp' 2>/dev/null; then
    [[ $(id -u) -eq 0 ]] || die "the MCP Python SDK is missing; run this script as root"
    say "installing the MCP Python SDK (pip install mcp)"
    /usr/bin/python3 -m pip install --quiet --break-system-packages mcp \
        || die "cannot install the MCP Python SDK (pip install mcp)"
    /usr/bin/python3 -c 'import mcp' || die "the MCP Python SDK does not import after installing"
else
    say "MCP Python SDK present"
fi

# The Python SDK's tests (crates/kennel/tests/python_sdk.rs runs sdk/python/tests with pytest)
# need httpx and pytest for /usr/bin/python3: Debian's packages, else pip.
if ! /usr/bin/python3 -c 'import httpx, pytest' 2>/dev/null; then
    [[ $(id -u) -eq 0 ]] || die "/usr/bin/python3 lacks httpx or pytest; run this script as root"
    say "installing httpx and pytest for /usr/bin/python3"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -qq --no-install-recommends python3-httpx python3-pytest; then
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends python3-httpx python3-pytest \
            || /usr/bin/python3 -m pip install --quiet --break-system-packages httpx pytest
    fi
    /usr/bin/python3 -c 'import httpx, pytest' || die "/usr/bin/python3 still lacks httpx or pytest"
fi

# The API contract tests (crates/kennel/tests/contract.rs) check /openapi.json with
# openapi-spec-validator, generate a client from it with openapi-python-client, and fuzz the
# server against it with schemathesis; the terminal tests drive a terminal with PyPI's
# websockets (the Python SDK's terminals use it too) and render it with pyte, as a terminal
# emulator does; each pinned (a new schemathesis once turned on a check
# of its own, and CI failed on a tool's change, not ours) and installed for /usr/bin/python3
# when missing or at another version.
for tool in openapi_spec_validator:openapi-spec-validator==0.9.0 \
    openapi_python_client:openapi-python-client==0.29.1 schemathesis:schemathesis==4.32.5 \
    websockets:websockets==15.0.1 pyte:pyte==0.8.2; do
    module=${tool%%:*} package=${tool#*:}
    name=${package%%==*} version=${package#*==}
    have=$(/usr/bin/python3 -c "import importlib.metadata as m; print(m.version('$name'))" \
        2>/dev/null || true)
    if [[ $have != "$version" ]]; then
        [[ $(id -u) -eq 0 ]] || die "$package is missing; run this script as root"
        say "installing $package for /usr/bin/python3 (found: ${have:-none})"
        /usr/bin/python3 -m pip install --quiet --break-system-packages "$package" \
            || die "cannot install $package (pip install $package)"
        /usr/bin/python3 -c "import $module" || die "$package does not import after installing"
    else
        say "$package present"
    fi
done

# The TypeScript SDK's tests (crates/kennel/tests/typescript_sdk.rs runs `npm test` in
# sdk/typescript) need Node 20 or later, its dependency ws (terminals on Node 20) and its pinned
# dev dependencies (typescript, openapi-typescript, the Vercel AI SDK), installed from npm by
# `npm ci` when missing or stale.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    [[ $(id -u) -eq 0 ]] || die "node and npm are missing; run this script as root"
    say "installing nodejs and npm"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends nodejs npm
fi
node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' \
    || die "node $(node --version) is too old for sdk/typescript: it needs 20 or later"
ts_sdk="$(dirname "${BASH_SOURCE[0]}")/../sdk/typescript"
if [[ ! -x $ts_sdk/node_modules/.bin/tsc || $ts_sdk/package-lock.json -nt $ts_sdk/node_modules/.package-lock.json ]]; then
    say "installing the TypeScript SDK's dev dependencies (npm ci)"
    (cd "$ts_sdk" && npm ci --no-audit --no-fund --loglevel=error) \
        || die "npm ci failed in sdk/typescript"
else
    say "TypeScript SDK dev dependencies present"
fi

# The Python SDK's agent-framework adapters are tested in a virtualenv per framework, with
# the versions sdk/python/requirements/*.txt pin, from PyPI (crates/kennel/tests/adapters.rs).
bash "$(dirname "${BASH_SOURCE[0]}")/adapter-venvs.sh" || die "cannot make the adapters' virtualenvs"

# Rust is not installed from here (rustup's servers may be unreachable); it must exist.
cargo_bin="${CARGO_HOME:-$HOME/.cargo}/bin"
if command -v cargo >/dev/null; then
    cargo=cargo
elif [[ -x $cargo_bin/cargo ]]; then
    cargo="$cargo_bin/cargo"
    say "note: cargo is not on PATH; found $cargo (.ci/run adds $cargo_bin to PATH)"
else
    die "cargo not found on PATH or in $cargo_bin; install Rust (rustup, rust-version 1.80 or later)"
fi
say "$("$cargo" --version), $(/usr/bin/python3 --version), $(bwrap --version)"
say "ready"
