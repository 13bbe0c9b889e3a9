"""Terminals in a session (``session.pty``, ``session.terminals``) over the WebSocket, against
the real server, with PyPI's websockets as the SDK's client."""

import asyncio
import os

import pytest

from kennel import AsyncClient, BadRequest, NotFound


def _needs_websockets():
    """websockets is the SDK's dependency for terminals: missing, these tests skip (fail
    under CI=true, where the machine is set up by scripts/setup-ci.sh)."""
    try:
        import websockets  # noqa: F401
    except ImportError:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip("PyPI's websockets is not installed for this python (pip install websockets)")


@pytest.fixture
def session(client):
    _needs_websockets()
    with client.session() as s:
        try:
            s.terminals.list()
        except NotFound:
            pytest.skip("terminals not on this server yet")
        yield s


def test_a_shell_runs_what_is_typed(session):
    with session.pty() as term:
        term.send("echo $((6*7))\n")
        # The typed line echoes as `$((6*7))`: only the shell's answer has 42.
        assert term.read_until(b"42").endswith(b"42")
        [info] = [t for t in session.terminals.list() if t.pid == term.pid]
        assert info.terminal and info.running and info.tty == {"cols": 80, "rows": 24}


def test_resize_is_what_stty_reports(session):
    with session.pty(cols=80, rows=24) as term:
        term.send("stty size\n")
        term.read_until(b"24 80")
        term.resize(100, 30)
        term.send("stty size\n")
        term.read_until(b"30 100")
        with pytest.raises(BadRequest):
            term.resize(0, 0)
        session.terminals.resize(term.pid, 120, 40)
        term.send("stty size\n")
        term.read_until(b"40 120")


def test_reattaching_replays_what_was_shown(session):
    term = session.pty()
    term.send("echo mark-$((40+2))\n")
    term.read_until(b"mark-42")
    term.close()
    with session.terminals.attach(term.pid) as again:
        shown = again.read_until(b"mark-42")
        assert b"echo mark-$((40+2))" in shown  # the typed line came back too
        again.send("echo still-$((1+1))\n")
        again.read_until(b"still-2")


def test_exit_and_kill_end_terminals(session):
    with session.pty() as term:
        term.send("exit 3\n")
        rest = b"".join(term)
        assert (term.exited, term.exit_code, term.signal) == (True, 3, None), rest
    killed = session.pty()
    killed.kill()
    assert [t.pid for t in session.terminals.list() if t.running and t.pid == killed.pid] == []
    with pytest.raises(NotFound):
        session.terminals.attach(999999)
    with pytest.raises(NotFound):
        session.terminals.kill(999999)


def test_a_tty_process_is_reached_as_a_terminal(session):
    p = session.processes.start(cmd="read x; echo got-$x", tty=True, cols=90, rows=20)
    with session.processes.attach(p.pid) as term:
        term.send("hi\n")
        term.read_until(b"got-hi")
        assert b"".join(term).strip() == b""
        assert term.exit_code == 0


def test_async_pty(server):
    _needs_websockets()

    async def go():
        async with AsyncClient(server.url, token=server.token) as client:
            async with client.session() as s:
                try:
                    await s.terminals.list()
                except NotFound:
                    pytest.skip("terminals not on this server yet")
                async with s.pty(cols=100, rows=30) as term:
                    await term.send("stty size; echo $((6*7))\n")
                    await term.read_until(b"30 100")
                    await term.read_until(b"42")
                    await term.resize(81, 25)
                    await term.send(b"stty size\n")
                    await term.read_until(b"25 81")
                async with s.terminals.attach(term.pid) as again:
                    await again.read_until(b"25 81")  # replayed
                    await again.kill()
                assert [t.pid for t in await s.terminals.list() if t.running] == []

    asyncio.run(go())
