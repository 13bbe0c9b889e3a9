"""What the adapters' tests share: running an example as a user would, against the test
server (the `server` fixture of ../conftest.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SDK = Path(__file__).resolve().parents[2]


@pytest.fixture
def run_example(server):
    """Runs examples/NAME with the server's URL and token in its environment: its stdout,
    which must come with a zero exit."""

    def run(name: str) -> str:
        env = dict(os.environ, KENNEL_URL=server.url, KENNEL_TOKEN=server.token,
                   PYTHONPATH=str(SDK))
        proc = subprocess.run([sys.executable, "-B", str(SDK / "examples" / name)], env=env,
                              capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    return run
