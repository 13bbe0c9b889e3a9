"""The Python SDK against the real `kennel serve` (see conftest.py), plus a few offline checks
of error mapping and stream parsing with httpx's MockTransport."""

import asyncio
import os
import time

import httpx
import pytest

import kennel
from kennel import (AsyncClient, BadRequest, Busy, Client, ExecResult, Forbidden, KennelError, NotFound,
                    OutputChunk, RunResult, Unauthorized)


# -- one-shot runs -------------------------------------------------------------------------

def test_run_code_returns_output_exit_code_and_isolation(client):
    r = client.run_code("print(6*7)")
    assert isinstance(r, RunResult)
    assert r.stdout == "42\n" and r.stderr == ""
    assert r.exit_code == 0 and r.signal is None and r.ok
    assert not r.timed_out and not r.oom_killed
    assert r.stdout_bytes == 3 and not r.stdout_truncated
    iso = r.isolation
    assert isinstance(iso, kennel.Isolation)
    assert iso.tier == "native"
    assert {"user", "mount", "pid", "network"} <= set(iso.namespaces)
    assert iso.seccomp_enforced and iso.no_new_privs
    # The small default set, held inside the sandbox's user namespace only.
    assert "CAP_CHOWN" in iso.capabilities and "CAP_SYS_ADMIN" not in iso.capabilities
    assert iso.raw["seccomp"]["enforced"] is True  # the raw dict is kept
    assert r.raw["stdout"] == "42\n"
    assert r.network_log == []

    r = client.run_code("import sys; print('oops', file=sys.stderr); sys.exit(3)")
    assert r.exit_code == 3 and r.stderr == "oops\n" and not r.ok


def test_denied_calls_are_reported_and_a_tripwire_kills(client):
    probe = "import ctypes, subprocess\nlibc = ctypes.CDLL(None)\n" \
            "libc.syscall(101, 0, 0, 0); libc.syscall(101, 0, 0, 0)\n" \
            "subprocess.run(['sdk-probe'], executable='/bin/true')\nprint('after')"
    r = client.run_code(probe)
    assert r.stdout == "after\n" and r.killed_by is None
    assert r.denied_syscalls == {"ptrace": 2}
    assert r.security_events["syscalls_watched"] is True
    assert r.exec_log == [{"path": "/bin/true", "argv0": "sdk-probe"}]
    r = client.run_code(probe, on_violation="kill")
    assert r.killed_by == "tripwire:ptrace" and r.signal == 9 and r.stdout == ""
    assert r.denied_syscalls == {"ptrace": 1}


def test_run_code_in_other_languages_with_stdin_and_env(client):
    r = client.run_code("echo $((6*7)) $GREETING; cat", "bash", stdin="from stdin",
                        env={"GREETING": "hello"})
    assert r.exit_code == 0, r.stderr
    assert r.stdout == "42 hello\nfrom stdin"
    r = client.run_code("echo sh-$0", "sh")
    assert r.stdout.startswith("sh-")


def test_run_command_runs_an_argv(client):
    r = client.run_command(["/bin/echo", "a b", "c"])
    assert r.exit_code == 0 and r.stdout == "a b c\n"


def test_files_in_and_collect_out_round_trip_bytes(client):
    blob = bytes(range(256)) * 3  # not UTF-8: sent as base64
    code = (
        "import pathlib\n"
        "data = pathlib.Path('/workspace/in.bin').read_bytes()\n"
        "note = pathlib.Path('/workspace/note.txt').read_text()\n"
        "pathlib.Path('/workspace/out.bin').write_bytes(data[::-1])\n"
        "pathlib.Path('/tmp/out.txt').write_text(note.upper())\n"
        "print(len(data), note)\n"
    )
    r = client.run_code(code, files={"/workspace/in.bin": blob, "/workspace/note.txt": "héllo"},
                        collect=["/workspace/out.bin", "/tmp/out.txt", "/workspace/missing"])
    assert r.exit_code == 0, r.stderr
    assert r.stdout == f"{len(blob)} héllo\n"
    out = r.file("/workspace/out.bin")
    assert out.data == blob[::-1] and out.size == len(blob) and not out.truncated
    txt = r.file("/tmp/out.txt")
    assert txt.data == "HÉLLO".encode() and txt.text == "HÉLLO"
    missing = r.file("/workspace/missing")
    assert missing.data is None and missing.error
    with pytest.raises(KeyError):
        r.file("/workspace/never-asked")


def test_timeouts_report_timed_out(client):
    started = time.monotonic()
    r = client.run_code("import time; time.sleep(30)", limits={"timeout": 1})
    assert r.timed_out and r.exit_code is None and not r.ok
    assert time.monotonic() - started < 15
    r = client.run_code("sleep 30", "bash", limits={"timeout": "500ms"})
    assert r.timed_out


# -- streaming ------------------------------------------------------------------------------

STREAMED = (
    "import sys, time\n"
    "print('first', flush=True)\n"
    "print('warn', file=sys.stderr, flush=True)\n"
    "time.sleep(2)\n"
    "print('second', flush=True)\n"
)


def test_stream_code_yields_chunks_before_the_end_and_then_the_result(client):
    started = time.monotonic()
    chunks = []
    with client.stream_code(STREAMED) as stream:
        for chunk in stream:
            assert isinstance(chunk, OutputChunk)
            chunks.append((time.monotonic() - started, chunk))
    ended = time.monotonic() - started
    result = stream.result
    assert isinstance(result, RunResult) and stream.done
    assert result.exit_code == 0 and result.stdout == "first\nsecond\n"
    assert result.stderr == "warn\n"
    out = b"".join(c.data for _, c in chunks if c.stream == "stdout")
    err = b"".join(c.data for _, c in chunks if c.stream == "stderr")
    assert out == b"first\nsecond\n" and err == b"warn\n"
    first_at = next(t for t, c in chunks if b"first" in c.data)
    assert first_at < ended - 1.0, f"first chunk at {first_at:.2f}s, stream ended {ended:.2f}s"
    assert all(c.text == c.data.decode() for _, c in chunks)


def test_stream_result_reads_the_rest_when_asked_early(client):
    stream = client.stream_code("print('a'); print('b')")
    assert not stream.done
    assert stream.result.stdout == "a\nb\n"
    assert list(stream) == []


def test_stream_keeps_bytes_that_are_not_utf8(client):
    stream = client.stream_code("import sys; sys.stdout.buffer.write(b'\\xff\\x00ok')")
    data = b"".join(c.data for c in stream)
    assert data == b"\xff\x00ok"
    assert stream.result.stdout_bytes == 4


def test_a_refused_stream_raises_before_iteration(client):
    with pytest.raises(BadRequest) as e:
        client.stream_code("print(1)", limits={"bogus": 1})
    assert e.value.status == 400 and "bogus" in e.value.message


# -- sessions -------------------------------------------------------------------------------

def test_sessions_keep_python_state_and_run_shell(client):
    with client.session() as s:
        assert isinstance(s.info, kennel.SessionInfo) and s.info.id == s.id
        assert s.info.limits["timeout"]
        r = s.run_code("import math\nx = 41")
        assert isinstance(r, ExecResult) and r.exit_code == 0
        assert r.interpreter is not None and not r.interpreter.crashed
        r = s.run_code("def f(v):\n    return v + 1\nprint(f(x), math.pi > 3)")
        assert r.stdout == "42 True\n"
        r = s.run_command("echo $((6*7)); pwd; echo err >&2")
        assert r.stdout == "42\n/workspace\n" and r.stderr == "err\n" and r.exit_code == 0
        r = s.run_command(["printf", "%s|", "a b", "c"])
        assert r.stdout == "a b|c|"
        r = s.run_code("print(input())", stdin="typed\n")
        assert r.stdout == "typed\n"
        assert s.refresh().expires_in_s > 0


def test_session_file_helpers_round_trip(client):
    blob = b"\x00\x01\xfe\xff binary"
    with client.session() as s:
        s.write_file("/workspace/data/blob.bin", blob)
        s.write_file("workspace/note.txt", "héllo")
        s.write_file("rel.txt", "relative")  # relative: under /workspace
        s.write_file("/tmp/t.txt", b"tmp")
        assert s.read_file("/workspace/data/blob.bin") == blob
        assert s.read_file("/workspace/note.txt") == "héllo".encode()
        assert s.read_file("/workspace/rel.txt") == b"relative"
        assert s.read_file("/tmp/t.txt") == b"tmp"
        # The code sees what the helpers wrote, and the helpers see what the code wrote.
        r = s.run_code("print(open('/workspace/data/blob.bin','rb').read() == %r)\n"
                       "open('/workspace/made.txt','w').write('by code')" % blob)
        assert r.stdout == "True\n", r.stderr
        assert s.read_file("made.txt") == b"by code"
        names = {e.name: e for e in s.list_files()}
        assert {"data", "note.txt", "rel.txt", "made.txt"} <= set(names)
        assert names["data"].type == "dir" and names["note.txt"].size == len("héllo".encode())
        assert [e.name for e in s.list_files("/workspace/data")] == ["blob.bin"]
        s.delete_file("/workspace/note.txt")
        with pytest.raises(NotFound) as e:
            s.read_file("/workspace/note.txt")
        assert e.value.status == 404 and "no such file" in e.value.message
        with pytest.raises(BadRequest):
            s.read_file("/etc/passwd")


def test_session_context_manager_closes_the_session(client):
    with client.session() as s:
        sid = s.id
        assert sid in [i.id for i in client.list_sessions()]
        assert client.get_session(sid).id == sid
    assert s.closed
    assert sid not in [i.id for i in client.list_sessions()]
    with pytest.raises(NotFound):
        client.get_session(sid)
    s.close()  # closing again does nothing


def test_session_closes_even_when_the_block_raises(client):
    with pytest.raises(ZeroDivisionError):
        with client.session() as s:
            sid = s.id
            1 / 0
    assert sid not in [i.id for i in client.list_sessions()]


def test_session_stream_and_timeout(client):
    with client.session() as s:
        s.run_code("x = 1")
        stream = s.stream("import time\nprint('a', flush=True)\ntime.sleep(0.5)\nprint(x)")
        chunks = list(stream)
        assert b"".join(c.data for c in chunks) == b"a\n1\n"
        assert isinstance(stream.result, ExecResult) and stream.result.stdout == "a\n1\n"
        r = s.run_code("import time; time.sleep(30)", timeout=1)
        assert r.timed_out and r.exit_code is None
        # A timeout interrupts the code and keeps the session and its state.
        assert s.run_code("print(x + 1)").stdout == "2\n"


def test_rich_results_and_errors_as_data(client):
    with client.session() as s:
        r = s.run_code("class H:\n    def _repr_html_(self): return '<b>h</b>'\ndisplay(H())\n6 * 7")
        assert [o.kind for o in r.results] == ["display", "value"], r.results
        assert isinstance(r.results[0], kennel.RichOutput) and r.results[0].html == "<b>h</b>"
        assert r.value.text == "42" and r.error is None and not r.results_truncated
        r = s.run_code("{}['missing']")
        assert isinstance(r.error, kennel.ExecError) and r.error.name == "KeyError"
        assert r.error.value == "'missing'" and r.error.traceback[-1] == "KeyError: 'missing'"
        with s.stream("display(1)\nprint('p')\n2") as stream:
            pieces = list(stream)
        assert [type(p).__name__ for p in pieces] == ["RichOutput", "OutputChunk", "RichOutput"]
        assert [o.text for o in stream.result.results] == ["1", "2"]
        with pytest.raises(ValueError):
            stream.result.results[0].save("/dev/null")  # text only: no image to save


def test_a_rich_run_has_rich_results(client):
    r = client.run_code("print('p')\n6 * 7", rich=True)
    assert r.stdout == "p\n" and r.value.text == "42" and r.error is None, r
    r = client.run_code("1 / 0", rich=True)
    assert r.error.name == "ZeroDivisionError" and r.results == []
    assert client.run_code("6 * 7").results == []  # a plain run has none


def test_interrupt_stops_the_running_code_and_keeps_the_session(client):
    import threading

    with client.session() as s:
        s.run_code("kept = 5")
        timer = threading.Timer(0.5, s.interrupt)
        timer.start()
        started = time.monotonic()
        r = s.run_code("import time\nwhile True: time.sleep(0.01)", timeout=30)
        timer.join()
        assert time.monotonic() - started < 5
        assert not r.timed_out and r.error.name == "KeyboardInterrupt", r
        assert s.run_code("kept").value.text == "5"
        s.interrupt()  # nothing runs: nothing happens
        code = "import time\nwhile True:\n    try:\n        time.sleep(30)\n    except KeyboardInterrupt:\n        pass"
        timer = threading.Timer(0.5, s.cancel)
        timer.start()
        started = time.monotonic()
        r = s.run_code(code, timeout=60)  # shrugs off SIGINT: the cancel kills it past 2 s
        timer.join()
        # A cancel is not a timeout (it said timed_out before).
        assert time.monotonic() - started < 10 and r.cancelled and not r.timed_out, r


def test_a_shell_session_keeps_its_directory_and_exports(client):
    with client.session() as s:
        s.run_command("mkdir -p /workspace/proj && cd /workspace/proj && export STAGE=two")
        r = s.run_command("pwd; echo $STAGE")
        assert r.stdout == "/workspace/proj\ntwo\n", r


def test_directories_go_in_and_out_as_archives(client, tmp_path):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("VALUE = 7\n")
    (src / "notes.txt").write_text("hello")
    with client.session() as s:
        s.upload_dir(str(src), "/workspace/app")
        r = s.run_code("import sys; sys.path.insert(0, '/workspace/app')\nimport pkg.mod\npkg.mod.VALUE")
        assert r.value.text == "7", r
        s.run_command("echo made > /workspace/app/out.txt")
        dest = tmp_path / "dest"
        s.download_dir("app", str(dest))
        assert (dest / "out.txt").read_text() == "made\n"
        assert (dest / "pkg" / "mod.py").read_text() == "VALUE = 7\n"
        with pytest.raises(BadRequest):
            s.upload_archive(b"not a tar archive", "/workspace/x")


def test_async_rich_results_and_interrupt(server):
    async def go():
        async with AsyncClient(server.url, token=server.token) as client:
            async with client.session() as s:
                r = await s.run_code("6 * 7")
                assert r.value.text == "42"
                running = asyncio.ensure_future(s.run_code("import time; time.sleep(30)", timeout=60))
                await asyncio.sleep(0.5)
                await s.interrupt()
                r = await running
                assert r.error.name == "KeyboardInterrupt", r

    asyncio.run(go())


# -- errors ---------------------------------------------------------------------------------

def test_bad_limits_raise_with_the_servers_message(client):
    with pytest.raises(KennelError) as e:
        client.run_code("print(1)", limits={"bogus": 1})
    err = e.value
    assert isinstance(err, BadRequest) and err.status == 400 and err.code == "bad_request"
    assert "unknown field `bogus`" in err.message
    assert err.message in str(err)
    with pytest.raises(BadRequest) as e:
        client.run_code("print(1)", limits={"timeout": 400})  # the server's maximum is 300s
    assert "limits.timeout" in e.value.message and "maximum" in e.value.message


def test_an_image_the_token_may_not_use_is_forbidden(client):
    # The test server lists no images for its token.
    with pytest.raises(Forbidden) as e:
        client.run_code("print(1)", image="no-such-image")
    assert e.value.status == 403 and e.value.code == "forbidden"
    assert "no-such-image" in e.value.message
    with pytest.raises(Forbidden):
        client.create_session(image="no-such-image")


MISSING_MICROVM_BASE = (
    "this host cannot enforce the microvm tier: its base image microvm-base is not built here\n"
    "hint: run `kennel vm prepare` (as root), which builds it")


def test_a_microvm_run_on_a_server_without_its_guest_is_unsupported(client):
    # The test server's state directory is its own (conftest.py): no image, no prepared VM.
    # The tier reaches the server, which says what the host lacks (503) and how to fix it.
    with pytest.raises(KennelError) as e:
        client.run_code("print(1)", tier="microvm")
    assert e.value.status == 503 and e.value.code == "unsupported"
    assert e.value.message == MISSING_MICROVM_BASE
    # Streamed, the run is accepted first: the refusal is the stream's error event.
    stream = client.stream_command(["/bin/true"], tier="microvm")
    with pytest.raises(KennelError) as e:
        stream.wait()
    assert e.value.status is None and e.value.code == "unsupported"
    assert e.value.message == MISSING_MICROVM_BASE
    with pytest.raises(BadRequest) as e:
        client.run_code("print(1)", tier="vm")  # checked by the server, not the SDK
    assert e.value.message.startswith(
        "invalid JSON body: `tier`: unknown variant `vm`, expected one of `native`, `oci`, "
        "`microvm`")


def test_unknown_session_is_not_found(client):
    with pytest.raises(NotFound) as e:
        client.get_session("0" * 32)
    assert e.value.status == 404 and e.value.code == "not_found"
    assert "no session" in e.value.message
    with pytest.raises(NotFound):
        client.attach("nope")
    with pytest.raises(NotFound):
        client.delete_session("nope")


def test_wrong_or_missing_token_is_unauthorized(server, monkeypatch):
    monkeypatch.delenv("KENNEL_TOKEN", raising=False)
    for token in ("wrong-token-0123456789", None):
        with Client(server.url, token=token) as bad:
            with pytest.raises(Unauthorized) as e:
                bad.run_code("print(1)")
            assert e.value.status == 401 and e.value.code == "unauthorized"
            assert e.value.message == "a valid bearer token is required"
            assert bad.health()["status"] == "ok"  # /healthz needs no token


def test_token_from_the_environment(server, monkeypatch):
    monkeypatch.setenv("KENNEL_TOKEN", server.token)
    with Client(server.url) as c:
        assert c.run_code("print('env token')").stdout == "env token\n"


# -- async ----------------------------------------------------------------------------------

def test_async_client_basics(server):
    async def main():
        async with AsyncClient(server.url, token=server.token, timeout=60) as client:
            r = await client.run_code("print(6*7)")
            assert r.stdout == "42\n" and r.exit_code == 0 and r.isolation.tier == "native"

            r = await client.run_code("import pathlib; pathlib.Path('/workspace/o').write_bytes("
                                      "pathlib.Path('/workspace/i').read_bytes() * 2)",
                                      files={"/workspace/i": b"\xff\x01"},
                                      collect=["/workspace/o"])
            assert r.file("/workspace/o").data == b"\xff\x01\xff\x01"

            r = await client.run_command(["/bin/echo", "argv"])
            assert r.stdout == "argv\n"

            stream = await client.stream_code(STREAMED)
            with pytest.raises(RuntimeError):
                stream.result  # not finished yet
            chunks = [c async for c in stream]
            assert b"".join(c.data for c in chunks if c.stream == "stdout") == b"first\nsecond\n"
            assert stream.result.exit_code == 0 and stream.result.stdout == "first\nsecond\n"

            async with client.session() as s:
                sid = s.id
                await s.run_code("y = 20")
                assert (await s.run_code("print(y * 2 + 2)")).stdout == "42\n"
                assert (await s.run_command("echo bash")).stdout == "bash\n"
                await s.write_file("/workspace/b.bin", b"\x00\xff")
                assert await s.read_file("/workspace/b.bin") == b"\x00\xff"
                assert "b.bin" in [e.name for e in await s.list_files()]
                await s.delete_file("/workspace/b.bin")
                with pytest.raises(NotFound):
                    await s.read_file("/workspace/b.bin")
                st = await s.stream("print(y)")
                assert [c.data async for c in st] == [b"20\n"]
                assert st.result.stdout == "20\n"
                assert (await s.run_code("import time; time.sleep(30)", timeout=1)).timed_out
                assert sid in [i.id for i in await client.list_sessions()]
            assert sid not in [i.id for i in await client.list_sessions()]

            s = await client.session()
            assert (await client.get_session(s.id)).id == s.id
            await s.close()
            with pytest.raises(NotFound):
                await client.get_session(s.id)

            r = await client.run_code("import time; time.sleep(30)", limits={"timeout": 1})
            assert r.timed_out

            with pytest.raises(BadRequest) as e:
                await client.run_code("print(1)", limits={"bogus": 1})
            assert "unknown field `bogus`" in e.value.message
            with pytest.raises(BadRequest):
                await client.stream_code("print(1)", limits={"bogus": 1})
            with pytest.raises(NotFound):
                await client.get_session("nope")

        async with AsyncClient(server.url, token="wrong-token-0123456789") as bad:
            with pytest.raises(Unauthorized):
                await bad.list_sessions()

    asyncio.run(main())


# -- offline: error mapping and stream parsing ----------------------------------------------

def _mock_client(handler):
    # No retries: these tests check how one answer is read (tests/test_retries.py has them).
    return Client("http://kennel.test", token="t" * 16, retries=0,
                  http_client=httpx.Client(base_url="http://kennel.test",
                                           transport=httpx.MockTransport(handler)))


def test_busy_carries_retry_after():
    def handler(request):
        return httpx.Response(429, headers={"Retry-After": "2"},
                              json={"error": {"code": "busy", "message": "too many runs at once"}})

    with pytest.raises(Busy) as e:
        _mock_client(handler).run_code("print(1)")
    assert e.value.status == 429 and e.value.retry_after == 2.0
    assert e.value.message == "too many runs at once"


def test_a_non_json_error_still_raises_with_its_body():
    def handler(request):
        return httpx.Response(502, text="bad gateway from a proxy")

    with pytest.raises(KennelError) as e:
        _mock_client(handler).list_sessions()
    assert e.value.status == 502 and "bad gateway" in e.value.message


def test_an_error_event_ends_the_stream_with_the_servers_message():
    body = (b": keep-alive\n\n"
            b"event: stdout\ndata: {\"text\":\"hi\\n\",\"b64\":\"aGkK\"}\n\n"
            b"event: error\ndata: {\"code\":\"sandbox_failed\",\"message\":\"it broke\"}\n\n")

    def handler(request):
        assert request.url.params["stream"] == "true"
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    stream = _mock_client(handler).stream_code("print('hi')")
    assert next(stream).data == b"hi\n"
    with pytest.raises(KennelError) as e:
        next(stream)
    assert e.value.code == "sandbox_failed" and e.value.message == "it broke"
    with pytest.raises(KennelError):
        stream.result


def test_request_bodies_use_text_and_base64():
    seen = {}

    def handler(request):
        import json
        seen.update(json.loads(request.content))
        return httpx.Response(200, json={"exit_code": 0, "stdout": "", "files": []})

    _mock_client(handler).run_code("x", files={"/workspace/a": "t", "/workspace/b": b"\xff"},
                                   collect=["/workspace/a"], network=["pypi.org"],
                                   limits={"timeout": 2.5, "memory": "64M"})
    assert seen["files"] == {"/workspace/a": {"text": "t"}, "/workspace/b": {"base64": "/w=="}}
    assert seen["network"] == {"mode": "allow", "allow": ["pypi.org"]}
    assert seen["limits"] == {"timeout": "2.5s", "memory": "64M"}
    assert seen["language"] == "python" and seen["collect"] == ["/workspace/a"]


def test_leaving_a_stream_early_frees_it(client):
    with client.stream_code("import time\nfor i in range(5):\n    print(i, flush=True)\n"
                            "    time.sleep(0.2)") as stream:
        first = next(stream)
        assert first.data.startswith(b"0")
    with pytest.raises(KennelError):
        stream.result  # closed before the result came
    assert client.run_code("print('still fine')").stdout == "still fine\n"


def test_tier_and_runtime_go_into_the_body_only_when_given():
    bodies = []

    def handler(request):
        import json
        bodies.append(json.loads(request.content))
        if request.url.params.get("stream") == "true":
            return httpx.Response(200, headers={"content-type": "text/event-stream"},
                                  content=b"event: result\ndata: {\"exit_code\": 0}\n\n")
        return httpx.Response(200, json={"exit_code": 0})

    client = _mock_client(handler)
    client.run_code("x", tier="microvm")
    client.run_command(["/bin/true"], runtime="runsc")
    client.stream_code("x", tier="oci", runtime="crun").wait()
    client.stream_command(["/bin/true"], tier="native").wait()
    client.run_code("x")
    assert [(b.get("tier"), b.get("runtime")) for b in bodies] == [
        ("microvm", None), (None, "runsc"), ("oci", "crun"), ("native", None), (None, None)]
    assert "tier" not in bodies[-1] and "runtime" not in bodies[-1]
    with pytest.raises(TypeError):
        client.run_code("x", tier=3)

    async def main():
        transport = httpx.MockTransport(handler)
        async with AsyncClient("http://kennel.test", token="t" * 16,
                               http_client=httpx.AsyncClient(base_url="http://kennel.test",
                                                             transport=transport)) as aclient:
            await aclient.run_code("x", tier="microvm")
            await aclient.run_command(["/bin/true"], tier="oci", runtime="runc")
            await (await aclient.stream_code("x", tier="microvm")).wait()

    del bodies[:]
    asyncio.run(main())
    assert [(b.get("tier"), b.get("runtime")) for b in bodies] == [
        ("microvm", None), ("oci", "runc"), ("microvm", None)]


PLACEMENT = ("tier", "runtime", "platform", "image")


def test_sessions_are_placed_as_runs_are_with_only_the_fields_given():
    bodies = []
    info = {"id": "s1", "limits": {}, "isolation": {"tier": "oci", "runtime": {"name": "runsc"}},
            "ended": {"reason": "oom_killed", "ended_at_unix_ms": 5, "signal": 9}}

    def handler(request):
        import json
        if request.method == "POST":
            bodies.append(json.loads(request.content))
        return httpx.Response(200, json=info if request.url.path.startswith("/v1/sessions")
                              else {"exit_code": 0})

    client = _mock_client(handler)
    s = client.session(runtime="runsc", platform="ptrace")
    client.create_session(tier="microvm", image="python-data", idle_ttl=5)
    client.session()
    client.run_code("x", runtime="runsc", platform="kvm")
    assert [tuple(b.get(k) for k in PLACEMENT) for b in bodies] == [
        (None, "runsc", "ptrace", None), ("microvm", None, None, "python-data"),
        (None, None, None, None), (None, "runsc", "kvm", None)]
    assert bodies[2] == {} and bodies[1]["idle_ttl"] == "5s"
    assert s.isolation.tier == "oci" and s.isolation.runtime == {"name": "runsc"}
    assert s.ended == kennel.SessionEnd("oom_killed", 5, None, 9, raw=info["ended"])
    with pytest.raises(TypeError):
        client.session(platform=1)

    async def main():
        transport = httpx.MockTransport(handler)
        async with AsyncClient("http://kennel.test", token="t" * 16,
                               http_client=httpx.AsyncClient(base_url="http://kennel.test",
                                                             transport=transport)) as aclient:
            async with aclient.session(tier="oci", runtime="crun") as a:
                assert a.isolation.runtime["name"] == "runsc" and a.ended.reason == "oom_killed"

    del bodies[:]
    asyncio.run(main())
    assert [tuple(b.get(k) for k in PLACEMENT) for b in bodies] == [("oci", "crun", None, None)]


def test_isolation_reads_the_microvm_accel_and_the_oci_runtime():
    iso = kennel.Isolation.from_dict({"tier": "microvm", "accel": "tcg", "network": "none"})
    assert iso.tier == "microvm" and iso.accel == "tcg" and iso.runtime is None
    iso = kennel.Isolation.from_dict({"tier": "oci", "runtime": {"name": "crun", "version": "1.8"}})
    assert iso.accel is None and iso.runtime == {"name": "crun", "version": "1.8"}
    r = RunResult.from_dict({"exit_code": 0, "isolation": {"tier": "microvm", "accel": "kvm"}})
    assert r.isolation.accel == "kvm"


# -- runs by id and callbacks -----------------------------------------------------------------

def test_async_runs_are_submitted_followed_and_cancelled(client):
    info = client.submit({"language": "bash", "code": "echo later"})
    assert info.status == "running" and len(info.id) == 32
    done = client.wait_run(info.id, timeout=60)
    assert done.status == "finished" and done.result.stdout == "later\n"
    long = client.submit({"language": "bash", "code": "sleep 60", "limits": {"timeout": "90s"}})
    client.cancel_run(long.id)
    cancelled = client.wait_run(long.id, timeout=30)
    assert cancelled.status == "cancelled" and cancelled.result.signal == 9
    assert client.run_code("print(1)").id is not None
    with pytest.raises(NotFound):
        client.get_run("0" * 32)


def test_async_client_submits_and_cancels(server):
    async def main():
        async with AsyncClient(server.url, token=server.token) as ac:
            info = await ac.submit({"language": "bash", "code": "sleep 60",
                                    "limits": {"timeout": "90s"}})
            await ac.cancel_run(info.id)
            for _ in range(300):
                got = await ac.get_run(info.id)
                if got.done:
                    return got
                await asyncio.sleep(0.1)
    assert asyncio.run(main()).status == "cancelled"


SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def _signed(body: bytes, ts: int, secret: str = SECRET):
    import base64, hashlib, hmac
    key = base64.b64decode(secret[len("whsec_"):])
    sig = base64.b64encode(hmac.new(key, b"msg_1." + str(ts).encode() + b"." + body,
                                    hashlib.sha256).digest()).decode()
    return {"webhook-id": "msg_1", "webhook-timestamp": str(ts), "webhook-signature": "v1," + sig}


def test_verify_webhook_takes_the_right_signature_and_rejects_others():
    body = b'{"id": "abc", "status": "lost", "created_at_unix_ms": 1}'
    now = int(time.time())
    info = kennel.verify_webhook(SECRET, _signed(body, now), body)
    assert info.id == "abc" and info.status == "lost"
    # The specification's own example.
    spec_headers = {"webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek", "webhook-timestamp": "1614265330",
                    "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="}
    with pytest.raises(kennel.WebhookVerificationError):
        kennel.verify_webhook(SECRET, spec_headers, b'{"test": 2432232314}')  # stale
    with pytest.raises(KeyError):  # the signature holds; the body is no run
        kennel.verify_webhook(SECRET, spec_headers, b'{"test": 2432232314}', now=1614265330)
    with pytest.raises(kennel.WebhookVerificationError):
        kennel.verify_webhook(SECRET, _signed(body, now), body + b" ")  # body changed
    other = "whsec_" + "QUJD" * 8
    with pytest.raises(kennel.WebhookVerificationError):
        kennel.verify_webhook(SECRET, _signed(body, now, other), body)  # wrong secret
    with pytest.raises(kennel.WebhookVerificationError):
        kennel.verify_webhook(SECRET, _signed(body, now - 600), body)  # stale


# -- named sessions ------------------------------------------------------------------------

def test_named_sessions_get_or_create_and_filter(client, server):
    with client.session(name="sdk-named", metadata={"team": "a b&c", "job": "1"}) as s:
        assert (s.name, s.metadata) == ("sdk-named", {"team": "a b&c", "job": "1"})
        with pytest.raises(kennel.Conflict) as e:
            client.session(name="sdk-named")
        assert (e.value.status, e.value.code) == (409, "conflict")
        assert e.value.message == (f'this token has a session named "sdk-named" ({s.id}): end it '
                                   'first, or send "get_or_create": true to use it')
        again = client.get_or_create("sdk-named")
        assert again.id == s.id and again.metadata == s.metadata
        with pytest.raises(kennel.Conflict) as e:
            client.get_or_create("sdk-named", limits={"memory": "128M"})
        assert e.value.message == (f'this token\'s session named "sdk-named" ({s.id}) differs '
                                   'from the one asked for in limits.memory')
        other = client.session(metadata={"team": "other"})
        try:
            assert [i.id for i in client.sessions(name="sdk-named")] == [s.id]
            assert [i.id for i in client.list_sessions(metadata={"team": "a b&c"})] == [s.id]
            assert [i.id for i in client.sessions(metadata={"team": "a b&c", "job": "2"})] == []
            assert [i.id for i in client.sessions(metadata={"team": "other"})] == [other.id]
            listed = client.sessions(name="sdk-named", metadata={"job": "1"})
            assert [(i.name, i.metadata) for i in listed] == [("sdk-named", s.metadata)]
        finally:
            other.close()
        with pytest.raises(BadRequest) as e:
            client.session(metadata={f"k{i}": "v" for i in range(17)})
        assert e.value.message == ("invalid request: `metadata` has 17 keys; a session takes "
                                   "at most 16")

    async def main():
        async with AsyncClient(server.url, token=server.token, timeout=60) as aclient:
            async with aclient.get_or_create("sdk-async", metadata={"k": "v"}) as a:
                got = await aclient.get_or_create("sdk-async")
                assert got.id == a.id and got.name == "sdk-async"
                listed = await aclient.sessions(metadata={"k": "v"})
                assert [i.id for i in listed] == [a.id]
            assert await aclient.list_sessions(name="sdk-async") == []

    asyncio.run(main())


# -- pause and resume ----------------------------------------------------------------------

def test_pause_and_resume_say_what_was_kept_and_what_came_back(client, server):
    with client.session() as s:
        s.run_code("x = 41")
        paused = s.pause(keep="frozen")
        assert (paused.keep, paused.mechanism, paused.survives_restart) == ("frozen", "freezer", False)
        assert paused.kept == {"memory": True, "processes": True, "files": True, "connections": True}
        assert s.refresh().state == "paused" and s.info.paused.generation == 1
        with pytest.raises(kennel.Conflict):
            s.pause()
        report = s.resume()
        assert (report.memory, report.files_restored, report.digests_matched) == ("resident", True, None)
        with pytest.raises(kennel.Conflict):
            s.resume()
        with pytest.raises(BadRequest) as e:
            s.pause(keep="saved")
        assert "cannot be kept `saved`" in e.value.message
        s.pause()
        assert s.run_code("print(x + 1)").stdout == "42\n"  # resumed on its own
        assert s.refresh().last_resume.generation == 2

    async def main():
        async with AsyncClient(server.url, token=server.token, timeout=60) as aclient:
            async with aclient.session(on_idle="pause") as a:
                assert (await a.pause()).keep == "frozen"
                assert (await a.resume()).memory == "resident"
                assert (await a.refresh()).on_idle == "pause"

    asyncio.run(main())


# -- live network policy -------------------------------------------------------------------

def test_a_session_network_is_locked_live_and_a_change_to_full_is_refused(client, server):
    with client.session(network=["pypi.org", "files.pythonhosted.org"]) as s:
        assert s.info.network["allow"] == ["pypi.org", "files.pythonhosted.org"]
        info = s.network.update(["pypi.org:443"])
        assert (info.network["allow"], info.network_changes) == (["pypi.org:443"], 1)
        with pytest.raises(kennel.Conflict) as e:
            s.network.update("full")
        assert "\"full\"" in e.value.message
        with pytest.raises(BadRequest):
            s.network.update(["not a rule"])
        assert s.refresh().network["allow"] == ["pypi.org:443"]
        assert s.network.update("none").network == {"mode": "none", "allow": [], "resolve": []}
        log = s.run_code("print(1)").network_log
        assert [e.protocol for e in log] == ["policy", "policy"], log
        assert log[-1].reason.startswith("the session's network changed: mode none"), log

    async def main():
        async with AsyncClient(server.url, token=server.token, timeout=60) as aclient:
            async with aclient.session(network=["pypi.org"]) as a:
                assert (await a.network.update("none")).network_changes == 1

    asyncio.run(main())

    from kennel import _common as c
    assert c.network_update_body(None, None) == {"mode": "none"}
    assert c.network_update_body(["a.test"], ["a.test:10.0.0.1"]) == {
        "mode": "allow", "allow": ["a.test"], "resolve": ["a.test:10.0.0.1"]}


# -- snapshots and forks -------------------------------------------------------------------

def test_a_snapshot_forks_into_sessions_with_its_files(client, server):
    with client.session() as s:
        s.write_file("kept.txt", "ws")
        s.run_code("open('/tmp/kept-tmp', 'w').write('tmp')")
        snap = s.snapshot(ttl="1h")
        # A native session keeps its files only, and says so.
        assert (snap.session, snap.mechanism) == (s.id, "files")
        assert snap.kept == {"memory": False, "processes": False, "files": True,
                             "connections": False}
        assert snap.fresh["boot_id"] == "host" and snap.fresh["entropy"] is True
        assert snap.state_bytes > 0 and snap.expires_at_unix_ms > snap.created_at_unix_ms
        assert client.get_snapshot(snap.id) == snap
        assert snap.id in [i.id for i in client.list_snapshots()]
        assert s.run_code("print(1)").stdout == "1\n"  # the source runs on
        forks = client.fork(snap.id, 2, metadata={"fork": "yes"})
        try:
            assert len({f.id for f in forks} | {s.id}) == 3
            for f in forks:
                assert f.metadata == {"fork": "yes"}
                assert f.read_file("kept.txt") == b"ws"
                assert f.read_file("/tmp/kept-tmp") == b"tmp"
        finally:
            for f in forks:
                f.close()
        with client.session(from_snapshot=snap.id) as one:
            assert one.run_code("print(open('kept.txt').read())").stdout == "ws\n"
        with pytest.raises(BadRequest) as e:
            client.session(from_snapshot=snap.id, tier="native")
        assert "cannot go with `from_snapshot`" in e.value.message
        client.delete_snapshot(snap.id)
        with pytest.raises(NotFound):
            client.get_snapshot(snap.id)
        assert snap.id not in [i.id for i in client.list_snapshots()]
        # session.fork: a snapshot first, then the sessions; keep_snapshot=False deletes it.
        before = {i.id for i in client.list_snapshots()}
        forks = s.fork(2, keep_snapshot=False)
        try:
            assert [f.read_file("kept.txt") for f in forks] == [b"ws", b"ws"]
        finally:
            for f in forks:
                f.close()
        assert {i.id for i in client.list_snapshots()} == before

    async def main():
        async with AsyncClient(server.url, token=server.token, timeout=60) as aclient:
            async with aclient.session() as a:
                await a.write_file("a.txt", "async")
                snap = await a.snapshot()
                assert (await aclient.get_snapshot(snap.id)).mechanism == "files"
                assert snap.id in [i.id for i in await aclient.list_snapshots()]
                forks = await aclient.fork(snap.id, 2)
                forks += await a.fork(1)
                try:
                    assert [await f.read_file("a.txt") for f in forks] == [b"async"] * 3
                finally:
                    for f in forks:
                        await f.close()
                async with aclient.session(from_snapshot=snap.id) as one:
                    assert await one.read_file("a.txt") == b"async"
                for left in await aclient.list_snapshots():
                    await aclient.delete_snapshot(left.id)
            assert await aclient.list_snapshots() == []

    asyncio.run(main())


def test_a_fork_past_the_session_quota_is_busy_and_makes_none():
    from conftest import CONFIG, _serving

    with _serving(CONFIG + "[quota]\nsessions = 3\n") as quota_server:
        with Client(quota_server.url, token=quota_server.token, timeout=60, retries=0) as c:
            with c.session() as s:
                snap = s.snapshot()
                with pytest.raises(Busy) as e:
                    c.fork(snap.id, 3)
                assert (e.value.status, e.value.code) == (429, "quota_exceeded")
                assert "3 more would pass it (none was made)" in e.value.message
                assert [i.id for i in c.list_sessions()] == [s.id]
                with pytest.raises(Busy):
                    s.fork(3, keep_snapshot=False)  # its own snapshot goes with the refusal
                assert [i.id for i in c.list_snapshots()] == [snap.id]
                forks = c.fork(snap.id, 2)
                assert len(c.list_sessions()) == 3
                for f in forks:
                    f.close()
                c.delete_snapshot(snap.id)


def test_snapshot_and_fork_bodies_carry_only_what_is_given():
    from kennel import _common as c

    assert c.snapshot_body(None) == {} and c.snapshot_body(90) == {"ttl": "90s"}
    assert c.snapshot_body("1h") == {"ttl": "1h"}
    assert c.fork_body("snap-1", 3) == {"from_snapshot": "snap-1", "count": 3}
    assert c.session_body(from_snapshot="snap-1", metadata={"k": "v"}) == {
        "from_snapshot": "snap-1", "metadata": {"k": "v"}}
    with pytest.raises(TypeError):
        c.fork_body("snap-1", True)
    assert c.snapshot_url("a/b") == "/v1/snapshots/a%2Fb"
# -- volumes -------------------------------------------------------------------------------

@pytest.mark.skipif(os.geteuid() != 0, reason="a volume needs a root server (a loop device and an ext4 mount)")
def test_a_volume_keeps_data_between_a_run_and_a_session(client):
    made = client.create_volume("sdk-data", "32M")
    assert isinstance(made, kennel.VolumeInfo)
    assert (made.name, made.size_bytes, made.kind, made.attached) == ("sdk-data", 32 << 20, "host", [])
    try:
        r = client.run_command(["sh", "-c", "echo kept > /workspace/data/f"],
                               volumes=[("sdk-data", "/workspace/data")])
        assert r.ok, r
        assert r.isolation.raw["volumes"] == [{"name": "sdk-data", "path": "/workspace/data", "read_only": False}]
        with client.session(volumes=[{"name": "sdk-data", "path": "/tmp/d", "read_only": True}]) as s:
            assert s.run_code("cat /tmp/d/f", language="bash").stdout == "kept\n"
            shown = client.get_volume("sdk-data")
            assert shown.attached == [{"by": f"session {s.id}", "read_only": True}]
            with pytest.raises(kennel.Conflict):
                client.delete_volume("sdk-data")
        assert [v.name for v in client.list_volumes()] == ["sdk-data"]
    finally:
        client.delete_volume("sdk-data")
    with pytest.raises(NotFound):
        client.get_volume("sdk-data")
