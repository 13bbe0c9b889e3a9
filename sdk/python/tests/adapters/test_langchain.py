"""kennel.adapters.langchain against a live `kennel serve`: the deepagents backend's own methods,
then `create_deep_agent` with langchain_core's fake chat model, whose tool calls the deep
agent's `execute`, `write_file`, `read_file` and `ls` tools carry out in the Kennel session."""

import asyncio
import itertools
from typing import Any, List

import pytest
from deepagents import create_deep_agent
from deepagents.backends import CompositeBackend
from deepagents.backends.protocol import ExecuteResponse
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage

import kennel
from kennel.adapters.langchain import KennelSandbox



class ScriptedModel(GenericFakeChatModel):
    """langchain_core's fake model; deepagents binds its tools, which a script needs not see."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> "ScriptedModel":
        return self


_ids = itertools.count(1)


def call(name: str, **args: Any) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"call-{next(_ids)}"}])


def tool_messages(state: dict) -> List[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


@pytest.fixture
def sandbox(client):
    with KennelSandbox(client) as sb:
        yield sb
    assert client.list_sessions() == []  # close() ended the session it opened


def test_execute_gives_combined_output_and_exit_codes(sandbox):
    r = sandbox.execute("python3 -c 'print(sum(i * i for i in range(1, 11)))'")
    assert r == ExecuteResponse(output="385\n", exit_code=0, truncated=False)
    # stderr is merged in the order it was written in
    assert sandbox.execute("echo a; echo b >&2; echo c; exit 3") == ExecuteResponse("a\nb\nc\n", 3)
    assert sandbox.execute("python3 -c 'import sys; sys.exit(7)'").exit_code == 7
    # one shell throughout: `cd` and `export` outlive the command
    assert sandbox.execute("mkdir -p sub && cd sub && export KEPT=yes").exit_code == 0
    assert sandbox.execute("echo $PWD $KEPT").output == "/workspace/sub yes\n"
    r = sandbox.execute("echo started; sleep 5", timeout=1)
    assert (r.exit_code, r.output) == (124, "started\nerror: the command timed out after 1s")
    assert sandbox.execute("echo alive").output == "alive\n"
    r = sandbox.execute("head -c 300000 /dev/zero | tr '\\0' x")
    assert r.truncated and r.exit_code == 0 and 0 < len(r.output) < 300000
    assert sandbox.execute("kill -KILL $$").exit_code == 128 + 9
    assert sandbox.execute("  ").exit_code == 1
    assert sandbox.id == sandbox.session.id


def test_upload_then_download_bytes_and_error_codes(sandbox):
    blob = bytes(range(256)) * 3
    up = sandbox.upload_files([("/workspace/data/blob.bin", blob), ("/tmp/t.txt", b"tmp\n"),
                               ("relative.txt", b"x"), ("/workspace/../etc/x", b"x"),
                               ("/etc/motd-new", b"x")])
    assert [u.error for u in up] == [None, None, "invalid_path", "invalid_path", "permission_denied"]
    assert sandbox.session.read_file("/workspace/data/blob.bin") == blob  # really in Kennel
    assert sandbox.execute("cat /tmp/t.txt").output == "tmp\n"

    down = sandbox.download_files(["/workspace/data/blob.bin", "/workspace/missing.txt",
                                   "/workspace/data", "data/blob.bin", "/workspace/data/../x",
                                   "/tmp/t.txt"])
    assert [(d.path, d.content, d.error) for d in down] == [
        ("/workspace/data/blob.bin", blob, None),
        ("/workspace/missing.txt", None, "file_not_found"),
        ("/workspace/data", None, "is_directory"),
        ("data/blob.bin", None, "invalid_path"),
        ("/workspace/data/../x", None, "invalid_path"),
        ("/tmp/t.txt", b"tmp\n", None),
    ]


def test_files_outside_the_files_api_go_through_the_shell(sandbox):
    # Kennel's files API serves /workspace and /tmp only and follows no symlink; the
    # sandbox's shell reaches the rest, as the agent's `execute` does.
    hostname = sandbox.execute("cat /etc/hostname").output.encode()
    [etc, missing, d] = sandbox.download_files(["/etc/hostname", "/nowhere/x", "/etc"])
    assert (etc.content, etc.error) == (hostname, None) and hostname
    assert (missing.error, d.error) == ("file_not_found", "is_directory")
    sandbox.execute("echo real > /workspace/real.txt && ln -s /workspace/real.txt /workspace/link")
    assert sandbox.download_files(["/workspace/link"])[0].content == b"real\n"
    assert sandbox.upload_files([("/workspace/link", b"through\n")])[0].error is None
    assert sandbox.session.read_file("/workspace/real.txt") == b"through\n"
    assert sandbox.execute("ls /tmp").output == ""  # no staged copies left behind


def test_many_files_go_as_one_archive_or_one_by_one(server, sandbox):
    def requests(kind: str) -> List[str]:  # this session's file requests, from the server's log
        prefix = f"method=PUT path=/v1/sessions/{sandbox.id}/{kind}"
        return [line.split(prefix, 1)[1].split(" ms=")[0]
                for line in server.log_text().splitlines() if prefix in line]

    files = [(f"/workspace/many/{i}/f.txt", f"file {i}\n".encode()) for i in range(6)]
    assert [u.error for u in sandbox.upload_files(files)] == [None] * 6
    assert sandbox.execute("cat /workspace/many/*/f.txt").output == "".join(
        f"file {i}\n" for i in range(6))
    assert (requests("archive"), requests("files")) == ([" status=204"], [])
    # A directory in the way: Kennel refuses the archive, and each file gets its own answer.
    sandbox.execute("mkdir -p /workspace/dirs/taken")
    names = ["a", "taken", "b", "c"]
    up = sandbox.upload_files([(f"/workspace/dirs/{n}", n.encode()) for n in names])
    assert [u.error for u in up] == [None, "is_directory", None, None]
    assert requests("archive") == [" status=204", " status=400"]
    assert requests("files") == [f"/workspace/dirs/{n} status={204 if n != 'taken' else 400}"
                                 for n in names]
    got = sandbox.download_files([f"/workspace/dirs/{n}" for n in ("a", "b", "c")])
    assert [d.content for d in got] == [b"a", b"b", b"c"]


def test_an_existing_session_stays_open(client):
    with client.session() as s:
        sb = KennelSandbox(s, timeout=5)
        assert sb.id == s.id and sb.execute("echo $((6 * 7))").output == "42\n"
        sb.close()
        assert [x.id for x in client.list_sessions()] == [s.id]
        with pytest.raises(TypeError):
            KennelSandbox(s, limits={"memory": "256M"})
    # Once the session has ended, each file says so, rather than that it was missing.
    [down] = sb.download_files(["/workspace/a.txt"])
    [up] = sb.upload_files([("/etc/a.txt", b"x")])
    assert down.error == up.error == f'not_found: no session "{s.id}"'
    with pytest.raises(kennel.NotFound):
        sb.execute("true")
    with pytest.raises(TypeError):
        KennelSandbox("http://127.0.0.1")  # type: ignore[arg-type]
    assert client.list_sessions() == []


def test_deep_agent_runs_its_tools_in_kennel(sandbox):
    model = ScriptedModel(messages=iter([
        call("execute", command="python3 -c 'import os; print(os.getcwd(), 6 * 7)' | tee answer.txt"),
        call("write_file", file_path="/workspace/notes/plan.md", content="step 1\nstep 2\n"),
        call("read_file", file_path="/workspace/answer.txt"),
        call("ls", path="/workspace/notes"),
        call("execute", command="cat notes/plan.md; exit 5"),
        AIMessage(content="all done"),
    ]))
    agent = create_deep_agent(model=model, backend=sandbox)
    state = agent.invoke({"messages": [{"role": "user", "content": "work in the sandbox"}]})

    execute, write, read, ls, failed = tool_messages(state)
    assert execute.name == "execute"
    assert execute.content == "/workspace 42\n\n[Command succeeded with exit code 0]"
    assert execute.artifact == {"exit_code": 0, "truncated": False}
    assert write.name == "write_file" and write.status == "success"
    assert sandbox.session.read_file("/workspace/notes/plan.md") == b"step 1\nstep 2\n"
    assert read.name == "read_file" and read.content.endswith("\n/workspace 42")
    assert ls.name == "ls" and "/workspace/notes/plan.md" in ls.content
    assert failed.content == "step 1\nstep 2\n\n[Command failed with exit code 5]"
    assert failed.artifact["exit_code"] == 5
    assert state["messages"][-1].content == "all done"


def test_large_output_is_offloaded_into_the_workspace(sandbox):
    # The sandbox's root is read-only, so the agent's artifacts (large tool results,
    # summarized history) go under /workspace through a CompositeBackend.
    model = ScriptedModel(messages=iter([
        call("execute", command="seq 1 30000 | sed 's/^/line /'"),
        AIMessage(content="ok"),
    ]))
    backend = CompositeBackend(default=sandbox, routes={}, artifacts_root="/workspace")
    state = create_deep_agent(model=model, backend=backend).invoke(
        {"messages": [{"role": "user", "content": "go"}]})
    [execute] = tool_messages(state)
    path = f"/workspace/large_tool_results/{execute.tool_call_id}"
    assert execute.content.startswith("Tool result too large") and path in execute.content
    saved = sandbox.session.read_file(path)
    assert saved.startswith(b"line 1\nline 2\n") and len(saved) > 100_000


def test_deep_agent_async_path(sandbox):
    model = ScriptedModel(messages=iter([
        call("execute", command="echo async $(( 2 ** 10 ))"),
        AIMessage(content="ok"),
    ]))
    agent = create_deep_agent(model=model, backend=sandbox)
    state = asyncio.run(agent.ainvoke({"messages": [{"role": "user", "content": "go"}]}))
    [execute] = tool_messages(state)
    assert execute.content == "async 1024\n\n[Command succeeded with exit code 0]"


def test_example_runs_against_the_server(server, client, run_example):
    lines = run_example("langchain_example.py").splitlines()
    assert lines[0].startswith("[kennel] session ") and lines[0].endswith(" started")
    assert "[tool execute] 385" in lines
    assert "[tool write_file] Updated file /workspace/report.md" in lines
    assert lines[lines.index("[tool read_file] @@ lines 1-1 of 1 @@") + 1] == "385"
    assert "[ai] The sum of the squares of 1 to 10 is 385." in lines
    assert "[kennel] /workspace/report.md: '# Squares\\n\\nSee squares.txt.\\n'" in lines
    assert lines[-1] == lines[0].replace(" started", " closed")
    assert client.list_sessions() == []
