"""Background processes in a session (``session.processes``), against the real server."""

import asyncio
import signal

import httpx
import pytest

from kennel import AsyncClient, BadRequest, Client, NotFound

# Prints with pauses, and waits for /tmp/go before its last line, so that it is surely still
# running when listed.
PRINTER = ("echo line 1; sleep 0.2; echo line 2; sleep 0.2; "
           "while [ ! -e /tmp/go ]; do sleep 0.05; done; "
           "echo line 3; echo oops >&2; exit 7")


def _collect(events):
    out, err, last = b"", b"", None
    for ev in events:
        if ev.kind == "stdout":
            out += ev.data
        elif ev.kind == "stderr":
            err += ev.data
        last = ev
    return out, err, last


def test_a_background_process_runs_is_listed_and_its_output_read_to_its_exit(client):
    with client.session() as s:
        p = s.processes.start(cmd=PRINTER)
        assert p.pid > 1 and p.running and p.argv == ["/bin/bash", "-c", PRINTER]
        listed = {q.pid: q for q in s.processes.list()}
        assert listed[p.pid].state == "running", listed
        s.write_file("/tmp/go", "")
        out, err, last = _collect(s.processes.output(p.pid))
        assert out == b"line 1\nline 2\nline 3\n"
        assert err == b"oops\n"
        assert last.kind == "exit"
        assert (last.info.state, last.info.exit_code, last.info.signal) == ("exited", 7, None)
        assert (last.info.stdout_bytes, last.info.stderr_bytes) == (21, 5)
        # Resuming from offsets reads only what came after them.
        out, err, last = _collect(s.processes.output(p.pid, stdout_offset=14, stderr_offset=5))
        assert (out, err, last.kind) == (b"line 3\n", b"", "exit")
        [ended] = [q for q in s.processes.list() if q.pid == p.pid]
        assert (ended.state, ended.exit_code) == ("exited", 7)


def test_stdin_is_written_and_closed(client):
    with client.session() as s:
        p = s.processes.start(["cat"], stdin=True)
        assert p.stdin
        s.processes.write_stdin(p.pid, "hello ")
        s.processes.write_stdin(p.pid, b"\xffworld\n", eof=True)
        out, err, last = _collect(s.processes.output(p.pid))
        assert (out, err) == (b"hello \xffworld\n", b"")
        assert last.info.exit_code == 0
        with pytest.raises(BadRequest):
            s.processes.write_stdin(p.pid, "late")


def test_signal_and_kill_end_a_process_and_unknown_pids_are_not_found(client):
    with client.session() as s:
        termed = s.processes.start(["sleep", "600"])
        s.processes.signal(termed.pid, signal.SIGTERM)
        *_, last = s.processes.output(termed.pid)
        assert (last.info.exit_code, last.info.signal) == (None, 15)
        killed = s.processes.start(cmd="sleep 600")
        s.processes.kill(killed.pid)
        *_, last = s.processes.output(killed.pid)
        assert last.info.signal == 9
        for call in (lambda: s.processes.kill(999999),
                     lambda: list(s.processes.output(999999)),
                     lambda: s.processes.signal(1, 15)):
            with pytest.raises(NotFound):
                call()
        with pytest.raises(BadRequest):
            s.processes.signal(killed.pid, 65)
        with pytest.raises(BadRequest):
            s.processes.start(["/no/such/program"])


def test_async_processes(server):
    async def go():
        async with AsyncClient(server.url, token=server.token) as client:
            async with client.session() as s:
                p = await s.processes.start(["cat"], stdin=True)
                assert [q.pid for q in await s.processes.list() if q.running] == [p.pid]
                await s.processes.write_stdin(p.pid, "async\n", eof=True)
                events = [ev async for ev in s.processes.output(p.pid)]
                assert b"".join(ev.data for ev in events if ev.kind == "stdout") == b"async\n"
                assert events[-1].kind == "exit" and events[-1].info.exit_code == 0
                q = await s.processes.start(cmd="sleep 600")
                await s.processes.kill(q.pid)
                with pytest.raises(NotFound):
                    await s.processes.kill(999999)

    asyncio.run(go())


class _CutFirstOutput(httpx.BaseTransport):
    """The real transport, except that the first output stream breaks right after its first
    whole event, as a dropped connection would; the output URLs asked for are kept."""

    def __init__(self):
        self.inner = httpx.HTTPTransport()
        self.urls = []

    def handle_request(self, request):
        response = self.inner.handle_request(request)
        if not request.url.path.endswith("/output"):
            return response
        self.urls.append(request.url)
        if len(self.urls) > 1:
            return response
        return httpx.Response(response.status_code, headers=response.headers,
                              stream=_CutAfterOneEvent(response.stream),
                              extensions=response.extensions)


class _CutAfterOneEvent(httpx.SyncByteStream):
    def __init__(self, inner):
        self.inner = inner

    def __iter__(self):
        seen = b""
        for chunk in self.inner:
            yield chunk
            seen += chunk
            if b"\n\n" in seen:
                raise httpx.ReadError("the connection was cut")

    def close(self):
        self.inner.close()


def test_a_dropped_output_stream_resumes_after_the_last_event(server):
    cut = _CutFirstOutput()
    http = httpx.Client(base_url=server.url, transport=cut,
                        headers={"Authorization": f"Bearer {server.token}"}, timeout=60)
    with Client(http_client=http) as client, client.session() as s:
        # "b" only once /tmp/go exists: the cut comes while the stream waits after "a".
        p = s.processes.start(cmd="echo a; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo b")
        out = b""
        for ev in s.processes.output(p.pid):
            out += ev.data
            if ev.data == b"a\n":
                s.write_file("/tmp/go", "")
        assert out == b"a\nb\n"
        assert ev.kind == "exit" and ev.info.exit_code == 0
        assert [dict(u.params) for u in cut.urls] == [
            {"stdout_offset": "0", "stderr_offset": "0"},
            {"stdout_offset": "2", "stderr_offset": "0"},
        ]


def test_user_runs_execs_and_processes_as_uid_1000(client):
    with client.session() as s:
        assert s.run_command("id -u; echo $HOME", user="user").stdout == "1000\n/workspace\n"
        assert s.run_code("import os; print(os.getuid())", user="user").stdout == "1000\n"
        assert s.run_command("id -u").stdout == "0\n"
        p = s.processes.start(["id", "-u"], user="user")
        out, _, last = _collect(s.processes.output(p.pid))
        assert (out, last.info.exit_code) == (b"1000\n", 0)
        with pytest.raises(BadRequest):
            s.run_command("id -u", user="root")
