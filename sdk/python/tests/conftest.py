"""Test fixtures: the real `kennel serve` on a free loopback port, with a token.

The server binary is $KENNEL_BIN, else <repo>/target/debug/kennel (built with `cargo build`
when missing). It is stopped by its PID with SIGTERM (SIGKILL if it does not stop in time).
"""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


def _start(workdir: Path) -> Server:
    binary = _kennel_bin()
    config = workdir / "config.toml"
    config.write_text(CONFIG)
    log = workdir / "server.log"
    # A state directory of its own: the server sees no image and no prepared VM, whatever
    # the host has, so what a microvm run answers is the same on every host.
    env = dict(os.environ, KENNEL_TOKENS=f"sdk:{TOKEN}", KENNEL_STATE_DIR=str(workdir / "state"))
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


@pytest.fixture(scope="session")
def server():
    with tempfile.TemporaryDirectory(prefix="kennel-sdk-test-") as d:
        s = _start(Path(d))
        try:
            yield s
        finally:
            _stop(s)
            if s.proc.returncode not in (0, None):
                print(f"kennel serve exited {s.proc.returncode}; log:\n{s.log_text()}",
                      file=sys.stderr)


@pytest.fixture
def client(server):
    import kennel

    with kennel.Client(server.url, token=server.token, timeout=60) as c:
        yield c
