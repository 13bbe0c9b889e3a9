"""Sessions in the stronger tiers: one in gVisor (``runtime="runsc"``) and one in a microVM
(``tier="microvm"``), each opened by the SDK against the real server, running python, with
``session.isolation`` checked against what the code reads from inside."""

import os
import shutil

import pytest

import kennel
from conftest import GUEST_RELEASE_ENV, TOKEN

# What gVisor's own kernel answers to uname(2): fixed in its source, whatever the host runs.
GVISOR_UNAME = ("4.4.0", "#1 SMP Sun Jan 10 15:06:54 PST 2016")

UNAME = "import os; u = os.uname(); print(u.release); print(u.version)"


def _runsc_installed() -> bool:
    return shutil.which("runsc", path="/usr/sbin:/usr/bin:/usr/local/bin:/usr/local/sbin") is not None


def _uname(session) -> tuple:
    """The kernel release and version the session's python reads (its state kept: a second
    exec sees the first one's variable)."""
    session.run_code("seen = 6 * 7")
    r = session.run_code(UNAME + "; print(seen)")
    assert r.exit_code == 0, r.stderr
    release, version, seen = r.stdout.splitlines()
    assert seen == "42"
    return release, version


def test_a_runsc_session_runs_under_gvisor_and_says_so(client):
    if not _runsc_installed():
        pytest.skip("gVisor's runsc is not installed (scripts/setup-ci.sh installs it)")
    with client.session(runtime="runsc") as s:
        assert s.isolation is not None and s.isolation.tier == "oci"
        assert s.isolation.runtime["name"] == "runsc"
        assert s.ended is None
        assert _uname(s) == GVISOR_UNAME
        # The server's view, read again, is the same.
        assert s.refresh().isolation.raw == s.isolation.raw
    host = os.uname()
    assert (host.release, host.version) != GVISOR_UNAME


def test_a_microvm_session_runs_under_the_guest_kernel_and_says_so(vm_server):
    guest = os.environ[GUEST_RELEASE_ENV]
    with kennel.Client(vm_server.url, token=TOKEN, timeout=120) as client:
        with client.session(tier="microvm") as s:
            assert s.isolation is not None and s.isolation.tier == "microvm"
            assert s.isolation.runtime["name"] == "qemu-microvm"
            assert s.isolation.accel in ("kvm", "tcg")
            release, _ = _uname(s)
            assert release == guest
            assert [i.isolation.tier for i in client.list_sessions() if i.id == s.id] == ["microvm"]
    assert os.uname().release != guest
