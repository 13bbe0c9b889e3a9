"""Test fixtures: the real `kennel serve` on a free loopback port, with a token.

The server binary is $KENNEL_BIN, else <repo>/target/debug/kennel (built with `cargo build`
when missing). It is stopped by its PID with SIGTERM (SIGKILL if it does not stop in time).

``vm_server`` is a second server that sees the microVM guest `kennel vm prepare` made in
$KENNEL_SDK_TEST_STATE (the tests' shared state directory), whose kernel release is
$KENNEL_SDK_TEST_GUEST_RELEASE: crates/kennel/tests/python_sdk.rs prepares the guest and sets
both, and the tests that need it skip, with the reason, where they are unset.
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, Optional

import httpx
import pytest

SDK_DIR = Path(__file__).resolve().parent.parent
REPO = SDK_DIR.parent.parent
sys.path.insert(0, str(SDK_DIR))  # the SDK is importable without `pip install`

TOKEN = "sdk-test-token-0123456789abcdef"
CONFIG = """\
[pool]
python = 1
bash = 0
"""
# No warm pool: the tier tests' sessions start their own sandboxes.
VM_CONFIG = """\
[pool]
python = 0
bash = 0
[jobs]
db = "{workdir}/jobs.sqlite"
"""

#: The environment variables that give the tests the prepared microVM guest.
VM_STATE_ENV = "KENNEL_SDK_TEST_STATE"
GUEST_RELEASE_ENV = "KENNEL_SDK_TEST_GUEST_RELEASE"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kennel_bin() -> Path:
    env = os.environ.get("KENNEL_BIN")
    if env:
        return Path(env)
    path = REPO / "target" / "debug" / "kennel"
    if not path.exists():
        subprocess.run(["cargo", "build", "--bin", "kennel"], cwd=REPO, check=True)
    return path


class Server:
    def __init__(self, proc, url, token, log, workdir):
        self.proc, self.url, self.token, self.log, self.workdir = proc, url, token, log, workdir

    def log_text(self) -> str:
        try:
            return Path(self.log).read_text(errors="replace")
        except OSError:
            return ""


def _start(workdir: Path, config_text: str = CONFIG, state: Optional[str] = None) -> Server:
    """A server on `config_text`; its state directory is `state`, else one of its own, where
    it sees no image and no prepared VM, whatever the host has, so that what a microvm run
    answers is the same on every host."""
    binary = _kennel_bin()
    config = workdir / "config.toml"
    config.write_text(config_text)
    log = workdir / "server.log"
    env = dict(os.environ, KENNEL_TOKENS=f"sdk:{TOKEN}",
               KENNEL_STATE_DIR=state or str(workdir / "state"))
    env.pop("KENNEL_TOKEN", None)
    env.pop("KENNEL_VM_DIR", None)
    last = ""
    for _attempt in range(5):
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [str(binary), "serve", "--listen", f"127.0.0.1:{port}", "--config", str(config)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env)
        server = Server(proc, url, TOKEN, log, workdir)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    return server
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        last = server.log_text()
        _stop(server)
        if "cannot listen" not in last:
            break
    raise RuntimeError(f"kennel serve did not start; its log:\n{last}")


def _stop(server: Server) -> None:
    proc = server.proc
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


@contextlib.contextmanager
def _serving(config_text: str = CONFIG, state: Optional[str] = None) -> Iterator[Server]:
    """A server in a temporary directory, stopped and removed on exit; its log is printed when
    it did not exit cleanly."""
    with tempfile.TemporaryDirectory(prefix="kennel-sdk-test-") as d:
        s = _start(Path(d), config_text.format(workdir=d), state)
        try:
            yield s
        finally:
            _stop(s)
            if s.proc.returncode not in (0, None):
                print(f"kennel serve exited {s.proc.returncode}; log:\n{s.log_text()}",
                      file=sys.stderr)


@pytest.fixture(scope="session")
def server():
    with _serving() as s:
        yield s


@pytest.fixture(scope="session")
def vm_server():
    """A server that sees the prepared microVM guest (see the module's docstring)."""
    state = os.environ.get(VM_STATE_ENV)
    if not state:
        pytest.skip(f"${VM_STATE_ENV} names no prepared microVM guest: "
                    "crates/kennel/tests/python_sdk.rs prepares one and sets it")
    with _serving(VM_CONFIG, state) as s:
        yield s


@pytest.fixture
def client(server):
    import kennel

    with kennel.Client(server.url, token=server.token, timeout=60) as c:
        yield c
