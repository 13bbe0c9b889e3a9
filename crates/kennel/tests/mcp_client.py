"""Drives `kennel mcp` with the official MCP Python SDK (PyPI `mcp`), as an MCP client would.

Usage: /usr/bin/python3 mcp_client.py KENNEL_BINARY [--leave-open] [kennel mcp args...]
The server gets this process's environment (KENNEL_TOKEN for `--server`).
Prints one line per check; exits non-zero (with a traceback) on the first failure.
With --leave-open it only opens two sessions, prints "opened ID" for each, and leaves them
open: the server must close them when this client goes away.
"""

import asyncio
import os
import sys
import time

from mcp import ClientSession, MCPError, StdioServerParameters
from mcp.client.stdio import stdio_client

INVALID_PARAMS = -32602
TOOLS = {
    "run_code",
    "run_command",
    "create_session",
    "session_exec",
    "close_session",
    "pause_session",
    "resume_session",
    "snapshot_session",
    "fork_session",
    "write_file",
    "read_file",
    "list_files",
    "run_python_code",
    "download_archive",
    "upload_archive",
    "start_process",
    "list_processes",
    "read_process_output",
    "kill_process",
}


def text_of(result):
    return "\n".join(c.text for c in result.content if c.type == "text")


def ok(what, result):
    assert not result.is_error, f"{what}: unexpected error result: {text_of(result)}"
    assert result.structured_content is not None, f"{what}: no structured content"
    print(f"ok   {what}")
    return result


def program_failed(what, result, *needles):
    """The code failed (non-zero exit, timeout): a normal result that says so, so that an
    agent framework hands it to the model instead of counting a failing tool."""
    text = text_of(ok(what, result))
    for n in needles:
        assert n in text, f"{what}: {n!r} not in {text!r}"
    return result


def tool_error(what, result, *needles):
    text = text_of(result)
    assert result.is_error, f"{what}: expected an error result, got: {text}"
    for n in needles:
        assert n in text, f"{what}: {n!r} not in {text!r}"
    print(f"ok   {what}: {text.splitlines()[0]}")
    return result


async def protocol_error(what, call, code=INVALID_PARAMS):
    try:
        result = await call
    except MCPError as e:
        assert e.code == code, f"{what}: expected JSON-RPC code {code}, got {e.code} {e.message}"
        print(f"ok   {what}: {e.code} {e.message}")
        return
    raise AssertionError(f"{what}: expected a JSON-RPC error, got {text_of(result)!r}")


async def main(argv):
    run = checks
    if "--leave-open" in argv:
        argv.remove("--leave-open")
        run = leave_open
    # `mcp_client.py KENNEL [ARGS...]` drives `KENNEL mcp ARGS` over stdio;
    # `mcp_client.py KENNEL --http URL` drives a `kennel serve`'s /mcp (token: KENNEL_TOKEN).
    if "--http" in argv:
        url = argv[argv.index("--http") + 1]
        from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
        token = os.environ.get("KENNEL_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else None
        async with create_mcp_http_client(headers=headers) as http:
            async with streamable_http_client(url, http_client=http) as streams:
                await run(streams[0], streams[1])
        return
    server = StdioServerParameters(
        command=argv[1], args=["mcp", *argv[2:]], env=dict(os.environ))
    async with stdio_client(server) as (read, write):
        await run(read, write)


async def leave_open(read, write):
    async with ClientSession(read, write) as s:
        await s.initialize()
        for n in range(2):
            r = ok("create_session", await s.call_tool("create_session", {}))
            sid = r.structured_content["session_id"]
            ok("session_exec", await s.call_tool("session_exec", {
                "session_id": sid, "language": "python", "code": f"x = {n}"}))
            print(f"opened {sid}", flush=True)
    print("left the sessions open")


async def checks(read, write):
    async with ClientSession(read, write) as s:
        init = await s.initialize()
        assert init.server_info.name == "kennel", init.server_info
        assert init.capabilities.tools is not None

        listed = await s.list_tools()
        tools = {t.name: t for t in listed.tools}
        assert TOOLS <= tools.keys(), f"missing tools: {TOOLS - tools.keys()}"
        for name in TOOLS:
            t = tools[name]
            assert t.description and len(t.description) > 40, name
            assert t.input_schema.get("type") == "object", name
            assert t.output_schema and t.output_schema.get("type") == "object", name
        lang = tools["run_code"].input_schema["properties"]["language"]
        assert "$ref" in lang or "enum" in lang or "oneOf" in lang, lang
        print(f"ok   list_tools: {sorted(tools)}")

        # One-shot runs.
        r = ok("run_code python", await s.call_tool(
            "run_code", {"language": "python", "code": "print(6 * 7)"}))
        assert "42" in text_of(r) and "exit status 0" in text_of(r), text_of(r)
        assert r.structured_content["exit_code"] == 0
        assert r.structured_content["stdout"] == "42\n"

        r = ok("run_code with files", await s.call_tool("run_code", {
            "language": "bash",
            "code": "cat data/in.txt; wc -c < /tmp/t.txt",
            "files": {"data/in.txt": "from the client\n", "/tmp/t.txt": "abcd"},
        }))
        assert "from the client" in text_of(r) and "4" in r.structured_content["stdout"]

        png = "\\x89PNG\\r\\n\\x1a\\n" + "\\0" * 16
        r = ok("run_code collect", await s.call_tool("run_code", {
            "language": "python",
            "code": f"open('out.txt', 'w').write('made')\nopen('/tmp/p.png', 'wb').write(b'{png}')",
            "collect": ["out.txt", "/tmp/p.png"], "capabilities": "none"}))
        assert [f["path"] for f in r.structured_content["files"]] == ["/workspace/out.txt", "/tmp/p.png"]
        assert "collected /workspace/out.txt (4 bytes):\nmade" in text_of(r), text_of(r)
        images = [c for c in r.content if c.type == "image"]
        assert [c.mime_type for c in images] == ["image/png"], r.content
        r = ok("run_code capabilities none", await s.call_tool("run_code", {
            "language": "bash", "code": "grep CapEff /proc/self/status", "capabilities": "none"}))
        assert "0000000000000000" in r.structured_content["stdout"], r.structured_content

        # mcp-run-python's shape: the same text its clients parse.
        r = ok("run_python_code", await s.call_tool(
            "run_python_code", {"python_code": 'print("hi")\n1+1'}))
        assert text_of(r) == ("<status>success</status>\n<output>\nhi\n</output>\n"
                              "<return_value>\n2\n</return_value>"), text_of(r)
        assert r.structured_content == {"status": "success", "output": ["hi"], "return_value": 2}
        r = ok("run_python_code async and globals", await s.call_tool("run_python_code", {
            "python_code": "import asyncio\nawait asyncio.sleep(0)\n{'n': n * 2}",
            "global_variables": {"n": 21}}))
        assert r.structured_content["return_value"] == {"n": 42}, r.structured_content
        assert '<return_value>\n{\n  "n": 42\n}\n</return_value>' in text_of(r), text_of(r)
        r = ok("run_python_code error", await s.call_tool(
            "run_python_code", {"python_code": "print('before')\n1 / 0"}))
        assert r.structured_content["status"] == "run-error"
        assert text_of(r).startswith("<status>run-error</status>\n<output>\nbefore\n</output>\n<error>\n")
        assert 'File "main.py", line 2' in r.structured_content["error"]

        # Output as it comes, as progress notifications, when the client asks (a progress
        # callback gives the request a progressToken).
        seen = []

        async def on_progress(progress, total, message):
            seen.append((time.monotonic(), message))

        code = "import sys, time\nprint('first')\ntime.sleep(1)\nprint('second', file=sys.stderr)"
        r = ok("run_code with progress", await s.call_tool(
            "run_code", {"language": "python", "code": code}, progress_callback=on_progress))
        out = "".join(m for _, m in seen if not m.startswith("stderr: "))
        err = "".join(m.removeprefix("stderr: ") for _, m in seen if m.startswith("stderr: "))
        assert (out, err) == ("first\n", "second\n"), seen
        first = next(t for t, m in seen if "first" in m)
        second = next(t for t, m in seen if "second" in m)
        assert second - first > 0.6, seen

        r = ok("run_command", await s.call_tool(
            "run_command", {"argv": ["/bin/echo", "hello", "world"]}))
        assert r.structured_content["stdout"] == "hello world\n"

        r = program_failed("non-zero exit", await s.call_tool(
            "run_code", {"language": "sh", "code": "echo oops >&2; exit 3"}),
            "exit status 3", "oops")
        assert r.structured_content["exit_code"] == 3

        r = program_failed("timeout", await s.call_tool("run_code", {
            "language": "python",
            "code": "import time\nprint('started', flush=True)\ntime.sleep(30)",
            "timeout": "1s",
        }), "timed out after 1s", "started")
        assert r.structured_content["timed_out"] is True

        r = ok("truncation", await s.call_tool(
            "run_code", {"language": "python", "code": "print('x' * 300000)"}))
        assert "output truncated" in text_of(r), text_of(r)[:300]
        assert r.structured_content["stdout_truncated"] is True

        # A session: state persists, files go in and out.
        r = ok("create_session", await s.call_tool("create_session", {}))
        sid = r.structured_content["session_id"]
        assert sid and sid in text_of(r)

        ok("session_exec set", await s.call_tool("session_exec", {
            "session_id": sid, "language": "python", "code": "x = 41\nimport json"}))
        r = ok("session_exec state kept", await s.call_tool("session_exec", {
            "session_id": sid, "language": "python", "code": "print(x + 1)"}))
        assert r.structured_content["stdout"] == "42\n", text_of(r)

        ok("write_file", await s.call_tool("write_file", {
            "session_id": sid, "path": "in.json", "content": '{"n": 20}'}))
        ok("write_file in a new directory", await s.call_tool("write_file", {
            "session_id": sid, "path": "/tmp/a b/c.txt", "content": "deep ünïcode"}))
        r = ok("read_file back", await s.call_tool(
            "read_file", {"session_id": sid, "path": "/tmp/a b/c.txt"}))
        assert text_of(r) == "deep ünïcode", text_of(r)
        r = ok("list_files /tmp", await s.call_tool(
            "list_files", {"session_id": sid, "path": "/tmp"}))
        assert "a b" in {e["name"] for e in r.structured_content["entries"]}
        ok("session_exec uses the file", await s.call_tool("session_exec", {
            "session_id": sid, "language": "python",
            "code": "d = json.load(open('in.json'))\n"
                    "open('/workspace/out.txt', 'w').write(str(d['n'] + x))"}))
        r = ok("read_file", await s.call_tool(
            "read_file", {"session_id": sid, "path": "/workspace/out.txt"}))
        assert text_of(r) == "61", text_of(r)
        r = ok("list_files", await s.call_tool("list_files", {"session_id": sid}))
        names = {e["name"] for e in r.structured_content["entries"]}
        assert {"in.json", "out.txt"} <= names, names
        assert "out.txt" in text_of(r)

        seen.clear()
        ok("session_exec with progress", await s.call_tool("session_exec", {
            "session_id": sid, "language": "bash", "code": "echo one; sleep 0.8; echo two"},
            progress_callback=on_progress))
        assert [m for _, m in seen] == ["one\n", "two\n"], seen
        r = ok("session_exec value", await s.call_tool("session_exec", {
            "session_id": sid, "language": "python", "code": "x * 2"}))
        assert "\nvalue: 82" in text_of(r), text_of(r)
        r = program_failed("session_exec error", await s.call_tool("session_exec", {
            "session_id": sid, "language": "python", "code": "1 / 0"}),
            "error: ZeroDivisionError: division by zero")
        assert r.structured_content["error"]["name"] == "ZeroDivisionError"
        ok("session_exec png", await s.call_tool("session_exec", {
            "session_id": sid, "language": "python",
            "code": f"open('/tmp/p.png', 'wb').write(b'{png}')"}))
        r = ok("read_file an image", await s.call_tool(
            "read_file", {"session_id": sid, "path": "/tmp/p.png"}))
        assert [c.type for c in r.content] == ["text", "image"], r.content
        assert r.structured_content["mime_type"] == "image/png"

        # A whole directory out and back in, as a tar archive.
        r = ok("download_archive", await s.call_tool(
            "download_archive", {"session_id": sid, "path": "/workspace"}))
        blobs = [c.resource for c in r.content if c.type == "resource"]
        assert len(blobs) == 1 and blobs[0].mime_type == "application/x-tar", r.content
        assert r.structured_content["bytes"] > 0
        ok("upload_archive", await s.call_tool("upload_archive", {
            "session_id": sid, "path": "copy", "archive_base64": blobs[0].blob}))
        r = ok("read_file from the copy", await s.call_tool(
            "read_file", {"session_id": sid, "path": "copy/out.txt"}))
        assert text_of(r) == "61", text_of(r)
        tool_error("upload_archive of garbage", await s.call_tool("upload_archive", {
            "session_id": sid, "archive_base64": "bm90IGEgdGFy"}), "not a tar archive")

        # A background process: its answers fit the tools' output schemas (checked here).
        r = ok("start_process", await s.call_tool("start_process", {
            "session_id": sid, "cmd": "echo bg; exit 5"}))
        pid = r.structured_content["pid"]
        out = ""
        while True:
            r = ok("read_process_output", await s.call_tool("read_process_output", {
                "session_id": sid, "pid": pid,
                "stdout_offset": len(out.encode())}))
            out += r.structured_content["stdout"]
            if r.structured_content["exited"]:
                break
        assert (out, r.structured_content["exit_code"]) == ("bg\n", 5), text_of(r)
        r = ok("list_processes", await s.call_tool("list_processes", {"session_id": sid}))
        assert pid in [p["pid"] for p in r.structured_content["processes"]], text_of(r)
        r = ok("start_process sleep", await s.call_tool("start_process", {
            "session_id": sid, "argv": ["sleep", "600"]}))
        ok("kill_process", await s.call_tool("kill_process", {
            "session_id": sid, "pid": r.structured_content["pid"]}))

        ok("session_exec bash cd", await s.call_tool("session_exec", {
            "session_id": sid, "language": "bash", "code": "cd /tmp && export K=kept"}))
        r = ok("session_exec bash", await s.call_tool("session_exec", {
            "session_id": sid, "language": "bash", "code": "pwd; echo $K; ls /workspace"}))
        assert r.structured_content["stdout"].startswith("/tmp\nkept\n"), text_of(r)
        program_failed("session timeout", await s.call_tool("session_exec", {
            "session_id": sid, "language": "bash", "code": "sleep 30",
            "timeout": "1s"}), "timed out after 1s")

        # A call the client cancels cancels its exec: the next one does not wait a minute.
        running = asyncio.ensure_future(s.call_tool("session_exec", {
            "session_id": sid, "language": "python", "code": "import time\ntime.sleep(60)"}))
        await asyncio.sleep(1)
        running.cancel()
        try:
            await running
        except asyncio.CancelledError:
            pass
        started = time.monotonic()
        r = ok("session_exec after a cancelled one", await s.call_tool("session_exec", {
            "session_id": sid, "language": "python", "code": "print(x)"}))
        assert r.structured_content["stdout"] == "41\n", text_of(r)
        assert time.monotonic() - started < 10, "the cancelled exec held the session"

        tool_error("read a missing file", await s.call_tool(
            "read_file", {"session_id": sid, "path": "nope.txt"}), "no such file")
        tool_error("write outside the sandbox dirs", await s.call_tool(
            "write_file", {"session_id": sid, "path": "/etc/evil", "content": "x"}),
            "/workspace")

        # A snapshot of the session, and a session made from it with its files: both
        # answers hold to their tools' output schemas (this SDK checks them).
        r = ok("snapshot_session", await s.call_tool(
            "snapshot_session", {"session_id": sid, "ttl": "10m"}))
        assert r.structured_content["kept"]["files"] is True, r.structured_content
        snap = r.structured_content["id"]
        r = ok("fork_session", await s.call_tool(
            "fork_session", {"snapshot_id": snap, "count": 1}))
        (fork,) = r.structured_content["session_ids"]
        r = ok("read_file in the fork", await s.call_tool(
            "read_file", {"session_id": fork, "path": "/tmp/a b/c.txt"}))
        assert text_of(r) == "deep ünïcode", text_of(r)
        ok("close_session fork", await s.call_tool("close_session", {"session_id": fork}))

        ok("close_session", await s.call_tool("close_session", {"session_id": sid}))
        tool_error("exec in a closed session", await s.call_tool("session_exec", {
            "session_id": sid, "language": "python", "code": "print(1)"}), "no session")

        # Bad arguments come back as tool errors naming the problem (as the MCP spec
        # asks, so a model can correct itself), and the server carries on.
        tool_error("unknown language", await s.call_tool(
            "run_code", {"language": "cobol", "code": "DISPLAY 1"}), "cobol")
        tool_error("missing code", await s.call_tool(
            "run_code", {"language": "python"}), "code")
        tool_error("unknown field", await s.call_tool(
            "run_code", {"language": "python", "code": "1", "bogus": True}), "bogus")
        tool_error("bad timeout", await s.call_tool(
            "run_code", {"language": "python", "code": "1", "timeout": "soon"}),
            "timeout", "soon")
        tool_error("empty argv", await s.call_tool("run_command", {"argv": []}), "argv")
        # An unknown tool is a JSON-RPC error.
        await protocol_error("unknown tool", s.call_tool("rm_rf", {}))
        tool_error("timeout above the maximum", await s.call_tool(
            "run_code", {"language": "python", "code": "1", "timeout": "3h"}),
            "maximum")

        r = ok("still serving", await s.call_tool(
            "run_code", {"language": "python", "code": "print('alive')"}))
        assert r.structured_content["stdout"] == "alive\n"
    print("all MCP checks passed")


if __name__ == "__main__":
    asyncio.run(main(sys.argv))
