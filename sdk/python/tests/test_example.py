"""examples/agent_loop.py, run as a user would, against the test server (and once starting a
server of its own)."""

import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO, _kennel_bin

EXAMPLE = REPO / "examples" / "agent_loop.py"
PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable


def _run(args, env):
    p = subprocess.run([PYTHON, str(EXAMPLE), *args], capture_output=True, text=True,
                       env=env, cwd=REPO, timeout=120)
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p.stdout


def _check(transcript):
    lines = transcript.splitlines()
    assert lines[0].startswith("[user] What is the sum of the squares of 1 to 10?")
    assert lines[1].startswith("[kennel] session ") and lines[1].endswith(" started")
    calls = [line for line in lines if line.startswith("[assistant] calls run_code")]
    assert len(calls) == 3, transcript
    tools = transcript.split("[tool] ")[1:]
    assert len(tools) == 3, transcript
    assert tools[0].startswith("exit code 0") and "    385\n" in tools[0]
    assert "wrote 21 bytes" in tools[1]  # `total` survived from the first call
    assert "result.txt" in tools[2] and "sum of squares = 385" in tools[2]
    assert ("[assistant] The sum of the squares of 1 to 10 is 385. /workspace/result.txt reads "
            "back as 'sum of squares = 385'.") in lines
    assert lines[-1].startswith("[kennel] session ") and lines[-1].endswith(" closed")
    assert lines[1].split()[2] == lines[-1].split()[2]  # one session throughout


def test_agent_loop_example_against_the_test_server(server, client):
    env = dict(os.environ, KENNEL_TOKEN=server.token)
    env.pop("KENNEL_URL", None)
    transcript = _run(["--server", server.url], env)
    _check(transcript)
    session_id = transcript.splitlines()[1].split()[2]
    assert session_id not in [s.id for s in client.list_sessions()]  # the example closed it


def test_agent_loop_example_starts_its_own_server():
    env = dict(os.environ, KENNEL_BIN=str(_kennel_bin()))
    env.pop("KENNEL_TOKEN", None)
    _check(_run(["--start-server"], env))
